"""The latency predictor: op counting, features, the three-stage model, its fit and held-out error.

from xsearch.latency.predictor import fit_with_holdout, LatencyPredictor
"""

from __future__ import annotations

from xsearch._lazy import by_module, lazy_names

_LAZY = by_module(
    {
        "xsearch.latency.predictor.counting": "forward_counts COUNT_KINDS",
        "xsearch.latency.predictor.features": "LatencyRow architecture_features architecture_key row_features",
        "xsearch.latency.predictor.fit": "LatencyPredictor load_for_target",
        "xsearch.latency.predictor.holdout": "fit_with_holdout holdout_metrics split_by_architecture mape kendall_tau",
        "xsearch.latency.predictor.data": "rows_from_study load_rows select_rows",
    }
)
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
