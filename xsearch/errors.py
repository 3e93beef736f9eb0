"""The errors a user can cause, as one family (no torch; the deployment side raises them too).

``XSearchError`` (a ``ValueError``) is everything the user can fix: a bad value, an unknown name,
a malformed or missing file, a setting out of range, a target this machine does not have. The
CLI prints it as one line and exits with status 2. Any other exception is a bug in xsearch: the
CLI exits with status 1 and says where the traceback went.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class XSearchError(ValueError):
    """Something the user can fix; the message names the offending value."""


class MissingPathError(XSearchError, FileNotFoundError):
    """A file or folder the user named does not exist (or is of the wrong kind)."""


class UnavailableError(XSearchError, RuntimeError):
    """What the request needs is not on this machine (a CUDA target without CUDA, a missing extra)."""


class SettingError(XSearchError):
    """A setting (a field of one of the library's settings dataclasses) with a bad value.

    The message is a template whose ``{0}``, ``{1}``, ... are the names of ``fields``, so each
    front end names them its own way: ``--train-steps`` on the command line, ``search.train_steps``
    in a pipeline.yaml, ``train_steps`` in Python (``str(error)``).

    Attributes:
        fields: the settings' field names the error is about.
        template: the message, with ``{i}`` where field ``i``'s name goes.
    """

    def __init__(self, fields: str | Sequence[str], template: str) -> None:
        self.fields = (fields,) if isinstance(fields, str) else tuple(fields)
        self.template = template
        super().__init__(self.render())

    def render(self, name: Callable[[str], str] = str) -> str:
        """The message with each field called ``name(field)``."""
        return self.template.format(*(name(f) for f in self.fields))
