"""Does a supernet's inherited-weight score rank architectures as training them would? And what does it cost?

For each space (``--spaces``, default ``default`` and ``per_layer``) on ListOps at ``--max-len`` tokens:

1. a supernet over the space is trained for ``--supernet-steps`` steps (one uniformly drawn subnet per step);
2. ``--subnets`` subnets are drawn uniformly (seeded); each is scored on the validation split with its
   inherited weights (no training): the one-shot search's signal;
3. each is trained from scratch for ``--proxy-steps`` steps (the standalone search's per-trial budget, 200 by
   default): today's proxy, scored on the validation split;
4. each is trained standalone from scratch for ``--standalone-steps`` steps and scored on the test split: the
   ground truth both signals are ranked against (Kendall tau-b; the chance level is printed beside).

Budgets are in steps (seconds are printed, and depend on the machine's load). The protocol of the supernet
issue is ``--max-len 512 --subnets 24 --standalone-steps 1000`` (hours on 2 cores); smaller runs say so.

    python bench/supernet.py [--max-len 512] [--subnets 24] [--supernet-steps 3000] [--standalone-steps 1000]
                             [--proxy-steps 200] [--spaces default,per_layer] [--train-threads 2]
                             [--json out.json] [--reuse earlier.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time

import torch

from xsearch.config import describe_config
from xsearch.model import count_parameters
from xsearch.search_spaces import RandomDraw, load_space_for_task
from xsearch.supernet import build_supernet, extract_subnet
from xsearch.supernet.settings import SupernetTrainSettings
from xsearch.supernet.train import train_supernet
from xsearch.tasks import get_task
from xsearch.training import evaluate
from xsearch.training.recipe import train_model
from xsearch.training.settings import TrainSettings


def kendall_tau(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b (ties counted as neither concordant nor discordant, and corrected for)."""
    n = len(x)
    concordant = discordant = ties_x = ties_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denom = ((concordant + discordant + ties_x) * (concordant + discordant + ties_y)) ** 0.5
    return (concordant - discordant) / denom if denom else float("nan")


