"""Self-pretraining: masked-token denoising on a task's own train inputs, no labels ("Never Train From Scratch",
Amos et al. 2023), and fine-tuning from it with a new head.

A classification task's model learns to restore corrupted tokens: a share ``mask_fraction`` of each input's real
tokens is chosen, and (BERT's rule) 80% of them become the mask symbol, 10% a random token and 10% stay; a
``DenoisingHead`` on the final hidden states predicts the chosen tokens. The mask symbol is the padding id, whose
embedding is zero: at a real position (the mask says the token is there) it means "unknown". The ``lm`` task is
its own pretraining: its objective is the next token, and its head is kept.

``pretrain`` checkpoints into its output folder every ``checkpoint_every`` steps (one file holding the model, the
denoising head, the optimizer's state and the training state), and a run that finds a checkpoint of the same
model and settings resumes from it exactly: each step's batch, masking and dropout depend only on the seed and
the step. The folder is a model folder (``load_model`` reads it; its head is untrained) with ``pretrain.json``
and ``denoiser.safetensors`` beside; ``init_from_pretrained`` (``xsearch train --init``) builds the task's model
from it with every weight but the head.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from xsearch.errors import XSearchError
from xsearch.settings import show_differences
from xsearch.tasks.encoding import PAD_ID
from xsearch.training.device import module_device, moved_to, on_device, resolve_device
from xsearch.training.settings import PretrainSettings

log = logging.getLogger("xsearch.pretrain")

FORMAT = "xsearch-pretrain/1"
PRETRAIN_FILE = "pretrain.json"
DENOISER_FILE = "denoiser.safetensors"
CHECKPOINT_FILE = "pretrain-checkpoint.safetensors"
MASK_ID = PAD_ID
IGNORE = -100
_EVAL_BATCHES = 8


class DenoisingHead(nn.Module):
    """Token logits ``(B, N, vocab)`` from final hidden states: what pretraining trains beside the model."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h)


