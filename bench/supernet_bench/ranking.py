"""Each space's subnets ranked by every signal (the supernets' inherited scores, the proxy, the fine-tune and its
control) against the standalone ground truth."""

from __future__ import annotations

import sys

import numpy as np

from supernet_bench.ledgers import Ledger, Scores, ScratchLedger
from supernet_bench.spaces import draw_subnets, load_bench_space
from supernet_bench.standalone import from_scratch, measure_truth
from supernet_bench.stats import paired_difference, permutation_p, tau
from supernet_bench.supernet_scores import score_with_split_supernets, score_with_supernet

MIN_RANKED = 3  # subnets with standalone figures a ranking (and the ground truth's spread) needs


#: What a ranking orders the subnets by, higher first: each supernet's inherited validation accuracy and loss,
#: and the standalone search's proxy (a short training from new weights).
SIGNALS = {"inherited": lambda r: r["inherited_valid"], "inherited_loss": lambda r: -r["inherited_loss"],
           "proxy": lambda r: r["proxy_valid"], "finetuned": lambda r: r["finetuned_valid"],
           "finetuned_loss": lambda r: -r["finetuned_loss"], "scratch": lambda r: r["scratch_valid"],
           "scratch_loss": lambda r: -r["scratch_loss"]}  # fmt: skip
FINETUNED = ("finetuned", "finetuned_loss")  # (the signals only a run with --inherited-finetune has)
SCRATCH = ("scratch", "scratch_loss")  # (the signals only a run with --from-scratch has)


def taus(rows: list[dict], truth: list[float], signals) -> dict[str, float]:
    """``tau_<signal>`` and its ``p_<signal>`` of each of ``signals`` (``SIGNALS``' names) over ``rows``."""
    out = {}
    for name in signals:
        scores = [SIGNALS[name](r) for r in rows]
        out[f"tau_{name}"], out[f"p_{name}"] = tau(scores, truth), permutation_p(scores, truth)
    return out


def pick(rows: list[dict], key) -> dict:
    """The standalone test accuracy of the subnet ``key`` scores highest, and, where several tie at the top,
    the mean over the tied ones (what a pick among them is worth on average) and how many tie."""
    top = max(key(r) for r in rows)
    tied = [r["standalone_test"] for r in rows if key(r) == top]
    return {"test": float(np.mean(tied)), "tied": len(tied)}


def rank(run: dict, subnets: list, truth_rows: list[dict | None]) -> dict:
    """Kendall tau of the supernet run's scores (its accuracy and, negated, its loss) and of the proxy against
    the standalone figures, over the subnets whose standalone figures are measured; beside them, two rankers
    that train nothing and read only the architecture's size (narrower first; fewer parameters first): what a
    signal must beat to say more than "small models train faster"."""
    rows = [{**row, **score, "d_model": cfg.d_model}
            for score, cfg, row in zip(run["scores"], subnets, truth_rows) if row is not None]  # fmt: skip
    truth = [r["standalone_test"] for r in rows]
    signals = [name for name in SIGNALS if (name not in FINETUNED or run.get("inherited_finetune"))
               and (name not in SCRATCH or all("scratch_valid" in r for r in rows))]  # fmt: skip
    alike = [r for r in rows if r.get("machine") == run["machine"]]
    return {
        **{k: v for k, v in run.items() if k not in ("scores", "budget")},
        "subnets": len(rows), "drawn": len(truth_rows), "rows": rows, **taus(rows, truth, signals),
        "inherited_spread": {"min": min(r["inherited_valid"] for r in rows),
                             "max": max(r["inherited_valid"] for r in rows),
                             "distinct": len({r["inherited_valid"] for r in rows}),
                             "loss_min": min(r["inherited_loss"] for r in rows),
                             "loss_max": max(r["inherited_loss"] for r in rows)},
        "tau_narrower": tau([-r["d_model"] for r in rows], truth),
        "tau_fewer_parameters": tau([-r["parameters"] for r in rows], truth),
        "score_s": sum(s["score_s"] for s in run["scores"]) / len(run["scores"]),
        **({"finetune_s": sum(s["finetune_s"] for s in run["scores"]) / len(run["scores"])}
           if "finetune_s" in run["scores"][0] else {}),
        **({"scratch_s": sum(r["scratch_s"] for r in rows) / len(rows)} if "scratch" in signals else {}),
        # The fine-tune against its control (--from-scratch at any steps), each by accuracy and by loss.
        **({f"finetuned_minus_scratch{loss}": paired_difference(
                [SIGNALS[f"finetuned{loss}"](r) for r in rows], [SIGNALS[f"scratch{loss}"](r) for r in rows], truth)
            for loss in ("", "_loss")} if "scratch" in signals and "finetuned" in signals else {}),
        # Seconds compare only on one machine and thread count: the rows measured where this supernet was.
        "standalone_s": sum(r["standalone_s"] for r in alike) / len(alike) if alike else float("nan"),
        "standalone_rows": len(alike),
        **{f"pick_by_{name}": pick(rows, SIGNALS[name]) for name in signals},
        "best": max(truth),
        "within_width": within_width(rows, [name for name in signals if name != "proxy"]),
    }  # fmt: skip


