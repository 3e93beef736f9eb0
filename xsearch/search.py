"""The hardware-aware search: an Optuna study over a search space, two objectives (task metric
and latency measured on the target), latency and size budgets as constraints.

Every new study starts with the reference Transformer (``full`` attention at the space's
reference size), so each result reads as "x times faster than the Transformer, y points of
accuracy". Each trial stores its ``ModelConfig`` and measurements in ``user_attrs``; a trial
that fails is recorded as FAIL with the reason and the study goes on. Re-running with the same
storage and study name resumes it.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import optuna

log = logging.getLogger("xsearch.search")

SAMPLERS = ("tpe", "nsga2", "random")
DEFAULT_STORAGE = "sqlite:///runs/xsearch.db"


@dataclass
class SearchSettings:
    """Everything a search needs (the CLI's flags, as data)."""

    task: str = "listops"
    task_options: dict[str, Any] = field(default_factory=dict)
    space: str = "default"
    target: str = "ort-cpu"
    trials: int = 20
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
    latency_predictor: str | None = None

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {self.sampler!r}; valid: {', '.join(SAMPLERS)}")
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
    return "bits_per_byte" if task_kind == "lm" else "accuracy"


def open_study(settings: SearchSettings, task_kind: str, *, create: bool = True) -> optuna.Study:
    """Create or load the study (``load_if_exists``); check its directions match the task."""
    directions = ["minimize" if task_kind == "lm" else "maximize", "minimize"]
    _ensure_sqlite_dir(settings.storage)
    sampler = make_sampler(settings.sampler, settings.seed, settings.trials)
    study = optuna.create_study(
        storage=settings.storage,
        study_name=settings.study,
        directions=directions,
        sampler=sampler,
        load_if_exists=True,
    )
    have = [d.name.lower() for d in study.directions]
    if have != directions:
        raise ValueError(f"study {settings.study!r} exists with directions {have}, not {directions} for this task")
    return study


def _ensure_sqlite_dir(url: str) -> None:
    if url.startswith("sqlite:///"):
        from pathlib import Path

        path = Path(url[len("sqlite:///") :])
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)


class Objective:
    """One trial: suggest -> build -> measure latency -> train -> validate."""

    def __init__(self, settings: SearchSettings, task, space, cache) -> None:
        self.s = settings
        self.task = task
        self.space = space
        self.cache = cache
        self.seq_len = settings.seq_len or task.max_len
        if self.seq_len > task.max_len:
            raise ValueError(f"--seq-len {self.seq_len} exceeds the task's max_len={task.max_len}")
        self.predictor = None
        if settings.latency_predictor is not None:
            from xsearch.latency_predictor import load_for_target

            self.predictor = load_for_target(settings.latency_predictor, settings.target, settings.threads)

    def __call__(self, trial: optuna.Trial) -> tuple[float, float]:
        try:
            return self._run(trial)
        except optuna.TrialPruned:
            raise
        except Exception as e:
            trial.set_user_attr("error", f"{type(e).__name__}: {e}"[:2000])
            raise

    def _run(self, trial: optuna.Trial) -> tuple[float, float]:
        import torch

        import xsearch
        from xsearch.latency import device_fingerprint, measure
        from xsearch.latency_cache import cache_key

        cfg = self.space.suggest(trial, self.task.model_fields())
        trial.set_user_attr("model_config", cfg.to_dict())
        trial.set_user_attr("params", dict(trial.params))
        self._screen_latency(trial, cfg)
        torch.manual_seed(self.s.seed + trial.number)
        model = xsearch.build_model(cfg)
        n_params = xsearch.count_parameters(model)
        trial.set_user_attr("n_parameters", n_params)

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
        if self.s.max_latency_ms is not None:
            trial.set_constraint("latency", stats.median_ms - self.s.max_latency_ms)
        if self.s.max_params is not None:
            trial.set_constraint("params", n_params - self.s.max_params)

        result = xsearch.train(
            model, self.task, steps=self.s.train_steps, seconds=self.s.train_seconds,
            batch_size=self.s.batch_size, lr=self.s.lr, seed=self.s.seed + trial.number, progress=False,
        )  # fmt: skip
        metric = xsearch.evaluate(model, self.task, "valid")
        trial.set_user_attr("train_seconds", round(result.seconds, 2))
        trial.set_user_attr("train_steps", result.steps)
        trial.set_user_attr(metric_name(self.task.kind), metric)
        if not math.isfinite(metric):
            raise ValueError(f"validation metric is {metric}")
        return metric, stats.median_ms

    def _screen_latency(self, trial: optuna.Trial, cfg) -> None:
        """Record the predicted latency; prune the trial, untrained, when it is over the budget."""
        if self.predictor is None:
            return
        predicted = self.predictor.predict(cfg, self.seq_len, self.s.batch)
        trial.set_user_attr("latency_predicted_ms", predicted)
        budget = self.s.max_latency_ms
        if budget is not None and predicted > budget:
            trial.set_user_attr("pruned_reason", f"predicted latency {predicted:.2f} ms > budget {budget:g} ms")
            trial.set_constraint("latency", predicted - budget)  # so the sampler counts it as infeasible
            raise optuna.TrialPruned()


