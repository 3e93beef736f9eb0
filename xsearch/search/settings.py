"""``SearchSettings``: every option of a search, defined once (the CLI's flags and the pipeline's
``search:`` section are built from these fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from xsearch.errors import SettingError
from xsearch.latency.target import list_targets
from xsearch.latency.timing import MeasureSettings
from xsearch.settings import Settings, option, same_as
from xsearch.training.settings import TrainSettings

SAMPLERS = ("auto", "tpe", "nsga2", "random")
OBJECTIVES = ("both", "accuracy")
RANK_BY = ("loss", "accuracy")
PRUNERS = ("hyperband", "median", "none")
DEFAULT_STORAGE = "sqlite:///runs/xsearch.db"
DEFAULT_TRAIN_STEPS = 200  # per trial, when neither train_steps nor train_seconds is given
REPORTS_PER_TRIAL = 8  # validation points per trial when a pruner watches training (steps budget)


@dataclass
class StudySettings(Settings):
    """What a study measures and where it lives: shared by the search and the latency sweep."""

    task: str = option("listops", "the task (xsearch.tasks.list_tasks())", cli=False)
    task_options: dict[str, Any] = option(factory=dict, help="the task's options", cli=False)
    space: str = option("default", "a shipped space (`xsearch spaces`) or a .yaml path")
    target: str = option("ort-cpu", "where latency is measured", choices=list_targets)
    storage: str = option(
        DEFAULT_STORAGE, "sqlite:///FILE, postgresql+psycopg://USER:PASSWORD@HOST/DB, or journal:FILE", metavar="URL"
    )
    study: str = option("xsearch", "study name (re-running resumes it; workers share it)")
    seq_len: int | None = option(None, "length at which latency is measured (default: the task's max_len)", gt=0)
    batch: int = option(1, "batch size at which latency is measured", ge=1)
    threads: int | None = option(2, "threads for latency measurement", gt=0)
    seed: int = option(0, "seeds the sampler (and each trial's training)")
    latency_cache: str | None = option("default", "latency cache file ('default': ~/.cache/xsearch)", cli=False)


@dataclass
class SearchSettings(StudySettings):
    """Everything a search needs."""

    #: Options of which at most one may be given; giving one drops the others' defaults.
    ALTERNATIVES: ClassVar[tuple[tuple[str, ...], ...]] = (("train_steps", "train_seconds"),)

    trials: int = option(20, "COMPLETE trials the study ends with (all workers together)", ge=0)
    timeout: float | None = option(None, "stop starting trials after this many seconds", gt=0)
    objective: str = option(
        "both", "both: the task's score (rank_by) and latency (a Pareto front); accuracy: the score alone under "
        "max_latency_ms, with pruning",
        choices=OBJECTIVES,
    )  # fmt: skip
    rank_by: str = option(
        "loss", "what trials are ranked, pruned and picked by on the validation split: loss (cross-entropy, which "
        "ranks short trainings better than their accuracy: bench/supernet.md) or accuracy; lm tasks rank by bits "
        "per byte", choices=RANK_BY,
    )  # fmt: skip
    pruner: str | None = option(
        None, "stops weak trials early (objective accuracy; default hyperband)", choices=PRUNERS
    )
    max_latency_ms: float | None = option(
        None, "latency budget (a constraint; with objective accuracy, over-budget trials are pruned)", gt=0
    )
    max_params: int | None = option(None, "parameter budget (like max_latency_ms)", gt=0)
    latency_predictor: str | None = option(
        None, "a predictor JSON (xsearch latency fit): candidates predicted over max_latency_ms are never trained"
    )
    latency_repeats: int = option(10, "timed runs per candidate", ge=1)
    latency_mode: str = same_as(MeasureSettings, "latency_mode")
    context: int | None = same_as(MeasureSettings, "context")
    supernet: str | None = option(
        None,
        "a supernet folder (xsearch supernet train): each trial is scored on the validation split with its "
        "inherited weights instead of being trained; with latency_predictor its latency is predicted, not measured",
    )
    inherited_finetune_steps: int = option(
        0,
        "in a supernet search: train each candidate this many steps from its inherited weights (lr, batch_size) "
        "before scoring it; 0 scores the inherited weights as they are",
        ge=0,
    )
    train_steps: int | None = option(
        None, f"training steps per trial, from new weights (default {DEFAULT_TRAIN_STEPS} without train_seconds; "
        "a search scored by a supernet trains inherited_finetune_steps instead)", gt=0,
    )  # fmt: skip
    train_seconds: float | None = option(None, "training seconds per trial, instead of train_steps", gt=0)
    batch_size: int = option(32, "examples per training step", ge=1)
    lr: float = option(1e-3, "peak learning rate of each trial's training", gt=0)
    train_device: str = same_as(TrainSettings, "device", help="where each trial trains and is validated: cpu, "
                                "cuda or cuda:N (a CUDA GPU torch sees; no fallback; latency is measured on the "
                                "target)")  # fmt: skip
    sampler: str = option(
        "auto", "the Optuna sampler (auto: nsga2 for a search scored with --supernet, else tpe)", choices=SAMPLERS
    )
    heartbeat_interval: int = option(10, "seconds between a running trial's heartbeats", ge=1)
    grace_period: int | None = option(
        None, "seconds without a heartbeat before a trial is failed and retried (default 3 intervals)", gt=0
    )
    max_failures: int = option(3, "trials in a row failing for the same reason after which the search stops", ge=1)

    def sampler_name(self) -> str:
        """The sampler a search uses: ``auto`` is NSGA-II when a supernet scores the candidates, TPE otherwise.

        A supernet search scores thousands of candidates (HAT searches its supernet with an evolutionary
        algorithm too). TPE refits on the whole history at every trial: at 2,000 trials of the ``default``
        space it spent 1.2 s per trial choosing (against 0.3 s scoring, averaged over trials that were mostly
        repeats) and re-proposed a finished architecture for 87% of its last 100 trials. NSGA-II's cost per
        trial stays flat.
        """
        if self.sampler != "auto":
            return self.sampler
        return "nsga2" if self.scored_by_supernet() and not self.inherited_finetune_steps else "tpe"

    #: The field that makes a search score its trials with a supernet, and how a message asks for it.
    SUPERNET_FIELD: ClassVar[tuple[str, str]] = ("supernet", "{1}")

    def scored_by_supernet(self) -> bool:
        return self.supernet is not None

    def trial_steps(self) -> int | None:
        """The steps each trial trains: ``inherited_finetune_steps`` in a supernet search (0: none), else
        ``train_steps`` (None: a ``train_seconds`` budget)."""
        return self.inherited_finetune_steps if self.scored_by_supernet() else self.train_steps

    def trial_seconds(self) -> float | None:
        """The seconds each trial trains: ``train_seconds`` in a standalone search; None in a supernet search
        (its fine-tune counts steps, and the pipeline's section keeps standalone mode's budget)."""
        return None if self.scored_by_supernet() else self.train_seconds

    def check_no_training_budget(self) -> None:
        """A search scored by a supernet trains no candidate from new weights, so a budget for that training
        would go unused without a word: it is refused, naming the option that trains from inherited weights."""
        for name in ("train_steps", "train_seconds"):
            if getattr(self, name) is not None:
                raise SettingError((name, self.SUPERNET_FIELD[0], "inherited_finetune_steps"),
                                   "{0} trains each candidate from new weights, and a search with "
                                   + self.SUPERNET_FIELD[1] + " trains none: give {2} to train each from its "
                                   "inherited weights")  # fmt: skip

    def rules(self) -> None:
        if self.pruner is None:
            self.pruner = "hyperband" if self.objective == "accuracy" else "none"
        if self.objective == "accuracy" and self.max_latency_ms is None:
            raise SettingError(("objective", "max_latency_ms"),
                               "{0} 'accuracy' searches under a latency budget: give {1}")  # fmt: skip
        if self.objective == "both" and self.pruner != "none":
            raise SettingError(("pruner", "objective"),
                               f"{{0}} {self.pruner!r} needs {{1}} 'accuracy' (Optuna prunes single-objective "
                               "studies only)")  # fmt: skip
        if self.inherited_finetune_steps and not self.scored_by_supernet():
            raise SettingError(("inherited_finetune_steps", self.SUPERNET_FIELD[0]),
                               "{0} fine-tunes the weights a supernet gives each candidate: give "
                               + self.SUPERNET_FIELD[1])  # fmt: skip
        if self.scored_by_supernet():
            self.check_no_training_budget()
        if self.train_steps is not None and self.train_seconds is not None:
            raise SettingError(("train_steps", "train_seconds"), "give {0} or {1}, not both")
        if self.train_steps is None and self.train_seconds is None and not self.scored_by_supernet():
            self.train_steps = DEFAULT_TRAIN_STEPS  # (not in a supernet search: it would then be a budget given)
        if self.pruner == "median" and self.trial_steps() is None:
            raise SettingError(
                ("pruner", "train_steps"), "{0} 'median' compares trials at equal training steps: give {1}"
            )
        if self.latency_predictor is not None and self.latency_mode != "forward":
            raise SettingError(("latency_predictor", "latency_mode"),
                               f"{{0}} models forward latency; {{1}} {self.latency_mode!r} is measured")  # fmt: skip
        if self.context is not None and self.latency_mode != "decode":
            raise SettingError(("context", "latency_mode"), "{0} is the state's length of a decode step: give {1} "
                               "'decode'")  # fmt: skip
        if self.grace_period is not None and self.grace_period <= self.heartbeat_interval:
            raise SettingError(
                ("grace_period", "heartbeat_interval"),
                f"{{0}} ({self.grace_period} s) must exceed {{1}} ({self.heartbeat_interval} s)",
            )


@dataclass
class PickSettings(Settings):
    """Which trial ``pick`` takes: the best feasible one (by what the search ranks by) within both budgets."""

    max_latency_ms: float | None = option(None, "latency budget in ms (null: no limit)", gt=0)
    min_speedup: float | None = option(
        None, "at least this many times faster than the reference Transformer of the study (e.g. 3)", gt=0
    )
