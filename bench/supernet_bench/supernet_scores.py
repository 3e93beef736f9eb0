"""Supernets trained over a space (whole, split by a dimension, or warm-started from its reference) and each
subnet scored with their inherited weights, or fine-tuned from them (``--inherited-finetune``)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from supernet_bench.ledgers import machine
from supernet_bench.scoring import accuracy_and_loss, trained_and_scored
from supernet_bench.spaces import layout, model_dims, sub_space
from xsearch.config import describe_config
from xsearch.supernet import build_supernet, extract_subnet
from xsearch.supernet.settings import LAYOUT_DEFAULTS, SupernetTrainSettings
from xsearch.supernet.train import train_supernet
from xsearch.training import evaluate
from xsearch.training.recipe import train_model
from xsearch.training.settings import TrainSettings


def score_with_supernet(space, subnets: list, task, rule: str, args, *, passes: int | None = None) -> dict:
    """Train a supernet over ``space`` with the sampling rule ``rule`` and score each of ``subnets`` on the
    validation split with its inherited weights.

    The sandwich rule trains 2 + ``--sandwich-random`` subnets a step: it gets ``passes`` (``--supernet-steps``)
    divided by that many steps, the same number of subnet passes as uniform sampling (its seconds are printed
    beside).
    """
    passes = passes or args.supernet_steps
    sn = build_supernet(space, task.model_fields(), seed=args.supernet_seed, **layout(args))
    warm = warm_start_model(space, task, args) if args.warm_start else None
    settings = SupernetTrainSettings(steps=1, lr=args.lr, seed=args.supernet_seed, sampling=rule, **layout(args),
                                     sandwich_random=args.sandwich_random, shrink_fraction=args.shrink_fraction,
                                     device=args.device,
                                     checkpoint_every=args.checkpoint_every)  # fmt: skip
    settings = dataclasses.replace(settings, steps=max(1, passes // settings.subnets_per_step))
    if args.supernet_seconds is not None:  # (a deadline: the passes it reaches are its budget)
        settings = dataclasses.replace(settings, steps=None, seconds=args.supernet_seconds)
    out = None
    if args.supernet_work:
        shrink = f"-shrink{args.shrink_fraction:g}" if rule == "progressive" and args.shrink_fraction != 0.5 else ""
        seed = f"-seed{args.supernet_seed}" if args.supernet_seed != args.seed else ""
        scaled = "".join(f"-{v}" for k, v in layout(args).items() if v != LAYOUT_DEFAULTS[k])
        budget = f"{args.supernet_seconds:g}s" if args.supernet_seconds is not None else passes
        out = (Path(args.supernet_work)
               / f"{space.name}-{rule}-{budget}-warm{args.warm_start}{shrink}{seed}{scaled}")  # fmt: skip
    record = train_supernet(sn, task, settings, out=out, progress=out is not None, init=warm and warm["model"])
    supernet_s = record["seconds"]  # (over every sitting of a resumed run)
    scores = []
    for cfg in subnets:
        t0 = time.perf_counter()
        inherited, loss = accuracy_and_loss(extract_subnet(sn, cfg).to(args.device), task, "valid")
        scores.append({"config": describe_config(cfg), "inherited_valid": inherited, "inherited_loss": loss,
                       "score_s": time.perf_counter() - t0})  # fmt: skip
    if args.inherited_finetune:  # (after every inherited score: the supernet's weights are not trained further)
        for i, (cfg, score) in enumerate(zip(subnets, scores, strict=True)):
            score.update(finetuned(sn, cfg, task, args))
            print(f"  [{space.name} {rule} {i + 1}/{len(subnets)}] fine-tuned {args.inherited_finetune} steps from "
                  f"the inherited weights: valid {score['finetuned_valid']:.4f}, loss {score['finetuned_loss']:.4f} "
                  f"(was {score['inherited_valid']:.4f}, {score['inherited_loss']:.4f}; {score['finetune_s']:.0f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip
    print(f"  [{space.name} {rule}] supernet {record['subnet_passes']} subnet passes in {supernet_s:.0f} s (final "
          f"loss {record['final_loss']:.3f}, reference subnet {record['reference_valid']:.4f} validation); "
          f"{len(scores)} subnets scored", file=sys.stderr, flush=True)  # fmt: skip
    return {"space": space.name, "sampling": rule, "warm_start": args.warm_start, "supernet_seed": args.supernet_seed,
            **layout(args),
            **({"shrink_fraction": settings.shrink_fraction} if rule == "progressive" else {}),
            **({k: v for k, v in warm.items() if k != "model"} if warm else {}), "supernet_steps": record["steps"],
            "subnet_passes": record["subnet_passes"], "supernet_seconds": supernet_s,
            "supernet_parameters": sn.n_parameters(), "final_loss": record["final_loss"],
            "reference_valid": record["reference_valid"], "machine": machine(),
            **({"inherited_finetune": args.inherited_finetune} if args.inherited_finetune else {}),
            "scores": scores}  # fmt: skip


def finetuned(sn, cfg, task, args) -> dict:
    """``cfg`` extracted from ``sn``, trained ``--inherited-finetune`` steps from those weights, then scored on the
    validation split: the inherited weights as a start rather than a score (the proxy's training, shortened,
    from the supernet's weights)."""
    valid, loss, seconds = trained_and_scored(cfg, task, args.inherited_finetune, args, init=extract_subnet(sn, cfg))
    return {"finetuned_valid": valid, "finetuned_loss": loss, "finetune_s": seconds}


def score_with_split_supernets(space, subnets: list, task, rule: str, args) -> dict:
    """Few-shot NAS (Zhao et al., 2021): ``space`` split on ``--split-by`` into one sub-space per value, a supernet
    trained over each with an equal share of ``--supernet-steps`` passes, each subnet scored with its value's
    supernet (no weight is shared across the values). The figures of the run are the sums over the supernets."""
    dim = args.split_by
    once = [d for d in space.model if not (space.per_layer and d in space.LAYER_DIMS)]
    if dim not in once:
        raise SystemExit(f"--split-by {dim}: not a model dimension the space {space.name!r} draws once per model "
                         f"(valid: {', '.join(once)})")  # fmt: skip
    if args.warm_start:
        raise SystemExit("--split-by: the warm start is of the whole space's reference; give one or the other")
    values = space.model[dim].every_value()
    runs = [score_with_supernet(sub_space(space, dim, v), [c for c in subnets if model_dims(c)[dim] == v], task,
                                rule, args, passes=args.supernet_steps // len(values)) for v in values]  # fmt: skip
    by_config = {s["config"]: s for r in runs for s in r["scores"]}
    total = {k: sum(r[k] for r in runs) for k in ("supernet_steps", "subnet_passes", "supernet_seconds",
                                                   "supernet_parameters")}  # fmt: skip
    return {**runs[0], **total, "space": space.name, "split_by": dim,
            "final_loss": float(np.mean([r["final_loss"] for r in runs])),
            "reference_valid": float(np.mean([r["reference_valid"] for r in runs])),
            "split": {str(v): {k: r[k] for k in ("space", *total, "final_loss", "reference_valid")}
                      for v, r in zip(values, runs, strict=True)},
            "scores": [by_config[describe_config(cfg)] for cfg in subnets]}  # fmt: skip


def warm_start_model(space, task, args) -> dict:
    """The space's reference trained alone ``--warm-start`` steps (kept under ``--supernet-work`` and taken from
    there the next time), the weights a warm-started supernet starts from, with its figures."""
    from xsearch.serialization import load_model, save_model

    cfg = space.reference_config(task.model_fields())
    kept = Path(args.supernet_work) / f"reference-{space.name}-{args.warm_start}" if args.supernet_work else None
    if kept is not None and (kept / "warm_start.json").is_file():
        doc = json.loads((kept / "warm_start.json").read_text())
        return {**doc, "model": load_model(kept)}
    t0 = time.perf_counter()
    trained = train_model(cfg, task, TrainSettings(steps=args.warm_start, lr=args.lr, seed=args.seed,
                                                   device=args.device), progress=False)  # fmt: skip
    doc = {"warm_start_config": describe_config(cfg), "warm_start_seconds": time.perf_counter() - t0,
           "warm_start_valid": evaluate(trained.model.to(args.device), task, "valid"),
           "warm_start_test": trained.test_metric}  # fmt: skip
    print(f"  [{space.name}] warm start: the reference {doc['warm_start_config']} trained {args.warm_start} steps "
          f"in {doc['warm_start_seconds']:.0f} s: valid {doc['warm_start_valid']:.4f}, test "
          f"{doc['warm_start_test']:.4f}", file=sys.stderr, flush=True)  # fmt: skip
    if kept is not None:
        save_model(trained.model, kept)
        (kept / "warm_start.json").write_text(json.dumps(doc, indent=2))
    return {**doc, "model": trained.model}