def is_feasible(t: optuna.trial.FrozenTrial) -> bool:
    from optuna.study._constrained_optimization import _get_constraints_from_system_attrs

    return all(v <= 0 for v in _get_constraints_from_system_attrs(t.system_attrs).values())


def pareto_front(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Feasible COMPLETE trials that no other feasible trial beats on both objectives."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    trials = [t for t in trials if is_feasible(t)]
    signs = [1.0 if d == optuna.study.StudyDirection.MINIMIZE else -1.0 for d in study.directions]
    loss = [[s * v for s, v in zip(signs, t.values)] for t in trials]

    def dominated(i: int) -> bool:
        return any(
            all(a <= b for a, b in zip(loss[j], loss[i])) and any(a < b for a, b in zip(loss[j], loss[i]))
            for j in range(len(trials))
            if j != i
        )

    front = [t for i, t in enumerate(trials) if not dominated(i)]
    return sorted(front, key=lambda t: t.values[1])


def reference_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("reference") and t.state == optuna.trial.TrialState.COMPLETE:
            return t
    return None


def describe_trial(t: optuna.trial.FrozenTrial) -> str:
    cfg = t.user_attrs.get("model_config") or {}
    params = ",".join(f"{k}={v}" for k, v in (cfg.get("attention_params") or {}).items())
    size = f"d{cfg.get('d_model')} L{cfg.get('n_layers')} H{cfg.get('n_heads')} ff{cfg.get('d_ff')}"
    share = cfg.get("weight_sharing", "none")
    return f"{cfg.get('attention', '?')}({params}) {size}" + ("" if share == "none" else f" share={share}")


def run_search(settings: SearchSettings, *, progress: bool = True) -> optuna.Study:
    """Run (or resume) the study; returns it. Adds ``settings.trials`` trials."""
    from xsearch.latency_cache import LatencyCache, default_cache_path
    from xsearch.search_spaces import load_space
    from xsearch.tasks import get_task

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    task = get_task(settings.task, **settings.task_options)
    space = load_space(settings.space, causal=task.kind == "lm", max_len=task.max_len)
    cache_path = default_cache_path() if settings.latency_cache == "default" else settings.latency_cache
    objective = Objective(settings, task, space, LatencyCache(cache_path))
    study = open_study(settings, task.kind)
    study.set_user_attr("settings", {k: v for k, v in asdict(settings).items() if k != "storage"})
    study.set_user_attr("task", task.describe() | {"options": settings.task_options})
    study.set_user_attr("metric", metric_name(task.kind))
    study.set_user_attr("space", space.name)
    if not study.get_trials(deepcopy=False):
        study.enqueue_trial(space.reference_params(), user_attrs={"reference": True})
    reporter = _Reporter(study, settings.trials, progress, metric_name(task.kind))
    with reporter:
        study.optimize(
            objective,
            n_trials=settings.trials,
            timeout=settings.timeout,
            catch=(Exception,),
            callbacks=[reporter],
            gc_after_trial=True,
        )
    return study


class _Reporter:
    """One line per finished trial and an overall progress bar with ETA."""

    def __init__(self, study, total: int, show: bool, metric: str, label: str = "search") -> None:
        self.total, self.show, self.metric, self.label = total, show, metric, label
        self.done = 0
        self.start = time.perf_counter()
        self.progress = None
        self.task_id = None

    def __enter__(self):
        if self.show and self.total:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn(self.label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
            self.progress.__enter__()
            self.task_id = self.progress.add_task(self.label, total=self.total)
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.done += 1
        if trial.state == optuna.trial.TrialState.COMPLETE:
            lat = trial.values[1]
            ok = "feasible" if is_feasible(trial) else "over budget"
            ref = " [reference]" if trial.user_attrs.get("reference") else ""
            line = (f"trial {trial.number:3d}{ref}: {describe_trial(trial)}  {self.metric} {trial.values[0]:.4f}  "
                    f"latency {lat:.2f} ms  {ok}")  # fmt: skip
        else:
            why = trial.user_attrs.get("error") or trial.user_attrs.get("pruned_reason", "")
            line = f"trial {trial.number:3d}: {trial.state.name} {why[:160]}"
        self._emit(line)

    def _emit(self, line: str) -> None:
        """Print one line above the progress bar (or log it) and advance the bar."""
        if self.progress is not None:
            self.progress.console.print(line, soft_wrap=True, markup=False, highlight=False)
            self.progress.update(self.task_id, completed=self.done)
        else:
            log.info(line)