def corrupt(
    ids: torch.Tensor, mask: torch.Tensor, fraction: float, vocab_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)``: ``ids`` with a share ``fraction`` of the real tokens of each row corrupted (at least
    one), and the original ids at those positions (``-100`` elsewhere, ignored by the loss)."""
    draw = torch.rand(ids.shape, generator=generator)
    chosen = (draw < fraction) & mask
    first = draw.masked_fill(~mask, 2.0).argmin(dim=1)  # every row predicts at least one token
    chosen[torch.arange(len(ids)), first] |= mask[torch.arange(len(ids)), first]
    how = torch.rand(ids.shape, generator=generator)
    random_ids = torch.randint(1, vocab_size, ids.shape, generator=generator)
    inputs = torch.where(chosen & (how < 0.8), torch.full_like(ids, MASK_ID), ids)
    inputs = torch.where(chosen & (how >= 0.8) & (how < 0.9), random_ids, inputs)
    return inputs, torch.where(chosen, ids, torch.full_like(ids, IGNORE))


def denoising_loss(model, head: DenoisingHead, ids, mask, fraction: float, generator, *, restored: bool = False):
    """Cross-entropy of restoring the corrupted tokens of one batch; with ``restored``, ``(loss, the share of
    them restored exactly)`` (validation's figure: the training steps do not pay for it)."""
    inputs, targets = corrupt(ids.cpu(), mask.cpu(), fraction, model.config.vocab_size, generator)  # (CPU draws)
    inputs, mask, targets = on_device((inputs, mask, targets), module_device(head))
    logits = head(model.hidden_states(inputs, mask))
    chosen = targets != IGNORE
    loss = F.cross_entropy(logits[chosen], targets[chosen])
    if not restored:
        return loss
    return loss, float((logits[chosen].argmax(-1) == targets[chosen]).float().mean())


def objective(task) -> str:
    """``"denoise"`` for a classification task, ``"lm"`` (its own next-token objective) for a language model."""
    return "lm" if task.kind == "lm" else "denoise"


@torch.no_grad()
def validation_loss(model, head: DenoisingHead | None, task, settings: PretrainSettings) -> dict[str, float]:
    """The pretraining objective on the valid split's inputs (the same masking every time)."""
    from xsearch.training.loop import task_loss

    was = model.training
    model.eval()
    g = torch.Generator().manual_seed(settings.seed + 7919)
    losses, accs = [], []
    for ids, mask, labels in task.batches("valid", max(settings.batch_size, 32), max_batches=_EVAL_BATCHES):
        if head is None:
            losses.append(float(task_loss(model, *on_device((ids, mask, labels), module_device(model)))))
        else:
            loss, acc = denoising_loss(model, head, ids, mask, settings.mask_fraction, g, restored=True)
            losses.append(float(loss))
            accs.append(acc)
    model.train(was)
    if not losses:
        raise XSearchError(f"split 'valid' of task {task.name!r} is empty")
    out = {"valid_loss": sum(losses) / len(losses)}
    if accs:
        out["valid_restored"] = sum(accs) / len(accs)
    return out


def _checkpoint_tensors(model, head, opt) -> dict[str, torch.Tensor]:
    """The model's, the head's and the optimizer's tensors under ``model/``, ``head/``, ``opt/<i>/``; copies,
    since a model with weight sharing holds one tensor under several names."""
    tensors = {f"model/{k}": v.clone() for k, v in model.state_dict().items()}
    if head is not None:
        tensors |= {f"head/{k}": v.clone() for k, v in head.state_dict().items()}
    for i, st in opt.state_dict()["state"].items():
        tensors |= {f"opt/{i}/{field}": v for field, v in st.items()}
    return tensors


def _save(model, head, opt, out: Path, state: dict[str, Any], task) -> None:
    """The model folder (so that the folder is ours from the first checkpoint on), the checkpoint (one file,
    renamed into place: what a resumed run reads), then the denoising head and the record for people."""
    import safetensors.torch

    from xsearch.serialization import atomic_write_text, save_model, write_checkpoint

    save_model(model, out, task=task.describe())
    write_checkpoint(out / CHECKPOINT_FILE, _checkpoint_tensors(model, head, opt), state)
    if head is not None:
        tmp = out / f".{DENOISER_FILE}.tmp-{os.getpid()}"
        safetensors.torch.save_model(head, str(tmp))
        os.replace(tmp, out / DENOISER_FILE)
    atomic_write_text(out / PRETRAIN_FILE, json.dumps(state, indent=2, sort_keys=True))


def _restore(model, head, opt, tensors: dict[str, torch.Tensor]) -> None:
    model.load_state_dict({k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")})
    if head is not None:
        head.load_state_dict({k[len("head/") :]: v for k, v in tensors.items() if k.startswith("head/")})
    sd = opt.state_dict()
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, v in tensors.items():
        if key.startswith("opt/"):
            _, i, field = key.split("/", 2)
            state.setdefault(int(i), {})[field] = v
    sd["state"] = state
    opt.load_state_dict(sd)


def pretrain(model, task, settings: PretrainSettings, *, out: str | os.PathLike | None = None,
             progress: bool | None = None) -> dict[str, Any]:  # fmt: skip
    """Pretrain ``model`` (an ``XSearchModel`` of ``task``) on the task's train inputs, without their labels.

    AdamW with warmup and cosine decay and gradient clipping (the recipe of ``train``). With ``out``, the run
    checkpoints there and resumes from a checkpoint of the same model and settings found there.

    Returns:
        The record also written to ``pretrain.json``: objective, steps, seconds, the validation loss before and
        after, and the history of validation points.

    Raises:
        XSearchError: ``out`` holds a pretraining of another model, task or settings (naming each difference).
        TrainingDiverged: the loss became NaN or infinite.
    """
    out = Path(out) if out is not None else None
    device = resolve_device(settings.device)
    kind = objective(task)
    torch.manual_seed(settings.seed)
    head = DenoisingHead(model.config.d_model, model.config.vocab_size) if kind == "denoise" else None
    with moved_to(model, device):  # pretrained there, handed back where it was (also when interrupted)
        if head is not None:
            head.to(device)
        return _pretrain_on(model, head, kind, task, settings, out, progress)


def _pretrain_on(model, head, kind: str, task, settings: PretrainSettings, out: Path | None,
                 progress: bool | None) -> dict[str, Any]:  # fmt: skip
    """``pretrain``'s steps, with the model (and the denoising head) on the training device."""
    from xsearch.serialization import read_checkpoint
    from xsearch.training.loop import resumed_steps, task_loss
    from xsearch.training.steps import adamw

    named = [*model.named_parameters(), *(head.named_parameters() if head is not None else ())]
    opt, params = adamw(named, lr=settings.lr, weight_decay=settings.weight_decay)
    recipe, config = settings.to_dict(), model.config.to_dict()
    recipe.pop("device")  # (not the recipe: a run may resume on another device)
    eval_every = max(settings.steps // 4, 1) if settings.steps else None
    step, elapsed_before, window, history = 0, 0.0, [], []
    found = read_checkpoint(out / CHECKPOINT_FILE, "pretraining checkpoint") if out is not None else None
    if found is not None:
        state, tensors = found
        trained_with = PretrainSettings.with_defaults(state.get("settings") or {})
        trained_with.pop("device")
        for what, held, now in (("of another model", state.get("config") or {}, config),
                                ("of another task", state.get("task") or {}, task.describe()),
                                ("with other settings", trained_with, recipe)):  # fmt: skip
            if shown := show_differences(held, now):
                raise XSearchError(f"{out} holds a pretraining {what} ({shown}); choose a new --out or "
                                   "the same command")  # fmt: skip
        _restore(model, head, opt, tensors)
        step, elapsed_before = state["steps"], state["seconds"]
        window, history = state["loss_window"], state["history"]
        log.info("resuming pretraining at step %d", step)
    else:
        history = [{"step": 0, **validation_loss(model, head, task, settings)}]
    batches, loop = resumed_steps(task, settings, opt, params, label="pretraining", progress=progress, step=step,
                                  seconds_before=elapsed_before, window=window)  # fmt: skip

    def state_now(done: bool) -> dict[str, Any]:
        return {"format": FORMAT, "objective": kind, "settings": recipe, "config": config, "task": task.describe(),
                "steps": loop.step, "seconds": round(loop.elapsed, 2), "loss_window": loop.window,
                "history": history, "done": done}  # fmt: skip

    model.train()
    with loop:
        for step in loop:
            ids, mask, labels = next(batches)
            torch.manual_seed(settings.seed * 1_000_003 + step)  # dropout
            if head is None:
                loss = task_loss(model, *on_device((ids, mask, labels), module_device(model)))
            else:
                g = torch.Generator().manual_seed(settings.seed * 1_000_003 + step)
                loss = denoising_loss(model, head, ids, mask, settings.mask_fraction, g)
            loop.update(loss)
            step = loop.step
            if eval_every and step % eval_every == 0 and step != settings.steps:
                history.append({"step": step, "loss": loop.mean_loss, **validation_loss(model, head, task, settings)})
            if out is not None and step % settings.checkpoint_every == 0 and step != settings.steps:
                _save(model, head, opt, out, state_now(False), task)
    if not history or history[-1]["step"] != loop.step:
        history.append({"step": loop.step, "loss": loop.mean_loss, **validation_loss(model, head, task, settings)})
    model.eval()
    record = state_now(True)
    record["final_loss"] = loop.mean_loss
    if out is not None:
        _save(model, head, opt, out, record, task)
    return record


def is_pretrained(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` is a folder ``pretrain`` wrote (so that fine-tuning from it takes a new head)."""
    try:
        doc = json.loads((Path(directory) / PRETRAIN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT


def init_from_pretrained(directory: str | os.PathLike, task, *, seed: int = 0):
    """The model ``task`` needs, built from the pretrained folder's architecture, holding every one of its weights
    but the head's (new weights from ``seed``); for the ``lm`` task, whose pretraining is its own objective, the
    head too.

    Raises:
        XSearchError: the folder is not a finished pretraining, or was pretrained for another vocabulary or length.
    """
    from xsearch.config import ModelConfig
    from xsearch.model import build_model
    from xsearch.serialization import load_model

    path = Path(directory)
    if not is_pretrained(path):
        raise XSearchError(f"{path} is not a folder of `xsearch pretrain` (no {PRETRAIN_FILE})")
    if not json.loads((path / PRETRAIN_FILE).read_text(encoding="utf-8")).get("done"):
        raise XSearchError(f"the pretraining in {path} did not finish; run its `xsearch pretrain` command again")
    pre = load_model(path)
    fields = task.model_fields()
    for key in ("vocab_size", "max_len"):
        if getattr(pre.config, key) != fields[key]:
            raise XSearchError(f"{path} was pretrained with {key}={getattr(pre.config, key)}, but task "
                               f"{task.name!r} needs {key}={fields[key]}")  # fmt: skip
    cfg = ModelConfig.from_dict({**pre.config.to_dict(), **fields})
    torch.manual_seed(seed)
    model = build_model(cfg)
    keep_head = task.kind == "lm" and pre.config.head == "lm"
    taken = {k: v for k, v in pre.state_dict().items() if keep_head or not k.startswith("head.")}
    missing, unexpected = model.load_state_dict(taken, strict=False)
    if unexpected or any(not k.startswith("head.") for k in missing):
        raise XSearchError(f"{path}: the pretrained weights do not fit the task's model "
                           f"(missing {missing[:3]}, unexpected {unexpected[:3]})")  # fmt: skip
    return model
