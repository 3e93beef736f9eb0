"""The hardware-aware search: an Optuna study over a search space.

Two kinds of study:

- ``objective="both"``: two objectives (task metric and latency measured on the target), latency
  and size budgets as constraints, so over-budget trials stay visible but off the Pareto front;
- ``objective="accuracy"``: the task metric alone under a latency budget. Latency is measured
  before training and an over-budget trial is pruned before any training step; training reports
  the validation metric so a pruner (Hyperband by default, or median) stops weak candidates early.

What "task metric" means here is ``rank_by``'s: the validation cross-entropy (``valid_loss``, the default) or
the accuracy of a classification task, bits per byte of ``lm``. Trials record the accuracy and the loss either
way, and every reader shows the accuracy beside the loss, each with its chance level.

The first trial of every study (trial 0) is the reference Transformer (``full`` attention at the
space's reference size), so each result reads as "x times faster than the Transformer, y points of
accuracy". Each trial stores its ``ModelConfig`` and measurements in ``user_attrs`` (latency always
in ``user_attrs["latency"]``, see ``trial_latency_ms``); a trial that fails is recorded as FAIL with
the reason and the study goes on. ``trials`` is the study's total of COMPLETE trials: re-running
resumes the study up to it, and several workers on one storage share it (see ``workers``).

Modules: ``settings`` (``SearchSettings``), ``sampling`` (samplers, pruners), ``objective`` (one
trial), ``study`` (opening a study and the queries every reader uses), ``progress``, ``run``
(``run_search``), ``workers`` (many workers, one total), ``report`` (plots, CSV, ``pick``).
"""

from __future__ import annotations

from xsearch._lazy import by_module, lazy_names

_LAZY = by_module(
    {
        "xsearch.search.settings": "SearchSettings StudySettings PickSettings DEFAULT_STORAGE SAMPLERS OBJECTIVES "
        "RANK_BY PRUNERS",
        "xsearch.search.run": "run_search",
        "xsearch.search.objective": "Objective",
        "xsearch.search.study": "open_study metric_name search_metric trial_metric trial_task_metric trial_latency_ms "
        "is_feasible pareto_front reference_trial describe_trial study_chance state_counts",
        "xsearch.search.report": "pick write_report",
    }
)
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
