"""Export to ONNX with a parity check, onnxruntime quantization, and the deployment ``Predictor``.

Names resolve lazily: ``from xsearch.export import Predictor`` imports onnxruntime and numpy
only, never torch, so a deployment host needs nothing else.
"""

from __future__ import annotations

from xsearch._lazy import by_module, lazy_names

_LAZY = by_module(
    {
        "xsearch.export.onnx_export": "to_onnx ExportReport",
        "xsearch.export.errors": "ExportParityError",
        "xsearch.export.quantize": "quantize_onnx QUANTIZE_MODES",
        "xsearch.export.predictor": "Predictor Prediction read_metadata",
        "xsearch.export.generator": "Generator",
        "xsearch.export.settings": "ExportSettings",
        "xsearch.export.serve": "serve Server ServeSettings build_app",
    }
)
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names("xsearch.export", _LAZY)
