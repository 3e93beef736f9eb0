"""Tasks: ``listops`` and ``pathfinder`` (generated), ``text`` (JSONL classification), ``lm`` (byte-level LM).

``get_task(name, **options)`` builds one; ``listops_samples`` exposes the ListOps generator.
Imports are lazy so that ``xsearch.tasks.encoding`` can be used without torch.
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
    """Build task ``name`` with ``options`` (see each builder's docstring).

    Raises:
        ValueError: an unknown task name or option.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown task {name!r}; valid: {', '.join(list_tasks())}")
    module, func = _BUILDERS[name]
    builder = getattr(importlib.import_module(module), func)
    try:
        return builder(**options)
    except TypeError as e:  # an unexpected keyword: name it
        raise ValueError(f"task {name!r}: {e}") from None


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'xsearch.tasks' has no attribute {name!r}")