def run_space(name: str, task, args) -> dict:
    fields = task.model_fields()
    space = load_space_for_task(name, task)
    rng = random.Random(args.seed)
    subnets = [space.suggest(RandomDraw(rng), fields) for _ in range(args.subnets)]

    sn = build_supernet(space, fields, seed=args.seed)
    start = time.perf_counter()
    record = train_supernet(sn, task, SupernetTrainSettings(steps=args.supernet_steps, lr=args.lr,
                                                            seed=args.seed), progress=False)  # fmt: skip
    supernet_s = time.perf_counter() - start

    earlier = {}
    if args.reuse:  # the proxy and standalone figures of an earlier run with the same subnets and budgets
        with open(args.reuse, encoding="utf-8") as f:
            doc = json.load(f)
        same = ("max_len", "n_train", "n_eval", "seed", "lr", "proxy_steps", "standalone_steps")
        differ = [k for k in same if doc["args"][k] != getattr(args, k)]
        if differ:
            raise SystemExit(f"--reuse {args.reuse}: another task or budget ({', '.join(differ)})")
        earlier = {r["config"]: r for res in doc["results"] if res["space"] == name for r in res["rows"]}
    rows = []
    for i, cfg in enumerate(subnets):
        t0 = time.perf_counter()
        inherited = evaluate(extract_subnet(sn, cfg), task, "valid")
        score_s = time.perf_counter() - t0
        if describe_config(cfg) in earlier:
            rows.append({**earlier[describe_config(cfg)], "inherited_valid": inherited, "score_s": score_s})
            print(f"  [{name} {i + 1}/{len(subnets)}] {rows[-1]['config'][:70]:70s} inherited {inherited:.3f}  "
                  "(proxy and standalone from --reuse)", file=sys.stderr, flush=True)  # fmt: skip
            continue
        proxy = train_model(cfg, task, TrainSettings(steps=args.proxy_steps, lr=args.lr, seed=args.seed),
                            progress=False)  # fmt: skip
        proxy_valid = evaluate(proxy.model, task, "valid")
        t0 = time.perf_counter()
        alone = train_model(cfg, task, TrainSettings(steps=args.standalone_steps, lr=args.lr, seed=args.seed),
                            progress=False)  # fmt: skip
        alone_s = time.perf_counter() - t0
        rows.append({"config": describe_config(cfg), "parameters": count_parameters(alone.model),
                     "inherited_valid": inherited, "proxy_valid": proxy_valid, "standalone_test": alone.test_metric,
                     "score_s": score_s, "standalone_s": alone_s})  # fmt: skip
        print(f"  [{name} {i + 1}/{len(subnets)}] {rows[-1]['config'][:70]:70s} inherited {inherited:.3f}  proxy "
              f"{proxy_valid:.3f}  standalone {alone.test_metric:.3f}", file=sys.stderr, flush=True)  # fmt: skip
    truth = [r["standalone_test"] for r in rows]
    return {
        "space": name, "subnets": len(rows), "rows": rows, "supernet_steps": record["steps"],
        "supernet_seconds": supernet_s, "supernet_parameters": sn.n_parameters(),
        "tau_inherited": kendall_tau([r["inherited_valid"] for r in rows], truth),
        "tau_proxy": kendall_tau([r["proxy_valid"] for r in rows], truth),
        "score_s": sum(r["score_s"] for r in rows) / len(rows),
        "standalone_s": sum(r["standalone_s"] for r in rows) / len(rows),
        "best_by_inherited": max(rows, key=lambda r: r["inherited_valid"])["standalone_test"],
        "best_by_proxy": max(rows, key=lambda r: r["proxy_valid"])["standalone_test"],
        "best": max(truth),
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--n-train", type=int, default=8000)
    p.add_argument("--n-eval", type=int, default=500, help="validation and test examples each")
    p.add_argument("--subnets", type=int, default=24)
    p.add_argument("--supernet-steps", type=int, default=3000)
    p.add_argument("--standalone-steps", type=int, default=1000)
    p.add_argument("--proxy-steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--spaces", default="default,per_layer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-threads", type=int, default=2)
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--reuse", metavar="JSON", help="take the proxy and standalone figures of subnets an earlier "
                   "--json run trained with the same task and budgets (to vary only the supernet)")  # fmt: skip
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.train_threads)
    task = get_task("listops", n_train=args.n_train, n_valid=args.n_eval, n_test=args.n_eval, max_len=args.max_len,
                    seed=args.seed)  # fmt: skip
    protocol = args.max_len >= 512 and args.subnets >= 24 and args.standalone_steps >= 1000
    print(f"ListOps at {args.max_len} tokens (train {args.n_train}, valid/test {args.n_eval}); chance (majority "
          f"class): valid {task.chance('valid'):.4f}, test {task.chance('test'):.4f}; {args.subnets} subnets per "
          f"space; supernet {args.supernet_steps} steps, proxy {args.proxy_steps}, standalone "
          f"{args.standalone_steps} steps; lr {args.lr}; "
          + ("the issue's protocol" if protocol else "SMALLER than the issue's protocol (512 tokens, 24 subnets, "
             ">= 1,000 standalone steps)"))  # fmt: skip
    results = [run_space(name, task, args) for name in args.spaces.split(",")]
    print()
    print(
        "Ranking fidelity (Kendall tau-b against standalone test accuracy; target: inherited >= 0.6 and above "
        "the proxy)"
    )
    print(
        "| space | subnets | tau inherited (supernet) | tau proxy (from scratch, "
        f"{args.proxy_steps} steps) | standalone test of the pick by inherited / by proxy / best | chance |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['space']} | {r['subnets']} | {r['tau_inherited']:.3f} | {r['tau_proxy']:.3f} | "
              f"{r['best_by_inherited']:.4f} / {r['best_by_proxy']:.4f} / {r['best']:.4f} | "
              f"{task.chance('test'):.4f} |")  # fmt: skip
    print()
    print("Cost")
    print(
        "| space | supernet parameters | supernet training | one standalone model (mean) | "
        "seconds per scored candidate | candidates per minute |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['space']} | {r['supernet_parameters']:,} | {r['supernet_steps']} steps, "
              f"{r['supernet_seconds']:.0f} s | {args.standalone_steps} steps, {r['standalone_s']:.0f} s "
              f"(supernet = {r['supernet_seconds'] / r['standalone_s']:.2f}x) | {r['score_s']:.2f} | "
              f"{60 / r['score_s']:.0f} |")  # fmt: skip
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "chance_test": task.chance("test"), "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
