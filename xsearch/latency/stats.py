"""``LatencyStats``: robust statistics of timed runs (no torch, no onnxruntime)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class LatencyStats:
    """Latency over ``repeats`` timed runs (after warm-up), in milliseconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    mean_ms: float
    std_ms: float
    repeats: int
    target: str
    device: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(samples_ms: list[float], target: str, device: dict[str, Any]) -> LatencyStats:
    """Order statistics of the timed samples."""
    s = sorted(samples_ms)

    def q(p: float) -> float:  # nearest-rank quantile, so p10 <= median <= p90 always holds
        return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]

    return LatencyStats(
        median_ms=statistics.median(s),
        p10_ms=q(0.10),
        p90_ms=q(0.90),
        mean_ms=statistics.fmean(s),
        std_ms=statistics.pstdev(s),
        repeats=len(s),
        target=target,
        device=device,
    )
