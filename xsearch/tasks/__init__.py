"""Tasks: ``listops`` and ``pathfinder`` (generated), ``text`` (JSONL classification), ``lm`` (byte-level LM).

``get_task(name, **options)`` builds one; ``check_task_options(name, options)`` checks and resolves
its options without building it (each task's options are declared in ``xsearch.tasks.options``).
The generated tasks are cached on disk (``xsearch.tasks.cache``: ``$XSEARCH_CACHE_DIR/tasks``;
``XSEARCH_NO_TASK_CACHE=1`` bypasses it). ``listops_samples`` and ``pathfinder_samples`` expose
the generators. Imports are lazy so that ``xsearch.tasks.encoding`` can be used without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_BUILDERS = {
    "listops": ("xsearch.tasks.builders", "listops_task"),
    "text": ("xsearch.tasks.builders", "text_task"),
    "lm": ("xsearch.tasks.builders", "lm_task"),
    "pathfinder": ("xsearch.tasks.builders", "pathfinder_task"),
}
_LAZY = {
    "check_task_options": "xsearch.tasks.options",
    "listops_samples": "xsearch.tasks.listops",
    "evaluate_expression": "xsearch.tasks.listops",
    "Task": "xsearch.tasks.base",
    "Encoding": "xsearch.tasks.encoding",
    "pathfinder_samples": "xsearch.tasks.pathfinder",
}


def list_tasks() -> list[str]:
    """Names accepted by ``get_task``."""
    return sorted(_BUILDERS)


def get_task(name: str, **options: Any):
    """Build task ``name`` with ``options`` (declared in ``xsearch.tasks.options``).

    The options are checked first (``check_task_options``), so a bad one fails before any work.

    Raises:
        XSearchError: an unknown task or option, a bad value, a malformed data file.
        MissingPathError: a data file that does not exist.
    """
    from xsearch.tasks.options import check_task_options

    resolved = check_task_options(name, options)
    module, func = _BUILDERS[name]
    return getattr(importlib.import_module(module), func)(resolved)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'xsearch.tasks' has no attribute {name!r}")
