"""Latency on a target: the ``Target`` registry, measurement, round-robin timing, the cache, the
latency-only sweep and the latency predictor.

    from xsearch.latency import list_targets, get_target, measure
    measure(model, "ort-cpu", seq_len=1024, threads=2).median_ms

Targets are registered in ``xsearch.latency.targets`` (one module per kind); ``import
xsearch.latency`` imports neither torch nor onnxruntime.
"""

from __future__ import annotations

from xsearch._lazy import by_module, lazy_names
from xsearch.latency.stats import LatencyStats, summarize
from xsearch.latency.target import Target, find_target, get_target, list_targets, register_target

_LAZY = by_module(
    {
        "xsearch.latency.timing": "measure measure_undisturbed measure_interleaved device_fingerprint "
        "run_queue_wait_ns timed_runs MeasureSettings",
        "xsearch.latency.rounds": "time_in_rounds RoundTimings median_polish",
        "xsearch.latency.cache": "LatencyCache cache_key default_cache_path",
        "xsearch.latency.sweep": "SweepSettings run_sweep",
    }
)
__all__ = [  # the eager names, then the lazy ones
    "LatencyStats",
    "Target",
    "find_target",
    "get_target",
    "list_targets",
    "register_target",
    "summarize",
    *_LAZY,
]
__getattr__, _dir = lazy_names(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted(__all__)
