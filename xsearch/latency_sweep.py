"""Latency data for the predictor: a latency-only sweep study, and reading measured trials back.

A sweep samples architectures of a search space at random and measures their latency on the
target without training them, so hundreds of points cost minutes, not hours. Its trials carry
the same ``user_attrs`` as search trials (``model_config``, ``latency``, ``n_parameters``,
``device``) plus the ``seq_len`` and ``batch`` they were measured at; ``load_rows`` reads sweep
and search studies alike.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import optuna

from xsearch.latency_predictor import LatencyRow
from xsearch.search import DEFAULT_STORAGE, _Reporter, describe_trial

log = logging.getLogger("xsearch.latency")

SWEEP_KIND = "latency-sweep"


@dataclass
class SweepSettings:
    """Everything a latency sweep needs (the CLI's flags, as data).

    Attributes:
        samples: the total number of measured (COMPLETE) trials wanted in the study; a re-run
            adds only what is missing.
        seq_lens: lengths to measure at, one drawn per trial (None: the task's max_len).
        wait_idle: how long (seconds) a measurement may go on timing runs until ``latency_repeats``
            of them were not slowed down by other processes; 0 keeps every run.
    """

    task: str = "listops"
    task_options: dict[str, Any] = field(default_factory=dict)
    space: str = "default"
    target: str = "ort-cpu"
    samples: int = 300
    storage: str = DEFAULT_STORAGE
    study: str = "latency"
    seq_lens: list[int] | None = None
    batch: int = 1
    threads: int | None = 2
    latency_repeats: int = 10
    seed: int = 0
    latency_cache: str | None = "default"
    wait_idle: float = 30.0

    def __post_init__(self) -> None:
        if self.samples < 0:
            raise ValueError(f"samples must be >= 0, got {self.samples}")
        if self.batch <= 0 or self.latency_repeats <= 0:
            raise ValueError(f"batch and latency_repeats must be > 0, got {self.batch}, {self.latency_repeats}")
        if self.wait_idle < 0:
            raise ValueError(f"wait_idle must be >= 0, got {self.wait_idle}")
        if self.seq_lens is not None:
            if not self.seq_lens or any(n <= 0 for n in self.seq_lens):
                raise ValueError(f"seq_lens must be positive lengths, got {self.seq_lens}")
            self.seq_lens = sorted(set(self.seq_lens))


class _SweepObjective:
    """One sweep trial: suggest -> build -> latency (cached) -> the median as the trial's value.

    On a shared machine other processes slow a measurement down, so only runs they did not
    disturb are kept (``measure_undisturbed``, patient for ``wait_idle`` seconds). A measurement
    that still holds disturbed runs is recorded (``latency_disturbed``) but not cached, and
    ``latency fit`` leaves it out.
    """

    def __init__(self, settings: SweepSettings, space, fields: dict[str, Any], seq_lens: list[int], cache) -> None:
        self.s, self.space, self.fields, self.seq_lens, self.cache = settings, space, fields, seq_lens, cache

    def __call__(self, trial: optuna.Trial) -> float:
        try:
            return self._run(trial)
        except Exception as e:
            trial.set_user_attr("error", f"{type(e).__name__}: {e}"[:2000])
            raise

    def _run(self, trial: optuna.Trial) -> float:
        import torch

        import xsearch
        from xsearch.latency import device_fingerprint, measure_undisturbed
        from xsearch.latency_cache import cache_key

        cfg = self.space.suggest(trial, self.fields)
        seq_len = self.seq_lens[0] if len(self.seq_lens) == 1 else trial.suggest_categorical("seq_len", self.seq_lens)
        trial.set_user_attr("model_config", cfg.to_dict())
        trial.set_user_attr("params", dict(trial.params))
        trial.set_user_attr("seq_len", seq_len)
        trial.set_user_attr("batch", self.s.batch)
        torch.manual_seed(self.s.seed + trial.number)
        model = xsearch.build_model(cfg).eval()
        trial.set_user_attr("n_parameters", xsearch.count_parameters(model))
        device = device_fingerprint(self.s.target, self.s.threads)
        key = cache_key(cfg.to_dict(), self.s.target, self.s.batch, seq_len, device)
        stats = self.cache.get(key)
        cached = stats is not None
        if stats is None:
            stats, disturbed = measure_undisturbed(model, self.s.target, batch=self.s.batch, seq_len=seq_len,
                                                   threads=self.s.threads, repeats=self.s.latency_repeats,
                                                   patience=self.s.wait_idle)  # fmt: skip
            trial.set_user_attr("latency_disturbed", disturbed)
            if not disturbed:
                self.cache.put(key, stats)
        trial.set_user_attr("latency", stats.to_dict())
        trial.set_user_attr("latency_cached", cached)
        trial.set_user_attr("device", stats.device)
        return stats.median_ms


class _SweepReporter(_Reporter):
    """The search's progress bar, with one line per measured architecture."""

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.state == optuna.trial.TrialState.COMPLETE:
            cached = " (cached)" if trial.user_attrs.get("latency_cached") else ""
            line = (f"trial {trial.number:3d}: {describe_trial(trial)}  seq_len {trial.user_attrs.get('seq_len')}  "
                    f"latency {trial.values[0]:.2f} ms{cached}")  # fmt: skip
        else:
            line = f"trial {trial.number:3d}: {trial.state.name} {trial.user_attrs.get('error', '')[:160]}"
        self._emit(line, study)


def run_sweep(settings: SweepSettings, *, progress: bool = True) -> optuna.Study:
    """Run (or resume) a latency sweep until the study holds ``settings.samples`` measured trials.

    Raises:
        ValueError: a length over the task's max_len, or a study of that name that is not a sweep.
    """
    from xsearch.latency_cache import LatencyCache, default_cache_path
    from xsearch.search_spaces import load_space
    from xsearch.tasks import get_task

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    task = get_task(settings.task, **settings.task_options)
    seq_lens = settings.seq_lens or [task.max_len]
    too_long = [n for n in seq_lens if n > task.max_len]
    if too_long:
        raise ValueError(f"seq_len {too_long[0]} exceeds the task's max_len={task.max_len}")
    space = load_space(settings.space, causal=task.kind == "lm", max_len=task.max_len)
    from xsearch.storage import open_storage

    study = optuna.create_study(
        storage=open_storage(settings.storage), study_name=settings.study, direction="minimize", load_if_exists=True
    )
    trials = study.get_trials(deepcopy=False)
    if trials and study.user_attrs.get("kind") != SWEEP_KIND:
        raise ValueError(f"study {settings.study!r} exists and is not a latency sweep (a search study?)")
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    # A fresh seed per resumption: the same seed would draw the architectures already measured.
    study.sampler = optuna.samplers.RandomSampler(seed=settings.seed + len(trials))
    study.set_user_attr("kind", SWEEP_KIND)
    study.set_user_attr("settings", {k: v for k, v in asdict(settings).items() if k != "storage"})
    study.set_user_attr("task", task.describe() | {"options": settings.task_options})
    study.set_user_attr("space", space.name)
    remaining = max(0, settings.samples - done)
    log.info("sweep %r: %d measured, %d to go (%s, seq_len %s)", settings.study, done, remaining, settings.target,
             ",".join(map(str, seq_lens)))  # fmt: skip
    cache_path = default_cache_path() if settings.latency_cache == "default" else settings.latency_cache
    objective = _SweepObjective(settings, space, task.model_fields(), seq_lens, LatencyCache(cache_path))
    with _SweepReporter(study, settings.samples, progress, "latency", label="sweep") as reporter:
        study.optimize(objective, n_trials=remaining, catch=(Exception,), callbacks=[reporter], gc_after_trial=True)
    return study


def rows_from_study(study: optuna.Study) -> list[LatencyRow]:
    """The measured trials of a search or sweep study (any state that recorded a latency).

    Sweep measurements that other processes disturbed (``latency_disturbed`` > 0) are left out.
    """
    settings = study.user_attrs.get("settings") or {}
    task = study.user_attrs.get("task") or {}
    rows, disturbed = [], 0
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        lat, cfg = attrs.get("latency"), attrs.get("model_config")
        if not isinstance(lat, dict) or not isinstance(cfg, dict) or "median_ms" not in lat:
            continue
        if attrs.get("latency_disturbed"):
            disturbed += 1
            continue
        seq_len = attrs.get("seq_len") or settings.get("seq_len") or task.get("max_len") or cfg.get("max_len")
        batch = attrs.get("batch") or settings.get("batch") or 1
        target = lat.get("target") or settings.get("target")
        device = attrs.get("device") or lat.get("device") or {}
        rows.append(LatencyRow(cfg, int(seq_len), int(batch), float(lat["median_ms"]), str(target), device))
    if disturbed:
        log.info("study %r: %d measurements disturbed by other processes left out", study.study_name, disturbed)
    return rows


def load_rows(storage: str, studies: list[str]) -> list[LatencyRow]:
    """The measured trials of every named study in ``storage``."""
    from xsearch.report import load

    rows = []
    for name in studies:
        rows.extend(rows_from_study(load(storage, name)))
    return rows


def describe_device(device: dict[str, Any]) -> str:
    """A short label of a device fingerprint: ``"AMD EPYC ... x2 threads, onnxruntime 1.32.0"``."""
    parts = [str(device.get("gpu") or device.get("cpu") or "?"), f"{device.get('threads')} threads"]
    parts += [f"{k} {device[k]}" for k in ("onnxruntime", "torch") if device.get(k)]
    return ", ".join(parts)


def select_rows(rows: list[LatencyRow], target: str | None = None, threads: int | None = None) -> list[LatencyRow]:
    """The rows of one target and one device.

    Raises:
        ValueError: no rows, or several targets or devices left and no choice given, naming them.
    """
    if not rows:
        raise ValueError("no measured trials (with a latency) in the given studies")
    if target is not None:
        targets = sorted({r.target for r in rows})
        rows = [r for r in rows if r.target == target]
        if not rows:
            raise ValueError(f"no trials measured on target {target!r} (targets there: {', '.join(targets)})")
    targets = sorted({r.target for r in rows})
    if len(targets) > 1:
        raise ValueError(f"the studies mix targets {', '.join(targets)}; choose one with --target")
    if threads is not None:
        have = sorted({str(r.device.get("threads")) for r in rows})
        rows = [r for r in rows if r.device.get("threads") == threads]
        if not rows:
            raise ValueError(f"no trials measured with {threads} threads (threads there: {', '.join(have)})")
    devices = {json.dumps(r.device, sort_keys=True): r.device for r in rows}
    if len(devices) > 1:
        names = "; ".join(sorted(describe_device(d) for d in devices.values()))
        raise ValueError(f"the studies mix devices for target {targets[0]!r} ({names}); choose one with --threads")
    return rows
