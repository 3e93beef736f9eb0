"""Compression of a chosen model: structured pruning, distillation, task adapters, quantization.

Each step is one function taking and returning a model; the steps compose
(``prune`` -> ``distill`` -> ``xsearch.export.quantize_onnx`` is the usual path to deployment).
"""

from __future__ import annotations

from xsearch._lazy import lazy_names

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
__getattr__, __dir__ = lazy_names("xsearch.compress", _LAZY)
