"""Training a supernet: each step trains one subnet drawn uniformly from the space (as HAT does), or, with the
sandwich rule (BigNAS), the largest subnet on the labels and the smallest and a few uniform draws distilled from
it in place, or, with progressive shrinking (once-for-all), one subnet drawn from the top of each size range,
the ranges let down over the run; with checkpoints that a killed run resumes from exactly (same draws, same
batches, same optimizer state)."""

from __future__ import annotations

import json
import logging
import os
import random
from pathlib import Path
from typing import Any

from xsearch.config import describe_config
from xsearch.errors import XSearchError
from xsearch.settings import show_differences
from xsearch.supernet.settings import SupernetTrainSettings

log = logging.getLogger("xsearch.supernet")

STATE_FILE = "training.json"
CHECKPOINT_FILE = "checkpoint.safetensors"


def draw_subnets(space, task_fields: dict[str, Any], seed: int, step: int, sampling: str = "uniform",
                 n_random: int = 2, *, steps: int | None = None, shrink_fraction: float = 0.5) -> list:  # fmt: skip
    """The subnets step ``step`` trains, a function of the seed and the step alone (a resumed run draws the same).

    ``uniform``: one subnet drawn uniformly. ``sandwich``: the largest subnet first (every number of the space
    at its top, the reference's attention and weight sharing), then the smallest (every number at its bottom,
    the attention drawn) and ``n_random`` uniform draws. ``progressive`` (once-for-all's progressive
    shrinking; needs the run's ``steps``): one subnet drawn from the top of each size range, the range let
    down linearly from its top alone at step 0 to all of it at ``shrink_fraction * steps`` (uniform from then
    on); the reference's weight sharing is taken with the probability of the range still shut. The attention
    is always drawn uniformly: sharing across the variants slows a subnet's training less than sharing across
    the widths does (bench/supernet.md, the one-subnet table).
    """
    from xsearch.search_spaces import BoundaryDraw, RandomDraw, ShrinkingDraw

    rng = random.Random(seed * 1_000_003 + step)
    if sampling == "uniform":
        return [space.suggest(RandomDraw(rng), task_fields)]
    if sampling == "progressive":
        if not steps or steps < 1:
            raise ValueError(f"progressive sampling needs the run's steps (a positive number), got {steps!r}")
        reach = min(1.0, step / (shrink_fraction * steps))
        prefer = {"weight_sharing": space.reference.get("weight_sharing", "none")}
        return [space.suggest(ShrinkingDraw(rng, reach, prefer), task_fields)]
    if sampling != "sandwich":
        raise ValueError(f"unknown sampling rule {sampling!r} (valid: uniform, sandwich, progressive)")
    prefer = {"attention": space.reference.get("attention", "full"),
              "weight_sharing": space.reference.get("weight_sharing", "none")}  # fmt: skip
    largest = space.suggest(BoundaryDraw(rng, "max", prefer), task_fields)
    smallest = space.suggest(BoundaryDraw(rng, "min"), task_fields)
    return [largest, smallest, *(space.suggest(RandomDraw(rng), task_fields) for _ in range(n_random))]


def sandwich_loss(sn, subnets: list, ids, mask, labels):
    """The mean of the first subnet's cross-entropy and each other subnet's KL divergence to the first's
    predictions (detached: in-place distillation, the largest subnet teaching the others)."""
    import torch

    from xsearch.compress.distill import distill_loss
    from xsearch.training.loop import logits_loss

    teacher = sn.bind(subnets[0])(ids, mask)
    soft = teacher.detach()
    losses = [logits_loss(teacher, mask, labels)]
    for subnet in subnets[1:]:
        student = sn.bind(subnet)(ids, mask)
        losses.append(distill_loss(student, soft, labels, mask, temperature=1.0, alpha=1.0))
    return torch.stack(losses).mean()


def _save_checkpoint(sn, opt, out: Path, state: dict[str, Any]) -> None:
    """One file, written under a temporary name and renamed: the supernet's tensors, the optimizer's state and
    the training state (in its metadata), so a kill at any moment leaves the last whole checkpoint. Then the
    supernet as ``load_supernet`` reads it, and ``training.json`` for people (neither is read to resume)."""
    from xsearch.serialization import atomic_write_text, write_checkpoint
    from xsearch.supernet.io import save_supernet

    names = {id(p): key for key, p in sn.weights.items()}
    tensors = {f"weights/{name}": sn.tensor(name) for name in sn.shapes}
    for p, st in opt.state.items():
        for field, value in st.items():
            tensors[f"{field}/{names[id(p)]}"] = value
    out.mkdir(parents=True, exist_ok=True)
    write_checkpoint(out / CHECKPOINT_FILE, tensors, state)
    save_supernet(sn, out, extra={"trained": state})
    atomic_write_text(out / STATE_FILE, json.dumps(state, indent=2, sort_keys=True))


def _restore(sn, opt, tensors: dict[str, Any]) -> None:
    import torch

    with torch.no_grad():
        for name in sn.shapes:
            sn.tensor(name).copy_(tensors[f"weights/{name}"])
    for key, p in sn.weights.items():
        # the moments live beside their parameter; AdamW keeps its step count on the CPU
        st = {f: tensors[f"{f}/{key}"].to(p.device if f != "step" else "cpu")
              for f in ("step", "exp_avg", "exp_avg_sq") if f"{f}/{key}" in tensors}  # fmt: skip
        if st:
            opt.state[p] = st


