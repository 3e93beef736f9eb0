"""Latency data for the predictor: a latency-only sweep study, and reading measured trials back.

A sweep samples architectures of a search space at random and measures their latency on the
target without training them, so hundreds of points cost minutes, not hours. Its trials carry
the same ``user_attrs`` as search trials (``model_config``, ``latency``, ``n_parameters``,
``device``) plus the ``seq_len`` and ``batch`` they were measured at; ``load_rows`` reads sweep
and search studies alike.

Architectures are measured in groups (``group`` at a time), never alone: a group and the space's
reference Transformer are timed together in round-robin rounds with each round's machine speed
divided out (``time_in_rounds``), and each trial records the reference's latency in its group
(``latency_reference_ms``). ``rows_from_study`` scales every group to the sweep's typical
reference latency, so a group timed while the machine was slow does not read as slow
architectures.
"""

from __future__ import annotations

import json
import logging
import statistics
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna

from xsearch.latency_predictor import LatencyRow
from xsearch.search import DEFAULT_STORAGE, _Reporter, describe_trial

log = logging.getLogger("xsearch.latency")

SWEEP_KIND = "latency-sweep"
REFERENCE = "reference"


@dataclass
class SweepSettings:
    """Everything a latency sweep needs (the CLI's flags, as data).

    Attributes:
        samples: the total number of measured (COMPLETE) trials wanted in the study; a re-run
            adds only what is missing.
        seq_lens: lengths to measure at, one drawn per trial (None: the task's max_len).
        latency_repeats: timed runs per architecture, spread over ``rounds``.
        rounds: round-robin passes over a group (see ``xsearch.latency_rounds``).
        group: architectures timed together (with the reference); a larger group shares the
            reference's timing among more trials but holds more sessions open.
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
    latency_repeats: int = 30
    rounds: int = 10
    group: int = 50
    seed: int = 0
    latency_cache: str | None = "default"

    def __post_init__(self) -> None:
        if self.samples < 0:
            raise ValueError(f"samples must be >= 0, got {self.samples}")
        for name in ("batch", "latency_repeats", "rounds", "group"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.seq_lens is not None:
            if not self.seq_lens or any(n <= 0 for n in self.seq_lens):
                raise ValueError(f"seq_lens must be positive lengths, got {self.seq_lens}")
            self.seq_lens = sorted(set(self.seq_lens))


class _GroupMeasurer:
    """One group of sweep trials: suggest and build each, time them with the reference, tell them."""

    def __init__(self, settings: SweepSettings, space, task_fields: dict[str, Any], seq_lens: list[int], cache,
                 workdir: str):  # fmt: skip
        """``workdir``: where the exported files live while the sweep runs (a folder per group)."""
        self.s, self.space, self.fields, self.seq_lens, self.cache = settings, space, task_fields, seq_lens, cache
        self.workdir = workdir
        self._reference = None

    def run(self, study: optuna.Study, size: int, reporter) -> None:
        """Ask ``size`` trials, build them (exported for ``ort-*``), time them with the reference, tell them."""
        with tempfile.TemporaryDirectory(dir=self.workdir) as tmp:
            self._run(study, size, reporter, tmp)

    def _run(self, study: optuna.Study, size: int, reporter, tmp: str) -> None:
        import torch

        import xsearch

        open_trials: dict[int, optuna.Trial] = {}
        try:
            built: dict[int, list[tuple[optuna.Trial, Any]]] = {}
            for _ in range(size):
                trial = study.ask()
                open_trials[trial.number] = trial
                try:
                    cfg = self.space.suggest(trial, self.fields)
                    seq_len = (self.seq_lens[0] if len(self.seq_lens) == 1
                               else trial.suggest_categorical("seq_len", self.seq_lens))  # fmt: skip
                    trial.set_user_attr("model_config", cfg.to_dict())
                    trial.set_user_attr("params", dict(trial.params))
                    trial.set_user_attr("seq_len", seq_len)
                    trial.set_user_attr("batch", self.s.batch)
                    torch.manual_seed(self.s.seed + trial.number)
                    model = xsearch.build_model(cfg).eval()
                    trial.set_user_attr("n_parameters", xsearch.count_parameters(model))
                    prepared = self._prepare(model, trial.number, tmp)
                    built.setdefault(seq_len, []).append((trial, prepared))
                except Exception as e:  # one architecture that cannot be built or exported fails alone
                    self._fail(study, open_trials.pop(trial.number), e, reporter)
            for seq_len, members in built.items():
                self._time(study, seq_len, members, open_trials, reporter)
        finally:
            for trial in open_trials.values():  # interrupted: nothing stays RUNNING
                study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def _prepare(self, model, number: int, tmp: str):
        """What is timed: the ONNX file (``ort-*``, exported now so a failure is this trial's) or the model."""
        if not self.s.target.startswith("ort"):
            return model
        from xsearch.export.onnx_export import to_onnx

        path = Path(tmp) / f"trial_{number}.onnx"
        to_onnx(model, path, check=False)
        return path

    def _reference_model(self):
        """The space's reference Transformer, prepared once per sweep run (it is the same at every length)."""
        if self._reference is None:
            import torch

            import xsearch

            torch.manual_seed(self.s.seed)
            model = xsearch.build_model(self.space.reference_config(self.fields)).eval()
            self._reference = self._prepare(model, -1, self.workdir)
        return self._reference

    def _time(self, study, seq_len: int, members, open_trials, reporter) -> None:
        from xsearch.latency_cache import cache_key
        from xsearch.latency_rounds import time_in_rounds

        per_round = max(1, -(-self.s.latency_repeats // self.s.rounds))
        try:
            models = {REFERENCE: self._reference_model()}
            models.update({f"trial_{t.number}": m for t, m in members})
            timed = time_in_rounds(models, self.s.target, batch=self.s.batch, seq_len=seq_len, threads=self.s.threads,
                                   per_round=per_round, rounds=self.s.rounds,
                                   seed=self.s.seed + members[0][0].number)  # fmt: skip
        except Exception as e:
            for trial, _ in members:
                self._fail(study, open_trials.pop(trial.number), e, reporter)
            return
        reference_ms = timed.stats[REFERENCE].median_ms
        for trial, _ in members:
            stats = timed.stats[f"trial_{trial.number}"]
            trial.set_user_attr("latency", stats.to_dict())
            trial.set_user_attr("latency_reference_ms", reference_ms)
            trial.set_user_attr("latency_group", members[0][0].number)
            trial.set_user_attr("latency_round_speed", [round(v, 4) for v in timed.round_speed])
            trial.set_user_attr("device", stats.device)
            cfg = trial.user_attrs["model_config"]
            self.cache.put(cache_key(cfg, self.s.target, self.s.batch, seq_len, stats.device), stats)
            frozen = study.tell(open_trials.pop(trial.number), stats.median_ms)
            reporter(study, frozen)

    @staticmethod
    def _fail(study, trial, error: Exception, reporter) -> None:
        trial.set_user_attr("error", f"{type(error).__name__}: {error}"[:2000])
        reporter(study, study.tell(trial, state=optuna.trial.TrialState.FAIL))


class _SweepReporter(_Reporter):
    """The search's progress bar, with one line per measured architecture."""

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.state == optuna.trial.TrialState.COMPLETE:
            line = (f"trial {trial.number:3d}: {describe_trial(trial)}  seq_len {trial.user_attrs.get('seq_len')}  "
                    f"latency {trial.values[0]:.2f} ms "
                    f"(reference {trial.user_attrs['latency_reference_ms']:.2f} ms)")  # fmt: skip
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
    from xsearch.storage import open_storage
    from xsearch.tasks import get_task

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    task = get_task(settings.task, **settings.task_options)
    seq_lens = settings.seq_lens or [task.max_len]
    too_long = [n for n in seq_lens if n > task.max_len]
    if too_long:
        raise ValueError(f"seq_len {too_long[0]} exceeds the task's max_len={task.max_len}")
    space = load_space(settings.space, causal=task.kind == "lm", max_len=task.max_len)
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
    log.info("sweep %r: %d measured, %d to go (%s, seq_len %s)", settings.study, done, max(0, settings.samples - done),
             settings.target, ",".join(map(str, seq_lens)))  # fmt: skip
    cache = LatencyCache(default_cache_path() if settings.latency_cache == "default" else settings.latency_cache)
    with (
        _SweepReporter(study, settings.samples, progress, "latency", label="sweep") as reporter,
        tempfile.TemporaryDirectory(prefix="xsearch-sweep-") as workdir,
    ):
        measurer = _GroupMeasurer(settings, space, task.model_fields(), seq_lens, cache, workdir)
        while (missing := settings.samples - (before := _complete(study))) > 0:
            measurer.run(study, min(settings.group, missing), reporter)
            if _complete(study) == before:
                errors = [t.user_attrs.get("error") for t in study.get_trials(deepcopy=False)[-settings.group :]]
                last = next((e for e in reversed(errors) if e), "no error recorded")
                raise RuntimeError(f"sweep {settings.study!r}: no architecture of a whole group was measured ({last})")
    return study


def _complete(study: optuna.Study) -> int:
    return sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(deepcopy=False))


def rows_from_study(study: optuna.Study) -> list[LatencyRow]:
    """The measured trials of a search or sweep study (any state that recorded a latency).

    A sweep trial's latency is scaled by ``typical / latency_reference_ms``, where ``typical`` is
    the median over the study of the reference's latency at that length and batch: the speed of
    the machine while its group was timed is divided out. Each such row names its group as its
    ``session`` (the predictor refines the group's speed from all its rows). Measurements of
    older sweeps that other processes disturbed (``latency_disturbed`` > 0) are left out.
    """
    settings = study.user_attrs.get("settings") or {}
    task = study.user_attrs.get("task") or {}
    rows, references, disturbed = [], [], 0
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
        reference = attrs.get("latency_reference_ms")
        # Trials of one sweep group share a reference timing (older sweeps did not record the group).
        session = f"{study.study_name}/{attrs.get('latency_group', reference)}" if reference else ""
        rows.append(LatencyRow(cfg, int(seq_len), int(batch), float(lat["median_ms"]), str(target), device, session))
        references.append(reference)
    if disturbed:
        log.info("study %r: %d measurements disturbed by other processes left out", study.study_name, disturbed)
    typical: dict[tuple[int, int], float] = {}
    for shape in {(r.seq_len, r.batch) for r in rows}:
        refs = [ref for r, ref in zip(rows, references) if (r.seq_len, r.batch) == shape and ref]
        if refs:
            typical[shape] = statistics.median(refs)
    return [
        replace(row, latency_ms=row.latency_ms * typical[(row.seq_len, row.batch)] / ref) if ref else row
        for row, ref in zip(rows, references)
    ]


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
