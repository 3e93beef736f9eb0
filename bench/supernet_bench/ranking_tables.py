"""``--tables ranking``: the ground truth, the ranking fidelity, the fine-tune's and its control's, and the cost."""

from __future__ import annotations

import numpy as np

from supernet_bench.ground_truth import ground_noise, print_ground_truth
from supernet_bench.ledgers import Ledger, Scores, ScratchLedger
from supernet_bench.ranking import MIN_RANKED, run_space
from supernet_bench.stats import noise_ceiling
from xsearch.supernet.settings import LAYOUT_DEFAULTS


def sampling(r: dict, seed: int) -> str:
    """The sampling rule (with its shrink fraction), the supernet's seed where it is not ``seed`` (``--seed``,
    which seeded the lines from before ``--supernet-seed``), and the warm start if any (with the reference's own
    test accuracy)."""
    rule = r["sampling"] + (f" (shrink fraction {r['shrink_fraction']:g})" if "shrink_fraction" in r else "")
    if r.get("supernet_seed", seed) != seed:
        rule += f", supernet seed {r['supernet_seed']}"
    for key, default in LAYOUT_DEFAULTS.items():
        if r.get(key, default) != default:
            rule += f", {key.replace('_', ' ')} {r[key]}"
    if r.get("split_by"):
        rule += f", split by {r['split_by']} ({len(r['split'])} supernets, no weight shared across them)"
    if not r.get("warm_start"):
        return rule
    return f"{rule}, warm start (reference {r['warm_start']} steps: test {r['warm_start_test']:.4f})"


