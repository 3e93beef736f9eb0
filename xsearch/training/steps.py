"""The optimizer-step loop that ``train``, ``pretrain`` and ``train_supernet`` share.

``StepLoop`` owns what every one of them does the same way: AdamW (``adamw``: no weight decay on biases
and norms), warmup and cosine decay over a step or seconds budget, the NaN/inf guard, gradient clipping,
the window of recent losses and the progress bar. It can start at a step a checkpoint recorded (with the
seconds spent before it and its loss window), so a resumed run continues the same schedule. What a step
computes, and what happens between steps (validation, checkpoints), stays with the caller::

    loop = StepLoop(opt, params, lr=..., warmup=0.1, grad_clip=1.0, steps=600, label="training")
    with loop:
        for step in loop:            # sets the step's learning rate; stops at the budget
            loss = ...               # the step's loss
            loop.update(loss)        # guard, backward, clip, optimizer step, window, bar
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import nullcontext

import torch

from xsearch.errors import XSearchError

WINDOW = 50  # losses the running mean (the bar's, the history's) is taken over


class TrainingDiverged(XSearchError, RuntimeError):
    """The loss became NaN or infinite (a learning rate too high for the model, most often)."""


def lr_factor(progress: float, warmup_frac: float) -> float:
    """The learning rate's multiplier at ``progress`` (0..1) of the budget: linear warmup, then cosine to 0.1."""
    if progress < warmup_frac:
        return max(progress / warmup_frac, 1e-3)
    rest = (progress - warmup_frac) / max(1.0 - warmup_frac, 1e-9)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(rest, 1.0)))


def adamw(named_parameters: Iterable[tuple[str, torch.nn.Parameter]], *, lr: float, weight_decay: float):
    """AdamW over the trainable parameters, with no weight decay on biases (``*.bias``) and 0-/1-D tensors (norms).

    Returns:
        ``(optimizer, parameters)``; the list is what gradient clipping clips.
    """
    decay, no_decay = [], []
    for name, p in named_parameters:
        if p.requires_grad:
            (no_decay if p.dim() < 2 or name.endswith(".bias") else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
    )
    return opt, decay + no_decay


def progress_bar(show: bool, steps, seconds):
    """A transient rich progress bar counting steps (or seconds), or None when not ``show``."""
    if not show:
        return None
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f}" + (" steps" if steps else " s")),
        TimeRemainingColumn(),
        transient=True,
    )


class StepLoop:
    """Iterate over the steps of a budget, and take each one (see the module docstring).

    Args:
        opt: the optimizer; each step sets its groups' ``lr`` to ``lr`` times ``lr_factor``.
        params: the parameters whose gradient norm is clipped to ``grad_clip`` (0: no clipping).
        warmup: the warmup's share of the budget.
        steps, seconds: the budget (one of them).
        label: what the bar and a divergence error call the run ("training", "pretraining", ...).
        progress: show a progress bar (None: when stderr is a terminal).
        step, seconds_before, window: where a resumed run starts (a checkpoint's step, the seconds spent
            before it, its loss window).
    """

    def __init__(self, opt, params, *, lr: float, warmup: float, grad_clip: float, steps: int | None,
                 seconds: float | None = None, label: str = "training", progress: bool | None = None,
                 step: int = 0, seconds_before: float = 0.0, window: list[float] | None = None) -> None:  # fmt: skip
        if steps is None and seconds is None:
            raise XSearchError("a step loop needs a budget: steps or seconds")
        self.opt, self.params, self.lr, self.warmup, self.grad_clip = opt, list(params), lr, warmup, grad_clip
        self.steps, self.seconds, self.label = steps, seconds, label
        self.step = step
        self.window = list(window or [])
        self.start = time.perf_counter() - seconds_before
        show = sys.stderr.isatty() if progress is None else progress
        self._bar = progress_bar(show, steps, seconds)
        self._job = None
        self._stack = None

    # -- the budget ------------------------------------------------------------------------------
    @property
    def elapsed(self) -> float:
        """Seconds spent, those before a resume included."""
        return time.perf_counter() - self.start

    def done(self) -> bool:
        """Whether the budget is spent (the steps, or the seconds, whichever is given and reached first)."""
        return (self.steps is not None and self.step >= self.steps) or (
            self.seconds is not None and self.elapsed >= self.seconds
        )

    @property
    def mean_loss(self) -> float:
        """Mean of the last ``WINDOW`` losses (NaN before the first step)."""
        return sum(self.window) / len(self.window) if self.window else float("nan")

    # -- the loop --------------------------------------------------------------------------------
    def __enter__(self) -> StepLoop:
        self._stack = self._bar or nullcontext()
        self._stack.__enter__()
        if self._bar:
            self._job = self._bar.add_task(self.label, total=self.steps or self.seconds)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.__exit__(*exc)

    def __iter__(self) -> Iterator[int]:
        while not self.done():
            frac = self.step / self.steps if self.steps is not None else self.elapsed / self.seconds
            for group in self.opt.param_groups:
                group["lr"] = self.lr * lr_factor(frac, self.warmup)
            yield self.step

    def update(self, loss: torch.Tensor) -> None:
        """Take the step: refuse a NaN/inf loss, backward, clip, optimizer step; then the window and the bar.

        Raises:
            TrainingDiverged: the loss is NaN or infinite.
        """
        if not torch.isfinite(loss):
            raise TrainingDiverged(f"{self.label} diverged: the loss became {loss.item()} at step {self.step} (lr "
                                   f"{self.opt.param_groups[0]['lr']:.2e}); lower the learning rate")  # fmt: skip
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.opt.step()
        self.step += 1
        self.window = [*self.window, loss.item()][-WINDOW:]
        if self._bar:
            done = self.step if self.steps else min(self.elapsed, self.seconds)
            self._bar.update(self._job, completed=done, description=f"{self.label} loss {self.mean_loss:.3f}")
