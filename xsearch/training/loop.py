"""Training and evaluation: AdamW, warmup + cosine decay, clipping, validation, progress."""

from __future__ import annotations

import functools
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from xsearch.errors import XSearchError
from xsearch.training.device import module_device, moved_to, on_device, resolve_device
from xsearch.training.steps import StepLoop, TrainingDiverged, adamw  # noqa: F401 (TrainingDiverged: a name of this module)

EVAL_BATCH = 32  # examples per scoring batch (64 was 1.4x slower per example at 512 tokens on 2 cores)

log = logging.getLogger("xsearch.train")


@dataclass
class TrainResult:
    """What a training run did.

    Attributes:
        steps: optimizer steps taken.
        seconds: wall time spent.
        final_loss: mean training loss over the last logging window.
        valid_metric: last validation metric (accuracy, or bits per byte for lm), if validated.
        history: one dict per validation/log point: step, loss, lr, and valid when measured.
        best_step: with ``keep_best``, the step whose weights the model was left with.
    """

    steps: int
    seconds: float
    final_loss: float
    valid_metric: float | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    best_step: int | None = None


LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def task_loss(
    model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Cross-entropy of ``model`` on one batch (per class, or per next token over real positions)."""
    return logits_loss(model(ids, mask), mask, labels, label_smoothing)


def logits_loss(logits: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0):
    """Cross-entropy of a batch's logits: ``(B, C)`` per class, or ``(B, N, V)`` per next token over real positions."""
    if logits.dim() == 3:  # lm: (B, N, V)
        return F.cross_entropy(logits[mask], labels[mask], label_smoothing=label_smoothing)
    return F.cross_entropy(logits, labels, label_smoothing=label_smoothing)


class WeightAverage:
    """An exponential moving average of a model's floating-point weights (and its buffers, copied), kept in a
    copy of the model: ``update()`` after each optimizer step; ``module`` is what is validated and kept."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        import copy

        self.decay = decay
        self.model = model
        self.module = copy.deepcopy(model)
        self.module.requires_grad_(False)
        self._pairs = [(a, p) for a, p in zip(self.module.parameters(), model.parameters(), strict=True)]

    @torch.no_grad()
    def update(self) -> None:
        avg, live = [a for a, _ in self._pairs], [p.detach() for _, p in self._pairs]
        torch._foreach_lerp_(avg, live, 1.0 - self.decay)
        for a, b in zip(self.module.buffers(), self.model.buffers(), strict=True):
            a.copy_(b)


def train(
    model: nn.Module,
    task,
    *,
    steps: int | None = None,
    seconds: float | None = None,
    batch_size: int = 32,
    lr: float = 1e-3,
    warmup: int | float | None = None,
    weight_decay: float = 0.01,
    grad_clip: float = 1.0,
    seed: int = 0,
    eval_every: int | None = None,
    eval_batches: int | None = 8,
    progress: bool | None = None,
    loss_fn: LossFn | None = None,
    callback: Callable[[int, dict[str, Any]], None] | None = None,
    keep_best: bool = False,
    label_smoothing: float = 0.0,
    ema: float = 0.0,
    device: str | None = None,
) -> TrainResult:
    """Train ``model`` on ``task``'s train split.

    Args:
        model: an ``XSearchModel`` (or any module with the same forward).
        task: a ``Task``.
        steps: optimizer steps; or
        seconds: a wall-clock budget (the schedule follows elapsed time). At least one is needed.
        batch_size: examples per step.
        lr: peak learning rate (AdamW).
        warmup: warmup steps (int) or fraction of the budget (float); default 10%.
        weight_decay: AdamW weight decay (not applied to biases and norms).
        grad_clip: max gradient norm (0 = off).
        seed: seeds batch order and dropout.
        eval_every: validate every this many steps (default: 4 times per run when ``steps``).
        eval_batches: validation batches each time (None = the whole split).
        progress: show a progress bar (default: when stderr is a terminal).
        loss_fn: ``(model, ids, mask, labels) -> loss``; default cross-entropy (distillation
            passes its own).
        callback: called as ``callback(step, record)`` at each validation point.
        keep_best: leave the model with the weights of its validation point of lowest loss (early
            stopping's checkpoint choice: a small model trained for many steps can overfit a small train
            split); ``valid_metric`` is then that point's metric.
        label_smoothing: of the default loss's targets (0 = off; not applied to a ``loss_fn`` of one's own).
        ema: decay of an exponential moving average of the weights (0 = off); when on, the averaged weights
            are the ones validated and the ones the model ends with.
        device: train there (``"cpu"`` or ``"cuda"``; default: where the model is); the model comes back to the
            device it came from.

    Returns:
        A ``TrainResult``.

    Raises:
        TrainingDiverged: the loss became NaN or infinite.
    """
    if steps is None and seconds is None:
        raise XSearchError("train needs steps= or seconds=")
    if steps is not None and steps <= 0:
        raise XSearchError(f"steps must be > 0, got {steps}")
    if seconds is not None and seconds <= 0:
        raise XSearchError(f"seconds must be > 0, got {seconds}")
    if not 0.0 <= ema < 1.0:
        raise XSearchError(f"ema must be in [0, 1), got {ema}")
    run_on = resolve_device(device) if device is not None else module_device(model)
    if loss_fn is None:
        loss_fn = task_loss if not label_smoothing else functools.partial(task_loss, label_smoothing=label_smoothing)
    torch.manual_seed(seed)
    with moved_to(model, run_on):  # trained there, handed back where it was (also when interrupted)
        opt, params = adamw(model.named_parameters(), lr=lr, weight_decay=weight_decay)
        if not params:
            raise XSearchError("the model has no trainable parameters")
        if warmup is None:
            warmup_frac = 0.1
        elif isinstance(warmup, float):
            warmup_frac = warmup
        else:
            warmup_frac = warmup / steps if steps else 0.1
        if eval_every is None and steps is not None:
            eval_every = max(steps // 4, 1)
        show = sys.stderr.isatty() if progress is None else progress

        model.train()
        average = WeightAverage(model, ema) if ema else None
        scored = average.module if average else model  # what is validated and kept
        best = _Best(scored, keep_best)
        batches = endless_batches(task, batch_size, seed)
        result = TrainResult(0, 0.0, float("nan"))
        loop = StepLoop(opt, params, lr=lr, warmup=warmup_frac, grad_clip=grad_clip, steps=steps, seconds=seconds,
                        label="training", progress=show)  # fmt: skip
        last_eval_time = loop.start
        with loop:
            for step in loop:
                ids, mask, labels = on_device(next(batches), run_on)
                loop.update(loss_fn(model, ids, mask, labels))
                if average:
                    average.update()
                step = loop.step
                due = (eval_every and step % eval_every == 0) or (
                    eval_every is None and time.perf_counter() - last_eval_time > max(seconds / 4, 1.0)
                )
                if due:
                    last_eval_time = time.perf_counter()
                    rec = _record(scored, task, step, loop.window, opt, eval_batches, batch_size)
                    result.history.append(rec)
                    result.valid_metric = rec["valid"]
                    log.log(logging.INFO if show else logging.DEBUG, "step %d loss %.4f valid %.4f", step, rec["loss"],
                            rec["valid"])  # fmt: skip
                    best.offer(rec)
                    if callback:
                        callback(step, rec)
        step, window = loop.step, loop.window
        if not result.history or result.history[-1]["step"] != step:
            rec = _record(scored, task, step, window, opt, eval_batches, batch_size)
            result.history.append(rec)
            result.valid_metric = rec["valid"]
            best.offer(rec)
        if average:
            model.load_state_dict(average.module.state_dict())
        if keep_best and best.state is not None:
            model.load_state_dict(best.state)
            result.best_step, result.valid_metric = best.record["step"], best.record["valid"]
        model.eval()
    result.steps = step
    result.seconds = loop.elapsed
    result.final_loss = sum(window) / len(window) if window else float("nan")
    return result


class _Best:
    """The weights at the validation point of lowest loss so far (kept only when asked).

    The loss, not the accuracy: on a plateau the accuracies of several points tie (ListOps' early points
    sit at the outermost operator's level), and the first of them, the least trained, would be kept. The
    cross-entropy still orders them, and it is what a search ranks by (``rank_by`` "loss"). For ``lm`` the
    loss is the bits per byte's own order.
    """

    def __init__(self, model: nn.Module, keep: bool) -> None:
        self.model, self.keep = model, keep
        self.state: dict[str, torch.Tensor] | None = None
        self.record: dict[str, Any] | None = None

    def offer(self, rec: dict[str, Any]) -> None:
        if not self.keep or not math.isfinite(rec["valid_loss"]):
            return
        if self.record is None or rec["valid_loss"] < self.record["valid_loss"]:
            self.state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            self.record = rec


def _record(model, task, step, window, opt, eval_batches, batch_size) -> dict[str, Any]:
    """A validation point: the step, the training loss over the window, the lr, and the validation metric
    (``valid``) and cross-entropy (``valid_loss``)."""
    valid = evaluate_score(model, task, "valid", batch_size=max(batch_size, 32), max_batches=eval_batches)
    model.train()
    loss = sum(window) / len(window) if window else float("nan")
    return {"step": step, "loss": loss, "lr": opt.param_groups[0]["lr"], "valid": valid.metric,
            "valid_loss": valid.loss}  # fmt: skip


def endless_batches(task, batch_size: int, seed: int, *, skip: int = 0):
    """Training batches forever: reshuffled epochs (classify) or random windows (lm).

    ``skip`` passes over the first batches without building them: a run resumed at step ``skip`` goes on with
    the batches an uninterrupted run would have drawn next."""
    epoch = 0
    if task.kind == "classify":
        per_epoch = math.ceil(task.size("train") / batch_size)
        if not per_epoch:
            raise XSearchError("the train split is empty")
        epoch, skip = divmod(skip, per_epoch)
    while True:
        yield from task.batches("train", batch_size, shuffle=True, seed=seed + epoch, skip=skip)
        skip = 0
        epoch += 1


@dataclass(frozen=True)
class Score:
    """A model's scores on one split.

    Attributes:
        metric: the task metric: accuracy (classify), or bits per byte (lm).
        loss: the mean cross-entropy in nats, per example (classify) or per next token (lm). It still tells
            apart models whose predictions, and so whose accuracies, are the same (HAT ranks its
            SubTransformers by loss; ``bench/supernet.md`` measures it ranking short trainings better).
    """

    metric: float
    loss: float


@torch.no_grad()
def evaluate(
    model: nn.Module, task, split: str = "test", *, batch_size: int = EVAL_BATCH, max_batches: int | None = None
) -> float:
    """Accuracy (classify) or bits per byte (lm) of ``model`` on ``split``, computed where the model is."""
    return evaluate_score(model, task, split, batch_size=batch_size, max_batches=max_batches).metric


@torch.no_grad()
def evaluate_score(
    model: nn.Module, task, split: str = "test", *, batch_size: int = EVAL_BATCH, max_batches: int | None = None
) -> Score:
    """The task metric and the cross-entropy of ``model`` on ``split`` (a :class:`Score`), from one pass."""
    was_training = model.training
    model.eval()
    where = module_device(model)

    def logits(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return model(*on_device((ids, mask), where)).cpu()

    try:
        return score_split(logits, task, split, batch_size=batch_size, max_batches=max_batches)
    finally:
        model.train(was_training)


def evaluate_onnx(
    path, task, split: str = "test", *, batch_size: int = EVAL_BATCH, threads: int | None = None
) -> float:
    """The same metric as :func:`evaluate`, computed from an ONNX model through onnxruntime."""
    from xsearch.export import Predictor

    predictor = Predictor(path, threads=threads)

    def logits(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(predictor.logits(ids.numpy(), mask.numpy()))

    return score_logits(logits, task, split, batch_size=batch_size)


def score_logits(
    logits_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    task,
    split: str,
    *,
    batch_size: int = EVAL_BATCH,
    max_batches: int | None = None,
) -> float:
    """Accuracy or bits per byte of ``logits_fn(ids, mask)`` over the batches of ``split``."""
    return score_split(logits_fn, task, split, batch_size=batch_size, max_batches=max_batches).metric


@torch.no_grad()
def score_split(
    logits_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    task,
    split: str,
    *,
    batch_size: int = EVAL_BATCH,
    max_batches: int | None = None,
) -> Score:
    """The :class:`Score` of ``logits_fn(ids, mask)`` over the batches of ``split``.

    Classification examples are batched shortest first (the scores do not depend on their order,
    and batches that pad least cost least: 2.2x fewer seconds at 512 tokens, batch 32).
    """
    correct = total = 0
    nll = 0.0
    for ids, mask, labels in task.batches(split, batch_size, max_batches=max_batches, by_length=True):
        logits = logits_fn(ids, mask).float()
        if task.kind == "lm":
            nll += F.cross_entropy(logits[mask], labels[mask], reduction="sum").item()
            total += int(mask.sum())
        else:
            nll += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += int((logits.argmax(-1) == labels).sum())
            total += len(labels)
    if total == 0:
        raise XSearchError(f"split {split!r} of task {task.name!r} is empty")
    loss = nll / total
    return Score(metric=loss / math.log(2) if task.kind == "lm" else correct / total, loss=loss)


def resumed_steps(
    task,
    settings,
    opt,
    params,
    *,
    label: str,
    progress,
    step: int = 0,
    seconds_before: float = 0.0,
    window: list[float] | None = None,
) -> tuple[Iterator, StepLoop]:
    """The training batches and the step loop of a run at ``step`` (0, or where its checkpoint left it).

    ``settings`` carries the recipe's ``batch_size``, ``seed``, ``lr``, ``warmup``, ``grad_clip``, ``steps`` and
    ``seconds``; the batches go on where an uninterrupted run would be."""
    batches = endless_batches(task, settings.batch_size, settings.seed, skip=step)
    loop = StepLoop(opt, params, lr=settings.lr, warmup=settings.warmup, grad_clip=settings.grad_clip,
                    steps=settings.steps, seconds=settings.seconds, label=label, progress=progress, step=step,
                    seconds_before=seconds_before, window=window)  # fmt: skip
    return batches, loop