def print_ranking(task, args) -> dict:
    ledger = Ledger(args.ledger, args) if args.ledger else None
    scores = Scores(args.scores, args) if args.scores else None
    scratch_ledger = ScratchLedger(args.scratch_ledger, args) if args.scratch_ledger and args.from_scratch else None
    drawn, results = {}, []
    for name in args.spaces.split(","):
        drawn[name], ranked = run_space(name, task, args, ledger, scores, scratch_ledger)
        results += ranked
    ground = print_ground_truth(task, args, ledger, drawn) if ledger else {}
    if not results:
        if not args.truth_only and args.train_seed == args.seed:
            print(f"no ranking table: fewer than {MIN_RANKED} subnets of each space have standalone figures")
        return {"ground_truth": ground, "rankings": []}
    for r in results:  # the ground truth's ceiling, over the subnets ranked (all those the ledger holds)
        truth = [row["standalone_test"] for row in r["rows"]]
        if r["space"] in ground:
            r["perfect_ranker_tau"] = ground[r["space"]]["perfect_ranker_tau"]
        else:
            r["perfect_ranker_tau"] = noise_ceiling(truth, ground_noise(ledger, float(np.mean(truth)), args.n_eval)[0])
    protocol = args.max_len >= 512 and args.subnets >= 24 and args.standalone_steps >= 1000
    print()
    supernet = (f"{args.supernet_seconds:g} s (its passes in each row)" if args.supernet_seconds is not None
                else f"{args.supernet_steps} steps")  # fmt: skip
    print(f"{args.subnets} subnets per space; supernet {supernet}, proxy {args.proxy_steps}, "
          f"standalone {args.standalone_steps} steps; "
          + ("the issue's protocol" if protocol else "SMALLER than the issue's protocol (512 tokens, 24 subnets, "
             ">= 1,000 standalone steps)"))  # fmt: skip
    if partial := [r for r in results if r["subnets"] < r["drawn"]]:
        print("PARTIAL: " + "; ".join(f"{r['space']} ({r['sampling']}) ranked over the {r['subnets']} of its "
                                      f"{r['drawn']} subnets whose standalone figures are measured" for r in partial)
              + " (the ones left are mostly the slowest to train, so these are not a uniform draw)")  # fmt: skip
    print("Ranking fidelity (Kendall tau-b against standalone test accuracy"
          + (f", the mean over training seeds {', '.join(map(str, args.truth_seeds))}" if len(args.truth_seeds) > 1
             else "") + "; target: inherited >= 0.6 and above the proxy). p: the share of random orders of the "
          "same scores that rank at least as well (one-sided permutation test): a tau whose p is not small says "
          "no more than chance")  # fmt: skip
    print(
        "| space | sampling | subnets | tau inherited accuracy / loss (supernet; p) | the same within one width "
        "(the most common; p) | inherited validation "
        f"accuracy min-max (distinct values) / loss min-max | tau proxy (from scratch, {args.proxy_steps} steps; p) "
        "| tau by size alone: narrower / fewer parameters first | tau of a perfect "
        "ranker (the ground truth's noise) | standalone test of the "
        "pick by inherited accuracy / by inherited loss / by proxy / best | chance |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")

    def ranked(t: float, p: float) -> str:
        return f"{t:.3f} (p {p:.3f})" if t == t else "none (every subnet ties)"

    def picked(p: dict) -> str:
        return f"{p['test']:.4f}" + (f" (mean of a {p['tied']}-way tie)" if p["tied"] > 1 else "")

    for r in results:
        spread, within = r["inherited_spread"], r["within_width"]
        print(f"| {r['space']} | {sampling(r, args.seed)} | {r['subnets']} of {r['drawn']} | "
              f"{ranked(r['tau_inherited'], r['p_inherited'])} / "
              f"{ranked(r['tau_inherited_loss'], r['p_inherited_loss'])} | d{within['d_model']} "
              f"({within['subnets']}): {ranked(within['tau_inherited'], within['p_inherited'])} / "
              f"{ranked(within['tau_inherited_loss'], within['p_inherited_loss'])} | "
              f"{spread['min']:.4f}-{spread['max']:.4f} ({spread['distinct']}) / {spread['loss_min']:.3f}-"
              f"{spread['loss_max']:.3f} | {ranked(r['tau_proxy'], r['p_proxy'])} | {r['tau_narrower']:.3f} / "
              f"{r['tau_fewer_parameters']:.3f} | {r['perfect_ranker_tau'][0]:.2f} | "
              f"{picked(r['pick_by_inherited'])} / {picked(r['pick_by_inherited_loss'])} / "
              f"{picked(r['pick_by_proxy'])} / {r['best']:.4f} | {task.chance('test'):.4f} |")  # fmt: skip
    if tuned := [r for r in results if r.get("inherited_finetune")]:
        print()
        print("The inherited weights as a start: each subnet trained more steps from them, then scored on the "
              "validation split (beside the proxy: as many or more steps from new weights)")  # fmt: skip
        print("| space | sampling | fine-tune | tau fine-tuned accuracy / loss (p) | the same within one width (p) | "
              "tau proxy (p) | standalone test of the pick by fine-tuned accuracy / loss / proxy / best | "
              "seconds per candidate (fine-tune) | chance |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
        for r in tuned:
            within = r["within_width"]
            print(f"| {r['space']} | {sampling(r, args.seed)} | {r['inherited_finetune']} steps | "
                  f"{ranked(r['tau_finetuned'], r['p_finetuned'])} / "
                  f"{ranked(r['tau_finetuned_loss'], r['p_finetuned_loss'])} | d{within['d_model']} "
                  f"({within['subnets']}): {ranked(within['tau_finetuned'], within['p_finetuned'])} / "
                  f"{ranked(within['tau_finetuned_loss'], within['p_finetuned_loss'])} | "
                  f"{ranked(r['tau_proxy'], r['p_proxy'])} ({args.proxy_steps} steps) | "
                  f"{picked(r['pick_by_finetuned'])} / {picked(r['pick_by_finetuned_loss'])} / "
                  f"{picked(r['pick_by_proxy'])} / {r['best']:.4f} | {r['finetune_s']:.0f} | "
                  f"{task.chance('test'):.4f} |")  # fmt: skip
    scratch: dict[str, dict] = {}  # each space's first ranking (the figures are the same in its others)
    for r in results:
        if "scratch_s" in r:
            scratch.setdefault(r["space"], r)
    if scratch:
        print()
        print(f"From new weights: each subnet trained {args.from_scratch} steps from new weights with the proxy's "
              "recipe, then scored on the validation split (the fine-tune's control: the same recipe from another "
              "start; one row per space, as it does not depend on the supernet, set beside the space's first ranked "
              "supernet's fine-tune)")  # fmt: skip
        print("| space | steps | tau accuracy / loss (p) | the same within one width (p) | standalone test of the "
              "pick by accuracy / loss / best | seconds per candidate | tau of the fine-tune minus this, by "
              "accuracy / loss (90% interval, paired bootstrap over the subnets) | chance |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")

        def minus(d: dict | None) -> str:
            return f"{d['difference']:+.3f} ({d['low']:+.2f} to {d['high']:+.2f})" if d else "-"

        for r in scratch.values():
            within = r["within_width"]
            print(f"| {r['space']} | {args.from_scratch} | {ranked(r['tau_scratch'], r['p_scratch'])} / "
                  f"{ranked(r['tau_scratch_loss'], r['p_scratch_loss'])} | d{within['d_model']} "
                  f"({within['subnets']}): {ranked(within['tau_scratch'], within['p_scratch'])} / "
                  f"{ranked(within['tau_scratch_loss'], within['p_scratch_loss'])} | "
                  f"{picked(r['pick_by_scratch'])} / {picked(r['pick_by_scratch_loss'])} / {r['best']:.4f} | "
                  f"{r['scratch_s']:.0f} | {minus(r.get('finetuned_minus_scratch'))} / "
                  f"{minus(r.get('finetuned_minus_scratch_loss'))} | {task.chance('test'):.4f} |")  # fmt: skip
    print()
    print("Cost")
    print(
        "| space | sampling | supernet parameters | supernet training | one standalone model (mean) | "
        "seconds per scored candidate | candidates per minute |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        warm = (f" + the reference's {r['warm_start']} steps alone, {r['warm_start_seconds']:.0f} s"
                if r.get("warm_start") else "")  # fmt: skip
        print(f"| {r['space']} | {sampling(r, args.seed)} | {r['supernet_parameters']:,} | {r['supernet_steps']} steps "
              f"({r['subnet_passes']} subnet passes), "
              f"{r['supernet_seconds']:.0f} s{warm} | {args.standalone_steps} steps, "
              + (f"{r['standalone_s']:.0f} s over {r['standalone_rows']} rows of this machine and threads "
                 f"(supernet = {r['supernet_seconds'] / r['standalone_s']:.2f}x)" if r["standalone_rows"]
                 else "no row measured on this machine and threads")
              + f" | {r['score_s']:.2f} | "
              f"{60 / r['score_s']:.0f} |")  # fmt: skip
    return {"ground_truth": ground, "rankings": results}
