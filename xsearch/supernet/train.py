"""Training a supernet: each step trains one subnet drawn uniformly from the space (as HAT does), with
checkpoints that a killed run resumes from exactly (same draws, same batches, same optimizer state)."""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from xsearch.errors import XSearchError
from xsearch.supernet.settings import SupernetTrainSettings

log = logging.getLogger("xsearch.supernet")

STATE_FILE = "training.json"
CHECKPOINT_FILE = "checkpoint.safetensors"


def draw_subnet(space, task_fields: dict[str, Any], seed: int, step: int):
    """The subnet step ``step`` trains (a function of the seed and the step alone, so a resumed run draws the same)."""
    from xsearch.search_spaces import RandomDraw

    return space.suggest(RandomDraw(random.Random(seed * 1_000_003 + step)), task_fields)


def _groups(sn):
    decay, no_decay = [], []
    for name, p in sn.weights.items():
        (no_decay if p.dim() < 2 or name.endswith("__bias") else decay).append(p)
    return decay, no_decay


def _save_checkpoint(sn, opt, out: Path, state: dict[str, Any]) -> None:
    """One file, written under a temporary name and renamed: the supernet's tensors, the optimizer's state and
    the training state (in its metadata), so a kill at any moment leaves the last whole checkpoint. Then the
    supernet as ``load_supernet`` reads it, and ``training.json`` for people (neither is read to resume)."""
    import safetensors.torch

    from xsearch.serialization import atomic_write_text
    from xsearch.supernet.io import save_supernet

    names = {id(p): key for key, p in sn.weights.items()}
    tensors = {f"weights/{name}": sn.tensor(name).detach().contiguous() for name in sn.shapes}
    for p, st in opt.state.items():
        for field, value in st.items():
            tensors[f"{field}/{names[id(p)]}"] = value.detach().contiguous()
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{CHECKPOINT_FILE}.tmp-{os.getpid()}"
    safetensors.torch.save_file(tensors, str(tmp), metadata={"state": json.dumps(state, sort_keys=True)})
    os.replace(tmp, out / CHECKPOINT_FILE)
    save_supernet(sn, out, extra={"trained": state})
    atomic_write_text(out / STATE_FILE, json.dumps(state, indent=2, sort_keys=True))


def _read_checkpoint(out: Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(training state, tensors) of the checkpoint in ``out``, or None when there is none."""
    import safetensors
    import safetensors.torch

    path = out / CHECKPOINT_FILE
    if not path.is_file():
        return None
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            state = json.loads(f.metadata()["state"])
        return state, safetensors.torch.load_file(str(path))
    except Exception as e:  # safetensors raises several types for a corrupt file
        raise XSearchError(f"cannot read the supernet checkpoint {path}: {e}; remove it to start over") from None


def _restore(sn, opt, tensors: dict[str, Any]) -> None:
    import torch

    with torch.no_grad():
        for name in sn.shapes:
            sn.tensor(name).copy_(tensors[f"weights/{name}"])
    for key, p in sn.weights.items():
        st = {f: tensors[f"{f}/{key}"] for f in ("step", "exp_avg", "exp_avg_sq") if f"{f}/{key}" in tensors}
        if st:
            opt.state[p] = st


def train_supernet(sn, task, settings: SupernetTrainSettings, *, out: str | os.PathLike | None = None,
                   progress: bool | None = None) -> dict[str, Any]:  # fmt: skip
    """Train ``sn`` on ``task``: each step one subnet drawn uniformly (``draw_subnet``), AdamW with warmup and
    cosine decay, gradient clipping. With ``out``, checkpoints go there every ``checkpoint_every`` steps and at
    the end, and a run that finds a checkpoint of the same settings there resumes from it.

    Returns:
        The training record: steps, seconds, final loss, the reference subnet's validation metric.
    """
    import torch

    from xsearch.training.loop import TrainingDiverged, endless_batches, evaluate, lr_factor, progress_bar, task_loss

    out = Path(out) if out is not None else None
    decay, no_decay = _groups(sn)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=settings.lr)  # fmt: skip
    recipe = settings.to_dict()
    step, elapsed_before, window = 0, 0.0, []
    found = _read_checkpoint(out) if out is not None else None
    if found is not None:
        from xsearch.supernet.io import check_matches

        state, tensors = found
        check_matches(state["space"], state["task_fields"], sn.space, sn.task_fields, where=str(out))
        if state.get("settings") != recipe:
            raise XSearchError(f"{out} holds a supernet trained with other settings ({state.get('settings')}); "
                               "choose a new --out or the same settings")  # fmt: skip
        _restore(sn, opt, tensors)
        step, elapsed_before, window = state["steps"], state["seconds"], state.get("loss_window", [])
        log.info("resuming supernet training at step %d", step)
    fields = sn.task_fields
    batches = endless_batches(task, settings.batch_size, settings.seed)
    for _ in range(step):  # the batches the steps before the checkpoint used
        next(batches)
    show = sys.stderr.isatty() if progress is None else progress
    bar = progress_bar(show, settings.steps, settings.seconds)
    start = time.perf_counter() - elapsed_before
    reference = sn.space.reference_config(fields)

    def state_now(done: bool) -> dict[str, Any]:
        return {"settings": recipe, "steps": step, "seconds": round(time.perf_counter() - start, 2),
                "loss_window": window, "done": done, "task": task.describe(), "space": sn.space.to_yaml(),
                "task_fields": sn.task_fields}  # fmt: skip

    sn.train()
    with bar or nullcontext():
        job = bar.add_task("supernet", total=settings.steps or settings.seconds) if bar else None
        while True:
            elapsed = time.perf_counter() - start
            if (settings.steps is not None and step >= settings.steps) or (
                settings.seconds is not None and elapsed >= settings.seconds
            ):
                break
            frac = step / settings.steps if settings.steps else elapsed / settings.seconds
            for group in opt.param_groups:
                group["lr"] = settings.lr * lr_factor(frac, settings.warmup)
            subnet = draw_subnet(sn.space, fields, settings.seed, step)
            ids, mask, labels = next(batches)
            torch.manual_seed(settings.seed * 1_000_003 + step)  # dropout, and any variant's own draws
            loss = task_loss(sn.bind(subnet), ids, mask, labels)
            if not torch.isfinite(loss):
                raise TrainingDiverged(f"supernet training diverged: the loss became {loss.item()} at step {step}; "
                                       "lower the learning rate")  # fmt: skip
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if settings.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(list(sn.weights.values()), settings.grad_clip)
            opt.step()
            step += 1
            window = [*window, loss.item()][-50:]
            if bar:
                done = step if settings.steps else min(time.perf_counter() - start, settings.seconds)
                bar.update(job, completed=done, description=f"supernet loss {sum(window) / len(window):.3f}")
            if out is not None and step % settings.checkpoint_every == 0:
                _save_checkpoint(sn, opt, out, state_now(False))
    sn.eval()
    record = state_now(True)
    record["final_loss"] = sum(window) / len(window) if window else float("nan")
    record["reference_valid"] = evaluate(sn.bind(reference), task, "valid")
    if out is not None:
        _save_checkpoint(sn, opt, out, record)
    return record
