"""Each task's options, declared once as a settings dataclass, and their checking.

``check_task_options(name, options)`` validates a task's options and returns them resolved
(defaults filled in, a preset expanded, derived defaults computed) without generating or reading
any data: it only checks that the data files named exist. ``get_task`` calls it first and hands
the resolved options to the task's builder, so its errors are the builder's. The generated tasks
declare their options beside their generators (``ListOpsOptions``, ``PathfinderOptions``); the
file-backed ones here (``TextOptions``, ``LmOptions``). No torch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xsearch.errors import MissingPathError, XSearchError
from xsearch.settings import option, same_as
from xsearch.tasks.common import HeldOut, checked
from xsearch.tasks.listops import ListOpsOptions
from xsearch.tasks.pathfinder import PathfinderOptions


def _check_file(task: str, key: str, path: str) -> None:
    p = Path(path)
    if p.is_file():
        return
    if p.exists():
        raise MissingPathError(f"task {task!r}: {key}={path}: not a file")
    raise MissingPathError(f"task {task!r}: {key}: no such data file: {path}")


@dataclass
class TextOptions(HeldOut):
    """The options of the ``text`` task: JSONL classification, one file split three ways or several files."""

    data: str | None = option(None, "one JSONL file, split into train/valid/test by seed")
    train: str | None = option(None, "training JSONL")
    valid: str | None = option(None, "validation JSONL (default: split off train)")
    test: str | None = option(None, "test JSONL (default: split off train)")
    max_len: int = option(512, "bytes kept of each text", ge=1)
    seed: int = option(0, "seeds the split")

    def rules(self) -> None:
        super().rules()
        if self.data is None and self.train is None:
            raise XSearchError("task 'text' needs data=PATH (one JSONL file) or train=PATH")
        if self.data is not None and any(getattr(self, k) is not None for k in ("train", "valid", "test")):
            raise XSearchError("task 'text': give data= or train=/valid=/test=, not both")
        for key in ("data", "train", "valid", "test"):
            if getattr(self, key) is not None:
                _check_file("text", key, getattr(self, key))


@dataclass
class LmOptions(HeldOut):
    """The options of the ``lm`` task: next-byte prediction on a UTF-8 text file."""

    valid_fraction: float = same_as(HeldOut, "valid_fraction", 0.05, ge=None, gt=0)
    test_fraction: float = same_as(HeldOut, "test_fraction", 0.05, ge=None, gt=0)
    path: str | None = option(None, "UTF-8 text file (default: CPython's documentation text)")
    max_len: int = option(256, "window length in bytes", ge=1)

    def rules(self) -> None:
        super().rules()
        if self.path is not None:
            _check_file("lm", "path", self.path)


#: task name -> the dataclass of its options
TASK_OPTIONS: dict[str, type] = {
    "listops": ListOpsOptions,
    "pathfinder": PathfinderOptions,
    "text": TextOptions,
    "lm": LmOptions,
}


def check_task_options(name: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Task ``name``'s ``options``, checked and resolved, without generating or reading any data.

    Returns every option of the task with its value (defaults filled in, a preset expanded,
    derived defaults such as listops' ``min_len`` computed): ``get_task(name, **result)`` builds
    the same task.

    Raises:
        XSearchError: an unknown task or option (naming the valid ones), a value of the wrong type
            or out of range, options that contradict each other.
        MissingPathError: a data file that does not exist (naming the path).
    """
    cls = TASK_OPTIONS.get(name)
    if cls is None:
        raise XSearchError(f"unknown task {name!r}; valid: {', '.join(sorted(TASK_OPTIONS))}")
    given = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in dict(options or {}).items()}
    known = sorted(f.name for f in dataclasses.fields(cls))
    for key in given:
        if key not in known:
            raise XSearchError(f"task {name!r} has no option {key!r} (valid: {', '.join(known)})")
    presets = getattr(cls, "PRESETS", {})
    preset = given.get("preset")
    if preset in presets:  # a preset's sizes, under what is given explicitly
        given = {**presets[preset], **given}
    resolved = dataclasses.asdict(checked(cls, name, given))
    resolved.pop("preset", None)
    return resolved
