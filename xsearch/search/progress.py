"""The search's progress: one line per finished trial above a bar of the study's COMPLETE trials."""

from __future__ import annotations

import optuna

from xsearch.progress import StudyProgress
from xsearch.search.study import (
    describe_trial,
    is_feasible,
    shown_beside,
    trial_latency_ms,
    trial_metric,
    trial_task_metric,
)


class SearchProgress(StudyProgress):
    """``trial 3: local(block_size=64) d64 L2 H2 ff128  valid_loss 1.8213 (accuracy 0.3140)  latency 1.07 ms
    feasible``."""

    def __init__(self, study: optuna.Study, total: int, show: bool, metric: str) -> None:
        super().__init__(study, total, show, "search")
        self.metric, self.beside = metric, shown_beside(metric)  # what trials are ranked by; the accuracy beside it

    def line(self, trial: optuna.trial.FrozenTrial) -> str:
        if trial.state != optuna.trial.TrialState.COMPLETE:
            return super().line(trial)
        ok = "feasible" if is_feasible(trial) else "over budget"
        ref = " [reference]" if trial.user_attrs.get("reference") else ""
        twin = trial.user_attrs.get("duplicate_of")
        again = "" if twin is None else f"  (= trial {twin}, not trained again)"
        value = trial_task_metric(trial) if self.beside else None
        also = "" if value is None else f" ({self.beside} {value:.4f})"
        return (f"trial {trial.number:3d}{ref}: {describe_trial(trial)}  {self.metric} {trial_metric(trial):.4f}"
                f"{also}  latency {trial_latency_ms(trial):.2f} ms  {ok}{again}")  # fmt: skip