def within_width(rows: list[dict], signals: list[str]) -> dict:
    """The supernet's ``signals``' taus (and p) among the subnets of the most common width only: what the
    supernet says beyond "narrower first", which a score that merely encodes width would rank at chance."""
    width = max(sorted({r["d_model"] for r in rows}), key=lambda w: sum(r["d_model"] == w for r in rows))
    group = [r for r in rows if r["d_model"] == width]
    return {"d_model": width, "subnets": len(group), **taus(group, [r["standalone_test"] for r in group], signals)}


def averaged(row: dict, by_seed: dict[int, float], seeds: list[int]) -> dict | None:
    """``row`` with its standalone figure the mean over the training ``seeds`` (``--truth-seeds``), or None where
    the ledger lacks one of them (the proxy stays the search's: one training, seed ``--seed``)."""
    if any(seed not in by_seed for seed in seeds):
        return None
    return {**row, "standalone_test": float(np.mean([by_seed[seed] for seed in seeds]))}


def run_space(
    name: str, task, args, ledger: Ledger | None, scores: Scores | None, scratch: ScratchLedger | None
) -> tuple[list, list[dict]]:
    """The space's drawn subnets and, unless ``--truth-only``, one ranking per sampling rule (a supernet trained
    now, or its scores taken from ``--scores``), over the subnets whose standalone figures are measured (with
    ``--from-scratch``, their figures from new weights, kept in ``scratch``)."""
    space = load_bench_space(name, task, args)
    subnets = draw_subnets(space, task, args)
    truth_rows = measure_truth(name, subnets, task, args, ledger)
    if len(args.truth_seeds) > 1 and not args.truth_only:
        truth_rows = [averaged(row, ledger.repeats.get((name, row["config"]), {}), args.truth_seeds)
                      if row is not None else None for row in truth_rows]  # fmt: skip
    if args.from_scratch and not args.truth_only:
        truth_rows = from_scratch(name, subnets, truth_rows, task, args, scratch)
    measured = sum(row is not None for row in truth_rows)
    if measured < len(subnets) or args.truth_only or args.train_seed != args.seed:
        print(f"  [{name}] standalone figures of {measured} of {len(subnets)} subnets"
              + (f" in {args.ledger}" if ledger else ""), file=sys.stderr, flush=True)  # fmt: skip
    if args.truth_only or args.train_seed != args.seed or measured < MIN_RANKED:
        return subnets, []
    results = []
    for rule in args.sampling.split(","):
        run = scores.get(name, rule, subnets) if scores else None
        if run is None and args.rank_only:
            print(f"  [{name} {rule}] no kept scores of this supernet in {args.scores} (--rank-only trains none)",
                  file=sys.stderr, flush=True)  # fmt: skip
            continue
        if run is None:
            run = (score_with_split_supernets if args.split_by else score_with_supernet)(space, subnets, task, rule,
                                                                                         args)  # fmt: skip
            if scores:
                scores.add(run, passes=run["subnet_passes"] if args.supernet_seconds is not None else None)
        results.append(rank(run, subnets, truth_rows))
    return subnets, results
