"""A search's Optuna study: opening it (directions, objective names) and reading its trials back.

Every reader of a study (report, pick, the pipeline, the CLI) goes through these queries, so both
kinds of study (two objectives, or the metric alone under a latency budget) read alike.
"""

from __future__ import annotations

from typing import Any

import optuna

from xsearch.config import describe_config
from xsearch.errors import XSearchError
from xsearch.search.sampling import PerTrialSampler, make_pruner, make_sampler, trial_seed
from xsearch.search.settings import SearchSettings

LATENCY_OBJECTIVE = "latency_ms"
LOSS_METRIC = "valid_loss"  # a classification study's first objective with rank_by="loss"


#: What each metric's chance level is the score of.
CHANCE_KIND = {"accuracy": "majority class", LOSS_METRIC: "label frequencies", "bits_per_byte": "unigram model"}


def metric_name(task_kind: str) -> str:
    """The task metric's name: ``"accuracy"``, or ``"bits_per_byte"`` for ``lm``."""
    return "bits_per_byte" if task_kind == "lm" else "accuracy"


def shown_beside(ranked: str) -> str | None:
    """The task metric every reader shows beside what trials are ranked by: ``"accuracy"`` beside ``valid_loss``
    (None beside the task metric itself)."""
    return "accuracy" if ranked == LOSS_METRIC else None


def search_metric(settings: SearchSettings, task_kind: str) -> str:
    """What a search ranks its trials by (its first objective): ``"valid_loss"`` (the validation cross-entropy,
    nats per example) or ``"accuracy"`` for a classification task, as ``rank_by`` says; ``"bits_per_byte"`` for
    ``lm`` (a loss already)."""
    if task_kind == "lm":
        return metric_name(task_kind)
    return LOSS_METRIC if settings.rank_by == "loss" else "accuracy"


def study_directions(settings: SearchSettings, task_kind: str) -> list[str]:
    """``[metric]`` for ``objective="accuracy"``, ``[metric, latency]`` for ``"both"``."""
    metric = "maximize" if search_metric(settings, task_kind) == "accuracy" else "minimize"
    return [metric] if settings.objective == "accuracy" else [metric, "minimize"]


def objective_names(settings: SearchSettings, task_kind: str) -> list[str]:
    """What the study's objectives are called (optuna-dashboard shows these, not "Objective 0")."""
    metric = search_metric(settings, task_kind)
    return [metric] if settings.objective == "accuracy" else [metric, LATENCY_OBJECTIVE]


def open_study(
    settings: SearchSettings, task_kind: str, *, reference_params: dict[str, Any] | None = None
) -> optuna.Study:
    """Create or load the study (``load_if_exists``); check its directions match the task and objective.

    Args:
        settings: the search settings (storage, study name, objective, sampler, pruner, heartbeats).
        task_kind: ``"classify"`` or ``"lm"`` (the metric's direction).
        reference_params: when given, trial 0 of the study samples these values (the reference).

    Raises:
        XSearchError: a study of that name that is of the other kind.
    """
    import warnings

    from xsearch.storage import open_storage

    directions = study_directions(settings, task_kind)
    storage = open_storage(
        settings.storage, heartbeat_interval=settings.heartbeat_interval, grace_period=settings.grace_period
    )
    name, seed, trials = settings.sampler_name(), settings.seed, settings.trials
    sampler = PerTrialSampler(lambda number: make_sampler(name, trial_seed(seed, number), trials), reference_params)
    study = optuna.create_study(
        storage=storage,
        study_name=settings.study,
        directions=directions,
        sampler=sampler,
        pruner=make_pruner(settings),
        load_if_exists=True,
    )
    have = [d.name.lower() for d in study.directions]
    names = objective_names(settings, task_kind)
    if have != directions:
        kinds = {1: "single-objective (--objective accuracy)", 2: "two-objective (--objective both)"}
        made = f" of {study.metric_names}" if study.metric_names else ""
        raise XSearchError(
            f"study {settings.study!r} exists as a {kinds.get(len(have), str(have))} study{made} with directions "
            f"{have}, not {names} {directions} for this task, objective {settings.objective!r} and rank_by "
            f"{settings.rank_by!r}: give the settings it was made with, or another study name"
        )
    if study.metric_names not in (None, names) and names[0] != study.metric_names[0]:
        raise XSearchError(f"study {settings.study!r} ranks by {study.metric_names[0]!r}, not {names[0]!r}: give "
                           "the rank_by it was made with, or another study name")  # fmt: skip
    if study.metric_names != names:
        with warnings.catch_warnings():  # "experimental" in Optuna
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(names)
    return study


