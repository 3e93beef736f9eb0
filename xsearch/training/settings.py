"""``TrainSettings``: every option of a training run, defined once (``xsearch train``'s flags and the
pipeline's ``train:`` section are built from it). No torch import."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from xsearch.errors import SettingError
from xsearch.settings import Settings, option, same_as


class DeviceNames:
    """Where a model trains: ``cpu``, ``cuda`` (torch's current GPU) or ``cuda:N`` (GPU N of several).

    A ``choices`` container: ``in`` accepts any ``cuda:N``; iterating shows the three forms (``--help``,
    errors). ``xsearch.training.device`` checks that the device is there."""

    shown = ("cpu", "cuda", "cuda:N")

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and (value in ("cpu", "cuda") or re.fullmatch(r"cuda:\d+", value) is not None)

    def __iter__(self) -> Iterator[str]:
        return iter(self.shown)


DEVICES = DeviceNames()


@dataclass
class TrainSettings(Settings):
    """A training budget and recipe: exactly one of ``steps`` and ``seconds``."""

    #: Options of which at most one may be given; giving one drops the others' defaults.
    ALTERNATIVES: ClassVar[tuple[tuple[str, ...], ...]] = (("steps", "seconds"),)

    steps: int | None = option(None, "optimizer steps (a budget anyone can reproduce)", gt=0)
    seconds: float | None = option(None, "a wall-clock budget instead of steps (depends on the machine's load)", gt=0)
    batch_size: int = option(32, "examples per step", ge=1)
    lr: float = option(1e-3, "peak learning rate (AdamW)", gt=0)
    warmup: float = option(0.1, "linear warmup, as a fraction of the budget", ge=0, lt=1)
    weight_decay: float = option(0.01, "AdamW weight decay (not on biases and norms)", ge=0)
    grad_clip: float = option(1.0, "largest gradient norm (0: no clipping)", ge=0)
    seed: int = option(0, "seeds the initial weights, the batch order and dropout")
    keep_best: bool = option(False, "end with the weights of the lowest validation loss (a small model can overfit)")
    eval_every: int | None = option(None, "validate every this many steps (default: 4 times a run)", gt=0)
    label_smoothing: float = option(0.0, "smoothing of the targets of the loss (0: off)", ge=0, lt=1)
    ema: float = option(0.0, "decay of a moving average of the weights, validated and kept (0: off; e.g. 0.99)",
                        ge=0, lt=1)  # fmt: skip
    device: str = option("cpu", "where to train: cpu, cuda or cuda:N (a CUDA GPU torch sees; no fallback to the CPU)",
                         choices=DEVICES)  # fmt: skip

    def rules(self) -> None:
        if self.steps is not None and self.seconds is not None:
            raise SettingError(("steps", "seconds"), "give {0} or {1}, not both")
        if self.steps is None and self.seconds is None:
            raise SettingError(("steps", "seconds"), "give {0} or {1}")

    def loop_options(self) -> dict[str, Any]:
        """The keyword arguments of ``xsearch.train`` (everything but the seed of the initial weights)."""
        return {"steps": self.steps, "seconds": self.seconds, "batch_size": self.batch_size, "lr": self.lr,
                "warmup": self.warmup, "weight_decay": self.weight_decay, "grad_clip": self.grad_clip,
                "seed": self.seed, "keep_best": self.keep_best, "eval_every": self.eval_every,
                "label_smoothing": self.label_smoothing, "ema": self.ema, "device": self.device}  # fmt: skip


@dataclass
class PretrainSettings(Settings):
    """A self-pretraining budget and recipe (masked-token denoising on the task's own train inputs)."""

    ALTERNATIVES: ClassVar[tuple[tuple[str, ...], ...]] = (("steps", "seconds"),)

    steps: int | None = same_as(TrainSettings, "steps")
    seconds: float | None = same_as(TrainSettings, "seconds")
    batch_size: int = same_as(TrainSettings, "batch_size")
    lr: float = same_as(TrainSettings, "lr")
    warmup: float = same_as(TrainSettings, "warmup")
    weight_decay: float = same_as(TrainSettings, "weight_decay")
    grad_clip: float = same_as(TrainSettings, "grad_clip")
    seed: int = same_as(TrainSettings, "seed", help="seeds the initial weights, the batch order and the masking")
    mask_fraction: float = option(0.15, "share of each input's tokens to corrupt and predict (BERT's 80/10/10 "
                                  "rule: masked, random, kept)", gt=0, lt=1)  # fmt: skip
    checkpoint_every: int = option(200, "steps between checkpoints (a killed run resumes from the last)", ge=1)
    device: str = same_as(TrainSettings, "device", help="where to pretrain: cpu, cuda or cuda:N (a CUDA GPU "
                          "torch sees; no fallback to the CPU; the masking is drawn on the CPU, the same on any "
                          "device)")  # fmt: skip

    rules = TrainSettings.rules  # exactly one budget