def train_supernet(sn, task, settings: SupernetTrainSettings, *, out: str | os.PathLike | None = None,
                   progress: bool | None = None, init=None) -> dict[str, Any]:  # fmt: skip
    """Train ``sn`` on ``task``: each step the subnets of ``settings.sampling`` (``draw_subnets``; with the
    sandwich rule, ``sandwich_loss``), AdamW with warmup and cosine decay, gradient clipping. With ``out``,
    checkpoints go there every ``checkpoint_every`` steps and at the end, and a run that finds a checkpoint of
    the same settings there resumes from it.

    ``init``: a trained model of a subnet to warm-start from (``warm_start``: its weights into their leading
    slices before the first step; a resumed run takes the checkpoint's weights, and refuses another ``init``).

    Returns:
        The training record: steps, subnet passes, seconds, final loss, the reference subnet's validation metric.
    """
    import torch

    from xsearch.serialization import read_checkpoint
    from xsearch.training.device import moved_to, on_device, resolve_device
    from xsearch.training.loop import evaluate, resumed_steps, task_loss
    from xsearch.training.steps import adamw

    for key, value in settings.layout.items():
        if sn.layout[key] != value:
            raise ValueError(f"the supernet was built with {key}={sn.layout[key]!r}, the settings say {value!r}: "
                             "build it with the settings' (build_supernet(..., **settings.layout))")  # fmt: skip
    out = Path(out) if out is not None else None
    with moved_to(sn, resolve_device(settings.device)):  # trained there, handed back where it came from
        # ParameterDict keys hold "__" for "."; adamw reads ".bias" as a bias
        opt, params = adamw(((k.replace("__", "."), p) for k, p in sn.weights.items()), lr=settings.lr,
                            weight_decay=settings.weight_decay)  # fmt: skip
        recipe = settings.to_dict()
        recipe.pop("device")  # (not the recipe: a run may resume on another device)
        init_described = describe_config(init.config) if init is not None else None
        step, elapsed_before, window = 0, 0.0, []
        found = read_checkpoint(out / CHECKPOINT_FILE, "supernet checkpoint") if out is not None else None
        if found is not None:
            from xsearch.supernet.io import check_matches

            state, tensors = found
            check_matches(state["space"], state["task_fields"], sn.space, sn.task_fields, where=str(out))
            trained_with = SupernetTrainSettings.with_defaults(state.get("settings") or {})
            trained_with.pop("device")
            if shown := show_differences(trained_with, recipe):
                raise XSearchError(f"{out} holds a supernet trained with other settings ({shown}); choose a new --out "
                                   "or the same settings")  # fmt: skip
            if state.get("init") != init_described:
                raise XSearchError(f"{out} holds a supernet warm-started from {state.get('init') or 'nothing'}, not "
                                   f"{init_described or 'nothing'}; choose a new --out or the same --init")  # fmt: skip
            _restore(sn, opt, tensors)
            step, elapsed_before, window = state["steps"], state["seconds"], state.get("loss_window", [])
            log.info("resuming supernet training at step %d", step)
        elif init is not None:
            from xsearch.supernet.supertransformer import warm_start

            log.info("warm start: %s scalars from %s", f"{warm_start(sn, init):,}", init_described)
        fields = sn.task_fields
        batches, loop = resumed_steps(task, settings, opt, params, label="supernet training", progress=progress,
                                      step=step, seconds_before=elapsed_before, window=window)  # fmt: skip
        reference = sn.space.reference_config(fields)

        def state_now(done: bool) -> dict[str, Any]:
            return {"settings": recipe, "steps": loop.step, "subnet_passes": loop.step * settings.subnets_per_step,
                    "seconds": round(loop.elapsed, 2), "init": init_described,
                    "loss_window": loop.window, "done": done, "task": task.describe(), "space": sn.space.to_yaml(),
                    "task_fields": sn.task_fields}  # fmt: skip

        sn.train()
        with loop:
            for step in loop:
                subnets = draw_subnets(sn.space, fields, settings.seed, step, settings.sampling,
                                       settings.sandwich_random, steps=settings.steps,
                                       shrink_fraction=settings.shrink_fraction)  # fmt: skip
                ids, mask, labels = on_device(next(batches), sn.device)
                torch.manual_seed(settings.seed * 1_000_003 + step)  # dropout, and any variant's own draws
                if len(subnets) == 1:
                    loop.update(task_loss(sn.bind(subnets[0]), ids, mask, labels))
                else:
                    loop.update(sandwich_loss(sn, subnets, ids, mask, labels))
                if out is not None and loop.step % settings.checkpoint_every == 0:
                    _save_checkpoint(sn, opt, out, state_now(False))
        sn.eval()
        record = state_now(True)
        record["final_loss"] = loop.mean_loss
        record["reference_valid"] = evaluate(sn.bind(reference), task, "valid")
        if out is not None:
            _save_checkpoint(sn, opt, out, record)
    return record
