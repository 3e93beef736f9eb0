"""Export errors (no torch import, so the deployment side can catch them too)."""

from __future__ import annotations


class ExportParityError(RuntimeError):
    """onnxruntime's logits differ from torch's by more than the tolerance.

    Attributes:
        max_abs_diff: the largest absolute difference seen.
        tolerance: the allowed difference.
        case: the (batch, length) at which it was seen.
    """

    def __init__(self, message: str, *, max_abs_diff: float, tolerance: float, case: tuple[int, int]):
        super().__init__(message)
        self.max_abs_diff = max_abs_diff
        self.tolerance = tolerance
        self.case = case
