"""Each subnet's figures from new weights, which do not depend on a supernet: the proxy and the standalone
ground truth (``--ledger``), and the fine-tune's control (``--from-scratch``, ``--scratch-ledger``)."""

from __future__ import annotations

import sys
import time

from supernet_bench.ledgers import Ledger, ScratchLedger, machine
from supernet_bench.scoring import trained_and_scored
from xsearch.config import describe_config
from xsearch.model import count_parameters
from xsearch.training import evaluate
from xsearch.training.recipe import train_model
from xsearch.training.settings import TrainSettings


def measure_truth(name: str, subnets: list, task, args, ledger: Ledger | None) -> list[dict | None]:
    """Each subnet's proxy and standalone figures: from the ledger, or trained now (``--only``, ``--max-new``
    choose which); None where neither."""
    truth_rows: list[dict | None] = []
    for i, cfg in enumerate(subnets):
        if ledger and (row := ledger.get(name, cfg)):
            truth_rows.append(row)
            continue
        if (args.max_new is not None and args.max_new <= 0) or (args.only and i + 1 not in args.only):
            truth_rows.append(None)  # (left for another sitting; the ledger's later rows still count)
            continue
        t0 = time.perf_counter()
        proxy = train_model(cfg, task, TrainSettings(steps=args.proxy_steps, lr=args.lr, seed=args.train_seed,
                                                     device=args.device), progress=False)  # fmt: skip
        proxy_valid = evaluate(proxy.model.to(args.device), task, "valid")
        proxy_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        alone = train_model(cfg, task, TrainSettings(steps=args.standalone_steps, lr=args.lr, seed=args.train_seed,
                                                     device=args.device), progress=False)  # fmt: skip
        row = {"config": describe_config(cfg), "parameters": count_parameters(alone.model),
               "proxy_valid": proxy_valid, "standalone_test": alone.test_metric, "proxy_s": proxy_s,
               "standalone_s": time.perf_counter() - t0}  # fmt: skip
        if ledger:
            ledger.add(name, cfg, row)
        if args.max_new is not None:
            args.max_new -= 1
        truth_rows.append({**row, "machine": machine()})
        print(f"  [{name} {i + 1}/{len(subnets)}] {row['config'][:70]:70s} proxy {proxy_valid:.3f}  standalone "
              f"{alone.test_metric:.3f}  ({row['proxy_s'] + row['standalone_s']:.0f} s)", file=sys.stderr,
              flush=True)  # fmt: skip
    return truth_rows


def from_scratch(
    name: str, subnets: list, truth_rows: list[dict | None], task, args, kept: ScratchLedger | None
) -> list[dict | None]:
    """``truth_rows`` with each measured subnet's ``--from-scratch`` figures added (``scratch_valid``,
    ``scratch_loss``, ``scratch_s``): taken from ``kept`` (``--scratch-ledger``), or trained now (``--rank-only``
    trains none: a subnet without them exits naming it)."""
    rows: list[dict | None] = []
    for i, (cfg, row) in enumerate(zip(subnets, truth_rows, strict=True)):
        figures = kept.get(name, cfg) if kept and row is not None else None
        if row is not None and figures is None:
            if args.rank_only:
                raise SystemExit(f"--rank-only: subnet {i + 1} of {name} has no figures of {args.from_scratch} "
                                 f"steps from new weights in {args.scratch_ledger}")  # fmt: skip
            valid, loss, seconds = trained_and_scored(cfg, task, args.from_scratch, args)
            figures = {"config": describe_config(cfg), "scratch_valid": valid, "scratch_loss": loss,
                       "scratch_s": seconds}  # fmt: skip
            if kept:
                kept.keep(name, figures)
            print(f"  [{name} {i + 1}/{len(subnets)}] {args.from_scratch} steps from new weights: valid "
                  f"{valid:.4f}, loss {loss:.4f} ({seconds:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
        rows.append(None if row is None else {**row, **{k: v for k, v in figures.items() if k != "config"}})
    return rows
