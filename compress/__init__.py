"""Compression of a chosen model: structured pruning, distillation, task adapters, quantization.

Each step is one function taking and returning a model; the steps compose
(``prune`` -> ``distill`` -> ``xsearch.export.quantize_onnx`` is the usual path to deployment).
"""

from __future__ import annotations

import importlib

_LAZY = {
    "prune": "xsearch.compress.prune",
    "head_importance": "xsearch.compress.prune",
    "distill": "xsearch.compress.distill",
    "add_adapters": "xsearch.compress.adapters",
    "save_adapters": "xsearch.compress.adapters",
    "load_adapters": "xsearch.compress.adapters",
    "merge_adapters": "xsearch.compress.adapters",
    "quantize": "xsearch.compress.quantize",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'xsearch.compress' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
