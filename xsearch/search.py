"""The hardware-aware search: an Optuna study over a search space.

Two kinds of study:

- ``objective="both"``: two objectives (task metric and latency measured on the target), latency
  and size budgets as constraints, so over-budget trials stay visible but off the Pareto front;
- ``objective="accuracy"``: the task metric alone under a latency budget. Latency is measured
  before training and an over-budget trial is pruned before any training step; training reports
  the validation metric so a pruner (Hyperband by default, or median) stops weak candidates early.

The first trial of every study (trial 0) is the reference Transformer (``full`` attention at the
space's reference size), so each result reads as "x times faster than the Transformer, y points of
accuracy". Each trial stores its ``ModelConfig`` and measurements in ``user_attrs`` (latency always
in ``user_attrs["latency"]``, see ``trial_latency_ms``); a trial that fails is recorded as FAIL with
the reason and the study goes on. ``trials`` is the study's total of COMPLETE trials: re-running
resumes the study up to it, and several workers on one storage share it (see ``xsearch.workers``).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import optuna

from xsearch.workers import SURPLUS, count_states, run_until_total, within_total

log = logging.getLogger("xsearch.search")

SAMPLERS = ("tpe", "nsga2", "random")
OBJECTIVES = ("both", "accuracy")
PRUNERS = ("hyperband", "median", "none")
DEFAULT_STORAGE = "sqlite:///runs/xsearch.db"
REPORTS_PER_TRIAL = 8  # validation points per trial when a pruner watches training (steps budget)


@dataclass
class SearchSettings:
    """Everything a search needs (the CLI's flags, as data)."""

    task: str = "listops"
    task_options: dict[str, Any] = field(default_factory=dict)
    space: str = "default"
    target: str = "ort-cpu"
    trials: int = 20  # the study's total of COMPLETE trials, shared by every worker
    timeout: float | None = None
    storage: str = DEFAULT_STORAGE
    study: str = "xsearch"
    seq_len: int | None = None
    batch: int = 1
    threads: int | None = 2
    max_latency_ms: float | None = None
    max_params: int | None = None
    train_steps: int | None = None
    train_seconds: float | None = 30.0
    batch_size: int = 32
    lr: float = 1e-3
    sampler: str = "tpe"
    seed: int = 0
    latency_repeats: int = 10
    latency_cache: str | None = "default"
    objective: str = "both"
    pruner: str | None = None  # default: hyperband for objective="accuracy", none for "both"
    heartbeat_interval: int = 10
    grace_period: int | None = None  # default: 3 heartbeat intervals
    latency_predictor: str | None = None  # a predictor JSON: candidates predicted over budget are never trained

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {self.sampler!r}; valid: {', '.join(SAMPLERS)}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; valid: {', '.join(OBJECTIVES)}")
        if self.pruner is None:
            self.pruner = "hyperband" if self.objective == "accuracy" else "none"
        if self.pruner not in PRUNERS:
            raise ValueError(f"unknown pruner {self.pruner!r}; valid: {', '.join(PRUNERS)}")
        if self.objective == "accuracy" and self.max_latency_ms is None:
            raise ValueError(
                "objective 'accuracy' searches under a latency budget: give max_latency_ms (--max-latency-ms)"
            )
        if self.objective == "both" and self.pruner != "none":
            raise ValueError(
                f"pruner {self.pruner!r} needs objective 'accuracy' (Optuna prunes single-objective studies only)"
            )
        if self.pruner == "median" and self.train_steps is None:
            raise ValueError(
                "pruner 'median' compares trials at equal training steps: give train_steps (--train-steps)"
            )
        if self.heartbeat_interval < 1:
            raise ValueError(f"heartbeat_interval must be >= 1 s, got {self.heartbeat_interval}")
        if self.grace_period is not None and self.grace_period <= self.heartbeat_interval:
            raise ValueError(
                f"grace_period ({self.grace_period} s) must exceed heartbeat_interval ({self.heartbeat_interval} s)"
            )
        if self.trials < 0:
            raise ValueError(f"trials must be >= 0, got {self.trials}")
        if self.train_steps is None and self.train_seconds is None:
            raise ValueError("give train_steps or train_seconds")
        for name in ("max_latency_ms", "max_params", "timeout", "train_seconds"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ValueError(f"{name} must be > 0, got {v}")


def make_sampler(name: str, seed: int, trials: int) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        with warnings.catch_warnings():  # multivariate/group are "experimental" but suit conditional spaces
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, constant_liar=True,
                n_startup_trials=max(2, min(10, trials // 3)),
            )  # fmt: skip
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, trials // 3)))
    return optuna.samplers.RandomSampler(seed=seed)


def metric_name(task_kind: str) -> str:
    """The task metric's name: ``"accuracy"``, or ``"bits_per_byte"`` for ``lm``."""
    return "bits_per_byte" if task_kind == "lm" else "accuracy"


def report_every(settings: SearchSettings) -> int | None:
    """Training steps between validation reports when a pruner watches training (None: time-based)."""
    return None if settings.train_steps is None else max(1, settings.train_steps // REPORTS_PER_TRIAL)


def make_pruner(settings: SearchSettings) -> optuna.pruners.BasePruner:
    """The pruner of an ``objective="accuracy"`` study; its resources are training steps."""
    if settings.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=min(5, max(1, settings.trials // 5)), n_warmup_steps=0)
    if settings.pruner == "hyperband":
        every = report_every(settings)
        if every is None:  # a time budget: steps per trial are learnt from the first finished trial
            return optuna.pruners.HyperbandPruner(min_resource=1, max_resource="auto", reduction_factor=3)
        return optuna.pruners.HyperbandPruner(min_resource=every, max_resource=settings.train_steps, reduction_factor=3)
    return optuna.pruners.NopPruner()


class PerTrialSampler(optuna.samplers.BaseSampler):
    """Trial 0 samples the reference Transformer; every other trial a fresh base sampler seeded with its number.

    Trial numbers are unique, so however many workers start on an empty study at once, exactly one trial is
    the reference (an ``enqueue_trial`` by each of them would queue it several times); and workers that share
    a seed still draw different candidates, while one worker's study stays reproducible. The base samplers
    keep no state between trials beyond their random generator: they read the history from the storage.
    """

    def __init__(self, make_base, reference: dict[str, Any] | None = None) -> None:
        """``make_base(trial_number)`` builds the sampler of one trial; ``reference``: trial 0's parameters."""
        self.make_base, self.reference = make_base, reference or {}
        self._bases: dict[int, optuna.samplers.BaseSampler] = {}  # trials asked and not yet told

    def _base(self, trial) -> optuna.samplers.BaseSampler:
        if trial.number not in self._bases:
            self._bases[trial.number] = self.make_base(trial.number)
        return self._bases[trial.number]

    def before_trial(self, study, trial) -> None:
        self._base(trial).before_trial(study, trial)

    def infer_relative_search_space(self, study, trial):
        return {} if self._is_reference(trial) else self._base(trial).infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        return {} if self._is_reference(trial) else self._base(trial).sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        if self._is_reference(trial) and param_name in self.reference:
            return self.reference[param_name]
        return self._base(trial).sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study, trial, state, values) -> None:
        self._base(trial).after_trial(study, trial, state, values)
        self._bases.pop(trial.number, None)

    def reseed_rng(self) -> None:
        for base in self._bases.values():
            base.reseed_rng()

    def _is_reference(self, trial) -> bool:
        return trial.number == 0 and bool(self.reference)


def trial_seed(seed: int, number: int) -> int:
    """The seed of trial ``number``'s sampler in a study searched with ``seed`` (distinct seeds: unrelated streams)."""
    return (seed * 1_000_003 + number) % 2**32


def study_directions(settings: SearchSettings, task_kind: str) -> list[str]:
    """``[metric]`` for ``objective="accuracy"``, ``[metric, latency]`` for ``"both"``."""
    metric = "minimize" if task_kind == "lm" else "maximize"
    return [metric] if settings.objective == "accuracy" else [metric, "minimize"]


def open_study(
    settings: SearchSettings, task_kind: str, *, reference_params: dict[str, Any] | None = None
) -> optuna.Study:
    """Create or load the study (``load_if_exists``); check its directions match the task and objective.

    Args:
        settings: the search settings (storage, study name, objective, sampler, pruner, heartbeats).
        task_kind: ``"classify"`` or ``"lm"`` (the metric's direction).
        reference_params: when given, trial 0 of the study samples these values (the reference).
    """
    from xsearch.storage import open_storage

    directions = study_directions(settings, task_kind)
    storage = open_storage(
        settings.storage, heartbeat_interval=settings.heartbeat_interval, grace_period=settings.grace_period
    )
    name, seed, trials = settings.sampler, settings.seed, settings.trials
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
    if have != directions:
        kinds = {1: "single-objective (--objective accuracy)", 2: "two-objective (--objective both)"}
        raise ValueError(
            f"study {settings.study!r} exists as a {kinds.get(len(have), str(have))} study with directions {have}, "
            f"not {directions} for this task and objective {settings.objective!r}"
        )
    return study


class Objective:
    """One trial: suggest -> build -> check the size budget -> measure latency -> check the latency budget ->
    train (reporting to the pruner) -> validate.

    With ``objective="both"`` a trial returns ``(metric, latency_ms)`` and budgets are constraints; with
    ``objective="accuracy"`` it returns the metric and an over-budget trial is pruned before training.
    """

    def __init__(self, settings: SearchSettings, task, space, cache) -> None:
        self.s = settings
        self.task = task
        self.space = space
        self.cache = cache
        self.single = settings.objective == "accuracy"
        self.current: int | None = None  # the number of the trial this worker runs now (or ran last)
        self.reference = False  # whether that trial is the reference (never pruned: the baseline of the report)
        self.seq_len = settings.seq_len or task.max_len
        if self.seq_len > task.max_len:
            raise ValueError(f"--seq-len {self.seq_len} exceeds the task's max_len={task.max_len}")
        self.predictor = None
        if settings.latency_predictor is not None:
            from xsearch.latency_predictor import load_for_target

            self.predictor = load_for_target(settings.latency_predictor, settings.target, settings.threads)

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, float]:
        self.current = trial.number
        trials = trial.study.get_trials(deepcopy=False)
        if not within_total(trials, trial.number, self.s.trials):
            self._prune(trial, f"{SURPLUS}: the study already has {self.s.trials} trials complete or under way")
        trial.set_user_attr("worker", {"host": socket.gethostname(), "pid": os.getpid()})
        me = next((t for t in trials if t.number == trial.number), None)
        self.reference = trial.number == 0 or bool(me and me.user_attrs.get("reference"))  # (a retry copies attrs)
        if trial.number == 0:
            trial.set_user_attr("reference", True)
        retry_of = me.system_attrs.get("failed_trial") if me else None
        if retry_of is not None:  # queued again by the heartbeat check after its worker died
            trial.set_user_attr("retry_of", retry_of)
        try:
            return self._run(trial)
        except optuna.TrialPruned:
            raise
        except Exception as e:
            trial.set_user_attr("error", f"{type(e).__name__}: {e}"[:2000])
            raise

    def _run(self, trial: optuna.Trial) -> float | tuple[float, float]:
        import torch

        import xsearch

        cfg = self.space.suggest(trial, self.task.model_fields())
        trial.set_user_attr("model_config", cfg.to_dict())
        trial.set_user_attr("params", dict(trial.params))
        self._screen_latency(trial, cfg)
        self._screen_latency(trial, cfg)
        torch.manual_seed(self.s.seed + trial.number)
        model = xsearch.build_model(cfg)
        n_params = xsearch.count_parameters(model)
        trial.set_user_attr("n_parameters", n_params)
        if self.s.max_params is not None:
            self._budget(trial, "params", n_params, self.s.max_params, f"{n_params} parameters")
        latency_ms = self._latency(trial, cfg, model)
        if self.s.max_latency_ms is not None:
            self._budget(trial, "latency", latency_ms, self.s.max_latency_ms, f"latency {latency_ms:.2f} ms")
        metric = self._train(trial, model)
        return metric if self.single else (metric, latency_ms)

    def _screen_latency(self, trial: optuna.Trial, cfg) -> None:
        """Record the predicted latency; prune the trial, unbuilt and untrained, when it is over the budget."""
        if self.predictor is None:
            return
        predicted = self.predictor.predict(cfg, self.seq_len, self.s.batch)
        trial.set_user_attr("latency_predicted_ms", predicted)
        budget = self.s.max_latency_ms
        if budget is not None and predicted > budget and not self.reference:
            if not self.single:
                trial.set_constraint("latency", predicted - budget)  # so the sampler counts it as infeasible
            self._prune(trial, f"over budget: predicted latency {predicted:.2f} ms > {budget:g} ms")

    def _latency(self, trial: optuna.Trial, cfg, model) -> float:
        """Measure (or read from the cache) the model's latency on the target; record it; return the median."""
        from xsearch.latency import device_fingerprint, measure
        from xsearch.latency_cache import cache_key

        device = device_fingerprint(self.s.target, self.s.threads)
        key = cache_key(cfg.to_dict(), self.s.target, self.s.batch, self.seq_len, device)
        stats = self.cache.get(key)
        cached = stats is not None
        if stats is None:
            stats = measure(model, self.s.target, batch=self.s.batch, seq_len=self.seq_len, threads=self.s.threads,
                            repeats=self.s.latency_repeats)  # fmt: skip
            self.cache.put(key, stats)
        trial.set_user_attr("latency", stats.to_dict())
        trial.set_user_attr("latency_cached", cached)
        trial.set_user_attr("device", stats.device)
        return stats.median_ms

    def _budget(self, trial: optuna.Trial, name: str, value: float, limit: float, what: str) -> None:
        """A budget: an Optuna constraint (two objectives, and the reference), else pruning before training."""
        if not self.single or self.reference:
            trial.set_constraint(name, value - limit)
        elif value > limit:
            trial.set_user_attr("train_steps", 0)
            self._prune(trial, f"over budget: {what} > {limit:g}")

    def _prune(self, trial: optuna.Trial, reason: str) -> None:
        trial.set_user_attr("pruned", reason)
        raise optuna.TrialPruned(reason)

    def _train(self, trial: optuna.Trial, model) -> float:
        """Train within the per-trial budget; a single-objective study reports validation to its pruner."""
        import xsearch

        start = time.perf_counter()
        metric_key = metric_name(self.task.kind)

        def report(step: int, record: dict[str, Any]) -> None:
            trial.report(record["valid"], step)
            if not self.reference and trial.should_prune():
                trial.set_user_attr("train_steps", step)
                trial.set_user_attr("train_seconds", round(time.perf_counter() - start, 2))
                self._prune(trial, f"stopped early at step {step}: {metric_key} {record['valid']:.4f}")

        result = xsearch.train(
            model, self.task, steps=self.s.train_steps, seconds=self.s.train_seconds,
            batch_size=self.s.batch_size, lr=self.s.lr, seed=self.s.seed + trial.number, progress=False,
            eval_every=report_every(self.s) if self.single else None, callback=report if self.single else None,
        )  # fmt: skip
        metric = xsearch.evaluate(model, self.task, "valid")
        trial.set_user_attr("train_seconds", round(result.seconds, 2))
        trial.set_user_attr("train_steps", result.steps)
        trial.set_user_attr(metric_key, metric)
        if not math.isfinite(metric):
            raise ValueError(f"validation metric is {metric}")
        return metric


def trial_metric(t: optuna.trial.FrozenTrial) -> float:
    """The task metric of a COMPLETE trial (accuracy, or bits per byte for lm), in either kind of study."""
    return t.values[0]


def trial_latency_ms(t: optuna.trial.FrozenTrial) -> float | None:
    """The median latency a trial measured (``user_attrs["latency"]``), in either kind of study."""
    lat = (t.user_attrs.get("latency") or {}).get("median_ms")
    if lat is None and t.values is not None and len(t.values) > 1:
        return t.values[1]
    return lat


def is_feasible(t: optuna.trial.FrozenTrial) -> bool:
    from optuna.study._constrained_optimization import _get_constraints_from_system_attrs

    return all(v <= 0 for v in _get_constraints_from_system_attrs(t.system_attrs).values())


def metric_is_maximized(study: optuna.Study) -> bool:
    """Whether the study's task metric (its first objective) is maximized (accuracy) or minimized (bits per byte)."""
    return study.directions[0] == optuna.study.StudyDirection.MAXIMIZE


def pareto_front(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Feasible COMPLETE trials that no other feasible trial beats on both task metric and latency.

    The same in both kinds of study: a single-objective study's trials carry their latency too.
    """
    trials = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    trials = [t for t in trials if is_feasible(t) and trial_latency_ms(t) is not None]
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


def describe_config(cfg: dict[str, Any]) -> str:
    """One line: ``local(block_size=64) d128 L2 H4 ff256``."""
    params = ",".join(f"{k}={v}" for k, v in (cfg.get("attention_params") or {}).items())
    dims = sorted(set(cfg.get("ffn_dims") or []))
    ff = "/".join(map(str, dims)) if dims else cfg.get("d_ff")  # pruned FFN widths when the model was pruned
    size = f"d{cfg.get('d_model')} L{cfg.get('n_layers')} H{cfg.get('n_heads')} ff{ff}"
    share = cfg.get("weight_sharing", "none")
    return f"{cfg.get('attention', '?')}({params}) {size}" + ("" if share == "none" else f" share={share}")


def run_search(settings: SearchSettings, *, progress: bool = True) -> optuna.Study:
    """Run (or resume, or join) the study until it holds ``settings.trials`` COMPLETE trials; returns it.

    Several processes may call this at once on one storage and study: together they end with exactly
    ``settings.trials`` COMPLETE trials (see ``xsearch.workers``).
    """
    from xsearch.latency_cache import LatencyCache, default_cache_path
    from xsearch.search_spaces import load_space
    from xsearch.tasks import get_task

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    task = get_task(settings.task, **settings.task_options)
    space = load_space(settings.space, causal=task.kind == "lm", max_len=task.max_len)
    cache_path = default_cache_path() if settings.latency_cache == "default" else settings.latency_cache
    objective = Objective(settings, task, space, LatencyCache(cache_path))
    study = open_study(settings, task.kind, reference_params=space.reference_params())
    study.set_user_attr("settings", {k: v for k, v in asdict(settings).items() if k != "storage"})
    study.set_user_attr("task", task.describe() | {"options": settings.task_options})
    study.set_user_attr("metric", metric_name(task.kind))
    study.set_user_attr("space", space.name)
    complete = count_states(study)[optuna.trial.TrialState.COMPLETE]
    if complete >= settings.trials:
        log.info("study %r already has %d COMPLETE trials (--trials %d is its total): nothing to add",
                 settings.study, complete, settings.trials)  # fmt: skip
        return study
    reporter = _Reporter(study, settings.trials, progress, metric_name(task.kind))
    with reporter:
        run_until_total(
            study, objective, total=settings.trials, heartbeat=True, timeout=settings.timeout, callbacks=[reporter],
            poll_s=max(0.2, min(2.0, settings.heartbeat_interval / 2)), current_trial=lambda: objective.current,
        )  # fmt: skip
    return study


class _Reporter:
    """One line per trial this worker finishes and a progress bar of the study's COMPLETE trials, with ETA."""

    def __init__(self, study, total: int, show: bool, metric: str, label: str = "search") -> None:
        self.total, self.show, self.metric, self.label = total, show, metric, label
        self.start = time.perf_counter()
        self.progress = None
        self.task_id = None
        self.complete = count_states(study)[optuna.trial.TrialState.COMPLETE]

    def __enter__(self):
        if self.show and self.total:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn(self.label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
            self.progress.__enter__()
            self.task_id = self.progress.add_task(self.label, total=self.total, completed=self.complete)
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.state == optuna.trial.TrialState.COMPLETE:
            ok = "feasible" if is_feasible(trial) else "over budget"
            ref = " [reference]" if trial.user_attrs.get("reference") else ""
            line = (f"trial {trial.number:3d}{ref}: {describe_trial(trial)}  {self.metric} {trial_metric(trial):.4f}  "
                    f"latency {trial_latency_ms(trial):.2f} ms  {ok}")  # fmt: skip
        else:
            why = trial.user_attrs.get("pruned") or trial.user_attrs.get("error", "")
            line = f"trial {trial.number:3d}: {trial.state.name} {why[:160]}"
        self._emit(line, study)

    def _emit(self, line: str, study) -> None:
        """Print one line above the progress bar (or log it) and advance the bar."""
        if self.progress is not None:
            self.progress.console.print(line, soft_wrap=True, markup=False, highlight=False)
            done = count_states(study)[optuna.trial.TrialState.COMPLETE]
            self.progress.update(self.task_id, completed=min(done, self.total))
        else:
            log.info(line)
