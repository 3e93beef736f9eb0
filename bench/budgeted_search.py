"""Budgeted search against the two-objective search: training steps spent for the best model within a budget.

Both searches run on the same ListOps task, search space, target, latency budget, number of COMPLETE trials
(``--trials``) and per-trial step budget:

- ``both``: the two-objective study (accuracy and latency; the budget is a constraint, so every candidate
  is trained, over budget or not);
- ``accuracy``: ``--objective accuracy`` with Hyperband; latency is measured first, an over-budget candidate
  is pruned before any training step, and weak candidates are stopped at a validation report.

The latency budget is a fraction of the reference Transformer's latency measured here first (so the same
command makes sense on any machine). The two searches share one latency cache, so an architecture both
sample is over or under the budget in both; the budgeted search runs first, so the two-objective search
saves the measurements in wall time (the comparison of wall times is conservative). "steps to match" is the
cumulative number of training steps (in trial order) after which a search had found a candidate within the
budget at least as accurate as the two-objective search's best. ``--trials`` counts COMPLETE trials, so the
budgeted search samples more candidates (its pruned ones come on top); the table shows it both over as many
trials sampled as the two-objective search and to the same number of COMPLETE trials.

    python bench/budgeted_search.py [--trials 12] [--train-steps 200] [--budget-frac 0.2] [--space tiny]
                                    [--task-opt max_depth=3 ...]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time

import optuna
import torch

import xsearch
from xsearch.latency import measure
from xsearch.search import SearchSettings, is_feasible, run_search, trial_latency_ms, trial_task_metric
from xsearch.search_spaces import load_space_for_task
from xsearch.settings import parse_assignments
from xsearch.tasks import get_task

THREADS = 2  # latency measurement (the deployment setting)
TASK_OPTIONS = {"n_train": 2000, "n_valid": 200, "n_test": 200, "max_len": 256}


def within_budget(t: optuna.trial.FrozenTrial, budget_ms: float) -> bool:
    return t.state.name == "COMPLETE" and is_feasible(t) and trial_latency_ms(t) <= budget_ms


def summarize(study: optuna.Study, budget_ms: float, target: float | None, first: int | None = None) -> dict:
    """Steps spent, best metric within the budget, and steps spent until ``target`` was first reached (over the
    ``first`` trials sampled, or all)."""
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)[:first]
    steps, best = 0, 0.0
    reached = None
    for t in trials:
        steps += int(t.user_attrs.get("train_steps") or 0)
        if within_budget(t, budget_ms):
            best = max(best, trial_task_metric(t))
            if target is not None and reached is None and best >= target:
                reached = steps
    pruned = [t.user_attrs.get("pruned", "") for t in trials if t.state.name == "PRUNED"]
    return {
        "sampled": len(trials),
        "complete": sum(t.state.name == "COMPLETE" for t in trials),
        "over_budget": sum(p.startswith("over budget") for p in pruned),
        "stopped": sum(p.startswith("stopped early") for p in pruned),
        "steps": int(steps),
        "best": best,
        "reached": reached,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=12, help="COMPLETE trials in each study")
    p.add_argument("--train-steps", type=int, default=200, help="training steps per trial")
    p.add_argument("--budget-frac", type=float, default=0.2, help="latency budget / the reference's latency")
    p.add_argument("--space", default="tiny")
    p.add_argument("--target", default="ort-cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--task-opt", action="append", metavar="KEY=VALUE", help="a ListOps option over the bench's")
    p.add_argument("--train-threads", type=int, default=1, help="torch threads for training (1 on a shared machine)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.train_threads)
    task_options = TASK_OPTIONS | parse_assignments(args.task_opt, "--task-opt")
    task = get_task("listops", **task_options)
    space = load_space_for_task(args.space, task)
    torch.manual_seed(0)
    ref = xsearch.build_model(space.reference_config(task.model_fields()))
    ref_ms = measure(ref, args.target, seq_len=task.max_len, threads=THREADS, repeats=20).median_ms
    budget = round(args.budget_frac * ref_ms, 3)
    print(f"ListOps ({', '.join(f'{k} {v}' for k, v in task_options.items())}), space {args.space!r}, "
          f"{args.target} ({THREADS} threads): reference {ref_ms:.2f} ms, budget {budget:.3f} ms; "
          f"{args.trials} COMPLETE trials of {args.train_steps} steps each, seed {args.seed}")  # fmt: skip
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        for objective in ("accuracy", "both"):
            settings = SearchSettings(
                task="listops", task_options=task_options, space=args.space, target=args.target,
                trials=args.trials, storage=f"sqlite:///{d}/bench.db", study=objective, max_latency_ms=budget,
                train_steps=args.train_steps, train_seconds=None, seed=args.seed, threads=THREADS,
                latency_cache=f"{d}/latency.jsonl", objective=objective,
            )  # fmt: skip
            start = time.perf_counter()
            study = run_search(settings, progress=False)
            wall = time.perf_counter() - start
            rows[objective] = (study, wall)
    target = summarize(rows["both"][0], budget, None)["best"]
    print()
    print("| search | trials sampled | COMPLETE | pruned over budget | stopped early | training steps "
          "| best valid accuracy within budget | steps to match | wall s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    sampled = len(rows["both"][0].get_trials(deepcopy=False))
    for name, objective, first in (
        ("two objectives (both)", "both", None),
        (f"accuracy + Hyperband, its first {sampled} trials", "accuracy", sampled),
        (f"accuracy + Hyperband, to {args.trials} COMPLETE", "accuracy", None),
    ):
        study, wall = rows[objective]
        r = summarize(study, budget, target, first)
        match = "never" if r["reached"] is None else f"{r['reached']}"
        print(f"| {name} | {r['sampled']} | {r['complete']} | {r['over_budget']} | {r['stopped']} | {r['steps']} "
              f"| {r['best']:.4f} | {match} | {'-' if first else f'{wall:.0f}'} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
