"""Which training levers pay at a CPU step budget? Each variant of the recipe against the base, at equal steps.

The model is the reference Transformer of ``--space`` (the pipeline's reference), the task ListOps with the
pipeline's default options (``--max-len``, ``--n-train``); every variant trains ``--steps`` optimizer steps
(``pretrain`` variants first self-pretrain for ``--pretrain-steps``; ``long`` trains twice as many steps: the
same total of steps as pretraining plus training; ``mean-pool`` mean-pools where ListOps' models read the first
token) over ``--seeds`` seeds, and reports the mean and spread of
the test accuracy beside the chance level (majority class). Budgets are in steps; seconds are printed and
depend on the machine's load. ``--compile`` also times ``torch.compile`` against eager per step.

    python bench/recipe.py [--steps 600] [--seeds 3] [--variants base,lr1e-3,...] [--compile] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from lra_listops import first_token_baseline  # (bench/, beside this script)

from xsearch.config import ModelConfig
from xsearch.model import build_model
from xsearch.search_spaces import load_space_for_task
from xsearch.tasks import get_task
from xsearch.training import evaluate, train
from xsearch.training.pretrain import pretrain
from xsearch.training.settings import PretrainSettings

BASE = {"lr": 2e-3, "batch_size": 32, "warmup": 0.1, "keep_best": True}
#: variant -> (changes to the training recipe, pretraining steps as a multiple of --pretrain-steps, step factor)
VARIANTS = {
    "base": ({}, 0, 1),
    "lr1e-3": ({"lr": 1e-3}, 0, 1),
    "lr4e-3": ({"lr": 4e-3}, 0, 1),
    "batch64": ({"batch_size": 64}, 0, 1),
    "warmup0.02": ({"warmup": 0.02}, 0, 1),
    "smooth0.1": ({"label_smoothing": 0.1}, 0, 1),
    "ema0.99": ({"ema": 0.99}, 0, 1),
    "ema0.998": ({"ema": 0.998}, 0, 1),
    "pretrain": ({}, 1, 1),
    "long": ({}, 0, 2),
    "mean-pool": ({}, 0, 1),  # the head reads the mean over real tokens, not ListOps' first token (CONFIG_CHANGES)
}
#: variant -> changes to the model config
CONFIG_CHANGES = {"mean-pool": {"pooling": "mean"}}


def run_variant(name, task, cfg, steps, pretrain_steps, seed) -> dict:
    changes, pre, factor = VARIANTS[name]
    torch.manual_seed(seed)
    model = build_model(ModelConfig.from_dict({**cfg.to_dict(), **CONFIG_CHANGES.get(name, {})}))
    start = time.perf_counter()
    if pre:
        pretrain(model, task, PretrainSettings(steps=pre * pretrain_steps, lr=BASE["lr"], seed=seed), progress=False)
        torch.manual_seed(seed)
        model.head.reset_parameters()
    result = train(model, task, steps=steps * factor, seed=seed, progress=False, **{**BASE, **changes})
    seconds = time.perf_counter() - start
    return {"variant": name, "seed": seed, "test": evaluate(model, task, "test"), "valid": result.valid_metric,
            "steps": result.steps, "pretrain_steps": pre * pretrain_steps, "seconds": round(seconds, 1)}  # fmt: skip


def time_compile(task, cfg, steps: int) -> dict:
    """Seconds per training step, eager against ``torch.compile`` (after its first, compiling, steps)."""
    out = {}
    for mode in ("eager", "compile"):
        torch.manual_seed(0)
        model = build_model(cfg)
        run = torch.compile(model) if mode == "compile" else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batches = task.batches("train", 32, shuffle=True)
        first = None
        start = time.perf_counter()
        for i in range(steps):
            ids, mask, labels = next(batches)
            loss = torch.nn.functional.cross_entropy(run(ids, mask), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i == 4:
                first = time.perf_counter() - start
                start = time.perf_counter()
        out[mode] = {"first_5_steps_s": round(first, 2), "per_step_s": (time.perf_counter() - start) / (steps - 5)}
    out["compile_speedup"] = out["eager"]["per_step_s"] / out["compile"]["per_step_s"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--space", default="tiny")
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--n-train", type=int, default=4000)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--pretrain-steps", type=int, default=600)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--compile", action="store_true", help="also time torch.compile against eager")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variant {unknown[0]!r} (valid: {', '.join(VARIANTS)})")
    task = get_task("listops", n_train=args.n_train, n_valid=500, n_test=500, max_len=args.max_len)
    cfg = load_space_for_task(args.space, task).reference_config(task.model_fields())
    chance = task.chance("test")
    rows = []
    for name in names:
        for seed in range(args.seeds):
            rows.append(run_variant(name, task, cfg, args.steps, args.pretrain_steps, seed))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"\nListOps max_len {args.max_len}, n_train {args.n_train}, {args.space} reference; {args.steps} training "
          f"steps ({args.seeds} seeds); chance (majority class) {chance:.4f}; the first token's majority answer (no "
          f"model) {first_token_baseline(task):.4f}\n")  # fmt: skip
    print("| variant | pretrain steps | train steps | test accuracy (mean) | per seed | minus base | s per run |")
    print("|---|---|---|---|---|---|---|")
    base = statistics.mean(r["test"] for r in rows if r["variant"] == "base") if "base" in names else None
    for name in names:
        mine = [r for r in rows if r["variant"] == name]
        mean = statistics.mean(r["test"] for r in mine)
        delta = f"{100 * (mean - base):+.1f} pts" if base is not None else "-"
        per_seed = " / ".join(f"{r['test']:.3f}" for r in mine)
        print(f"| {name} | {mine[0]['pretrain_steps']} | {mine[0]['steps']} | {mean:.4f} | {per_seed} | {delta} | "
              f"{statistics.mean(r['seconds'] for r in mine):.0f} |")  # fmt: skip
    timing = None
    if args.compile:
        try:
            timing = time_compile(task, cfg, 40)
        except Exception as e:  # torch.compile's failures are many types; say which and go on
            lines = str(e).strip().splitlines() or [""]
            why = next((ln for ln in lines if ln.startswith(("RuntimeError", "TypeError"))), lines[0])
            print(f"\ntorch.compile failed to train the model: {type(e).__name__}: {why}")
    if timing:
        print(
            f"\ntorch.compile: {timing['compile']['per_step_s']:.3f} s per step against eager "
            f"{timing['eager']['per_step_s']:.3f} ({timing['compile_speedup']:.2f}x); its first 5 steps took "
            f"{timing['compile']['first_5_steps_s']:.1f} s (eager {timing['eager']['first_5_steps_s']:.1f})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "chance": chance, "rows": rows, "compile": timing}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
