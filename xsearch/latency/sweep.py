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

import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna

from xsearch.config import describe_config
from xsearch.errors import SettingError, XSearchError
from xsearch.progress import StudyProgress, complete_trials
from xsearch.search.settings import StudySettings
from xsearch.settings import option, same_as

log = logging.getLogger("xsearch.latency")

SWEEP_KIND = "latency-sweep"
REFERENCE = "reference"


@dataclass
class SweepSettings(StudySettings):
    """Everything a latency sweep needs.

    Attributes:
        samples: the total number of measured (COMPLETE) trials wanted in the study; a re-run
            adds only what is missing.
        seq_lens: lengths to measure at, one drawn per trial (None: ``seq_len``, or the task's max_len).
        latency_repeats: timed runs per architecture, spread over ``rounds``.
        rounds: round-robin passes over a group (see ``xsearch.latency.rounds``).
        group: architectures timed together (with the reference); a larger group shares the
            reference's timing among more trials but holds more sessions open.
    """

    study: str = same_as(StudySettings, "study", "latency", help="study name (re-running adds up to samples)")
    samples: int = option(300, "measured architectures wanted in the study (total)", ge=0)
    seq_lens: list[int] | None = option(None, "lengths to draw from, one per trial (e.g. 256,512,1024)")
    latency_repeats: int = option(30, "timed runs per architecture, spread over the rounds", ge=1, flag="--repeats")
    rounds: int = option(10, "round-robin passes over a group, each round's machine speed divided out", ge=1)
    group: int = option(50, "architectures timed together with the reference", ge=1)

    def rules(self) -> None:
        if self.seq_lens is not None:
            if self.seq_len is not None:
                raise SettingError(("seq_len", "seq_lens"), "give {0} or {1}, not both")
            if not self.seq_lens or any(n <= 0 for n in self.seq_lens):
                raise SettingError("seq_lens", f"{{0}} must be positive lengths, got {self.seq_lens}")
            self.seq_lens = sorted(set(self.seq_lens))
        elif self.seq_len is not None:
            self.seq_lens = [self.seq_len]


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
        self.failures = []
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
        """What is timed: the model, or its ONNX file for targets that run exported files (exported now, so
        that a failure is this trial's)."""
        from xsearch.latency.target import get_target

        return get_target(self.s.target).prepare(model, Path(tmp) / f"trial_{number}.onnx")

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
        from xsearch.latency.cache import cache_key
        from xsearch.latency.rounds import time_in_rounds

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

    def _fail(self, study, trial, error: Exception, reporter) -> None:
        self.failures.append(error)
        trial.set_user_attr("error", f"{type(error).__name__}: {error}"[:2000])
        reporter(study, study.tell(trial, state=optuna.trial.TrialState.FAIL))


class SweepProgress(StudyProgress):
    """One line per measured architecture above a bar of the sweep's measured trials."""

    def __init__(self, study: optuna.Study, total: int, show: bool) -> None:
        super().__init__(study, total, show, "sweep")

    def line(self, trial: optuna.trial.FrozenTrial) -> str:
        if trial.state != optuna.trial.TrialState.COMPLETE:
            return super().line(trial)
        attrs = trial.user_attrs
        return (f"trial {trial.number:3d}: {describe_config(attrs.get('model_config') or {})}  seq_len "
                f"{attrs.get('seq_len')}  latency {trial.values[0]:.2f} ms (reference "
                f"{attrs['latency_reference_ms']:.2f} ms)")  # fmt: skip


def run_sweep(settings: SweepSettings, *, progress: bool = True) -> optuna.Study:
    """Run (or resume) a latency sweep until the study holds ``settings.samples`` measured trials.

    Raises:
        XSearchError: a length over the task's max_len, or a study of that name that is not a sweep.
    """
    from xsearch.latency.cache import LatencyCache, default_cache_path
    from xsearch.search_spaces import load_space, load_space_for_task
    from xsearch.storage import open_storage
    from xsearch.tasks import check_task_options, get_task

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    load_space(settings.space)
    check_task_options(settings.task, settings.task_options)
    storage = open_storage(settings.storage)  # reachable, before the (slower) task is built
    task = get_task(settings.task, **settings.task_options)
    seq_lens = settings.seq_lens or [task.max_len]
    too_long = [n for n in seq_lens if n > task.max_len]
    if too_long:
        raise XSearchError(f"seq_len {too_long[0]} exceeds the task's max_len={task.max_len}")
    space = load_space_for_task(settings.space, task)
    study = optuna.create_study(storage=storage, study_name=settings.study, direction="minimize", load_if_exists=True)
    trials = study.get_trials(deepcopy=False)
    if trials and study.user_attrs.get("kind") != SWEEP_KIND:
        raise XSearchError(f"study {settings.study!r} exists and is not a latency sweep (a search study?)")
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    # A fresh seed per resumption: the same seed would draw the architectures already measured.
    study.sampler = optuna.samplers.RandomSampler(seed=settings.seed + len(trials))
    if study.metric_names != ["latency_ms"]:
        import warnings

        with warnings.catch_warnings():  # "experimental" in Optuna
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(["latency_ms"])
    study.set_user_attr("kind", SWEEP_KIND)
    study.set_user_attr("settings", {k: v for k, v in asdict(settings).items() if k != "storage"})
    study.set_user_attr("task", task.describe() | {"options": settings.task_options})
    study.set_user_attr("space", space.name)
    log.info("sweep %r: %d measured, %d to go (%s, seq_len %s)", settings.study, done, max(0, settings.samples - done),
             settings.target, ",".join(map(str, seq_lens)))  # fmt: skip
    cache = LatencyCache(default_cache_path() if settings.latency_cache == "default" else settings.latency_cache)
    with (
        SweepProgress(study, settings.samples, progress) as reporter,
        tempfile.TemporaryDirectory(prefix="xsearch-sweep-") as workdir,
    ):
        measurer = _GroupMeasurer(settings, space, task.model_fields(), seq_lens, cache, workdir)
        while (missing := settings.samples - (before := complete_trials(study))) > 0:
            measurer.run(study, min(settings.group, missing), reporter)
            if complete_trials(study) == before:
                raise _group_failed(settings.study, measurer.failures)
    return study


def _group_failed(study: str, failures: list[Exception]) -> Exception:
    """The error that stops a sweep none of whose architectures of a group could be measured: of the kind
    the failures share (the user's, the system's), so the CLI says whose the fault is."""
    last = failures[-1] if failures else None
    reason = f"{type(last).__name__}: {last}" if last is not None else "no error recorded"
    message = f"sweep {study!r}: no architecture of a whole group was measured ({reason})"
    for kind in (XSearchError, OSError):
        if failures and all(isinstance(e, kind) for e in failures):
            return XSearchError(message) if kind is XSearchError else OSError(message)
    return RuntimeError(message)