def trial_metric(t: optuna.trial.FrozenTrial) -> float:
    """What a COMPLETE trial is ranked by, in either kind of study: the study's first objective (``valid_loss`` or
    ``accuracy``, or bits per byte for lm; ``study.user_attrs["metric"]`` names it)."""
    return t.values[0]


def trial_task_metric(t: optuna.trial.FrozenTrial) -> float | None:
    """The task metric a trial measured on the validation split (accuracy, or bits per byte for lm), whatever its
    study ranks by (None: not measured)."""
    for name in ("accuracy", "bits_per_byte"):
        if name in t.user_attrs:
            return t.user_attrs[name]
    return None


def trial_latency_ms(t: optuna.trial.FrozenTrial) -> float | None:
    """The median latency a trial measured (``user_attrs["latency"]``), in either kind of study."""
    lat = (t.user_attrs.get("latency") or {}).get("median_ms")
    if lat is None and t.values is not None and len(t.values) > 1:
        return t.values[1]
    return lat


def constraints(t: optuna.trial.FrozenTrial) -> dict[str, float]:
    """The trial's constraint values by name (<= 0: met), as ``trial.set_constraint`` stored them."""
    from optuna.study._constrained_optimization import _get_constraints_from_system_attrs

    return dict(_get_constraints_from_system_attrs(t.system_attrs))


def is_feasible(t: optuna.trial.FrozenTrial) -> bool:
    return all(v <= 0 for v in constraints(t).values())


def metric_is_maximized(study: optuna.Study) -> bool:
    """Whether the study's task metric (its first objective) is maximized (accuracy) or minimized (bits per byte)."""
    return study.directions[0] == optuna.study.StudyDirection.MAXIMIZE


def pareto_front(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Feasible COMPLETE trials that no other feasible trial beats on both task metric and latency.

    The same in both kinds of study: a single-objective study's trials carry their latency too.
    Duplicates of an earlier trial (``duplicate_of``) are left out: they are that trial.
    """
    trials = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    trials = [t for t in trials if is_feasible(t) and trial_latency_ms(t) is not None]
    trials = [t for t in trials if t.user_attrs.get("duplicate_of") is None]
    sign = -1.0 if metric_is_maximized(study) else 1.0
    loss = [(sign * trial_metric(t), trial_latency_ms(t)) for t in trials]

    def dominated(i: int) -> bool:
        return any(
            all(a <= b for a, b in zip(loss[j], loss[i])) and any(a < b for a, b in zip(loss[j], loss[i]))
            for j in range(len(trials))
            if j != i
        )

    front = [t for i, t in enumerate(trials) if not dominated(i)]
    return sorted(front, key=trial_latency_ms)


def reference_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("reference") and t.state == optuna.trial.TrialState.COMPLETE:
            return t
    return None


def describe_trial(t: optuna.trial.FrozenTrial) -> str:
    return describe_config(t.user_attrs.get("model_config") or {})


def study_chance(study: optuna.Study, metric: str | None = None) -> float | None:
    """The chance level on the validation split of ``metric`` (default: what the trials are ranked by), as the
    search recorded it (None: not recorded)."""
    if metric is None or metric == study.user_attrs.get("metric", metric):
        chance = study.user_attrs.get("chance") or {}
    else:
        chance = (study.user_attrs.get("chances") or {}).get(metric) or {}
    return chance.get("valid")


def state_counts(study: optuna.Study) -> dict[str, int]:
    """Trials per state name (``{"COMPLETE": 7, "PRUNED": 2}``)."""
    out: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name] = out.get(t.state.name, 0) + 1
    return dict(sorted(out.items()))
