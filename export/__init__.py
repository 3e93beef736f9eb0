"""Export to ONNX with a parity check, onnxruntime quantization, and the deployment ``Predictor``.

Names resolve lazily: ``from xsearch.export import Predictor`` imports onnxruntime and numpy
only, never torch, so a deployment host needs nothing else.
"""

from __future__ import annotations

from xsearch._lazy import lazy_names

_LAZY = {
    "to_onnx": "xsearch.export.onnx_export",
    "ExportReport": "xsearch.export.onnx_export",
    "ExportParityError": "xsearch.export.errors",
    "quantize_onnx": "xsearch.export.quantize",
    "QUANTIZE_MODES": "xsearch.export.quantize",
    "Predictor": "xsearch.export.predictor",
    "Prediction": "xsearch.export.predictor",
    "read_metadata": "xsearch.export.predictor",
}
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names("xsearch.export", _LAZY)
