"""Compression of a chosen model: structured pruning, distillation, task adapters, quantization.

Each step is one function taking and returning a model; the steps compose
(``prune`` -> ``distill`` -> ``xsearch.export.quantize_onnx`` is the usual path to deployment).
"""

from __future__ import annotations

from xsearch._lazy import by_module, lazy_names

_LAZY = by_module(
    {
        "xsearch.compress.prune": "prune head_importance",
        "xsearch.compress.distill": "distill",
        "xsearch.compress.adapters": "add_adapters save_adapters load_adapters merge_adapters",
        "xsearch.compress.quantize": "quantize",
        "xsearch.compress.recipe": "compress_model CompressResult",
        "xsearch.compress.settings": "CompressSettings AdapterSettings",
    }
)
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names("xsearch.compress", _LAZY)
