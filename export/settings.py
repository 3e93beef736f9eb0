"""``ExportSettings``: the options of an export, defined once (``xsearch export``'s flags and the
pipeline's ``export:`` section are built from it). No torch import."""

from __future__ import annotations

from dataclasses import dataclass

from xsearch.settings import Settings, option

QUANTIZE_CHOICES = ("none", "dynamic-int8", "static-int8", "fp16")


@dataclass
class ExportSettings(Settings):
    """How a model becomes the file you ship."""

    quantize: str = option(
        "none", "dynamic-int8 (the fastest on CPU), static-int8 (calibrated on the train split), fp16 (GPUs)",
        choices=QUANTIZE_CHOICES,
    )  # fmt: skip
    portable: bool = option(False, "standard ONNX operators only (no onnxruntime contrib ops)")
    opset: int | None = option(None, "ONNX opset (default: the exporter's)", ge=7)
    check: bool = option(True, "check onnxruntime against torch after export (parity within 1e-4)")

    @property
    def mode(self) -> str | None:
        """The quantization mode, or None for an fp32 file."""
        return None if self.quantize == "none" else self.quantize
