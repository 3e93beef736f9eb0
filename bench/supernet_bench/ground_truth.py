"""The ground truth's own table: the standalone figures' spread beside their noise, and how repeatable they are."""

from __future__ import annotations

import numpy as np

from supernet_bench.ledgers import Ledger
from supernet_bench.ranking import MIN_RANKED
from supernet_bench.stats import noise_ceiling, tau
from xsearch.config import describe_config


def ground_noise(ledger: Ledger | None, mean: float, n_test: int) -> tuple[float, str]:
    """The noise of one standalone figure on this test split: the spread of subnets trained with several seeds
    (``--train-seed``), pooled, where the ledger holds any. Without them, the binomial sampling noise of the
    split's size stands in; it overstates the noise of a comparison on one shared split, where models of
    one architecture tend to miss the same examples (on ListOps 512 the seeds' spread came out lower)."""
    sq, dof = 0.0, 0
    for by_seed in ledger.repeats.values() if ledger else []:
        if len(by_seed) >= 2:
            v = np.asarray(list(by_seed.values()))
            sq, dof = sq + float(((v - v.mean()) ** 2).sum()), dof + v.size - 1
    if dof:
        return (sq / dof) ** 0.5, f"training seeds, {dof} degrees of freedom"
    return (mean * (1 - mean) / n_test) ** 0.5, f"binomial, {n_test} examples; no seed repeats"


def print_ground_truth(task, args, ledger: Ledger, drawn: dict[str, list]) -> dict:
    """The standalone figures' spread beside their own noise: how high any ranking's tau can be against them
    (``drawn``: each space's subnets)."""
    print()
    seeds = args.truth_seeds
    print(f"Ground truth: standalone test accuracy after {args.standalone_steps} steps ("
          + (f"training seed {seeds[0]}" if len(seeds) == 1 else f"the mean over training seeds "
             f"{', '.join(map(str, seeds))}") + "), and the tau a ranker that knew each subnet's expected accuracy "
          "would reach against it; beside it, the tau between two training seeds' figures (what one seed's "
          "figures rank the other's with)")  # fmt: skip
    print("| space | subnets measured | standalone test min / mean / max | sd | noise sd | tau of a perfect ranker "
          "(5-95%) | tau seed against seed | chance |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    doc = {}
    for name, subnets in drawn.items():
        cells = [ledger.repeats.get((name, describe_config(cfg)), {}) for cfg in subnets]
        truth = [float(np.mean([c[seed] for seed in seeds])) for c in cells if all(seed in c for seed in seeds)]
        if len(truth) < MIN_RANKED:
            print(f"| {name} | {len(truth)} of {args.subnets} | - | - | - | - | - | {task.chance('test'):.4f} |")
            continue
        noise, source = ground_noise(ledger, float(np.mean(truth)), args.n_eval)
        if len(seeds) > 1:  # the noise of a mean over k independent trainings
            noise, source = noise / len(seeds) ** 0.5, f"{source}, over the mean of {len(seeds)}"
        ceiling = noise_ceiling(truth, noise)
        first, second = seeds[:2] if len(seeds) > 1 else (0, 1)  # (one seed ranked: retested on seeds 0 and 1)
        pairs = [(c[first], c[second]) for c in cells if first in c and second in c]
        retest = (f"{tau([a for a, _ in pairs], [b for _, b in pairs]):.3f} (seeds {first} and {second}, "
                  f"{len(pairs)} subnets)"
                  if len(pairs) >= MIN_RANKED else "-")  # fmt: skip
        doc[name] = {"measured": len(truth), "sd": float(np.std(truth, ddof=1)), "noise_sd": noise,
                     "noise_source": source, "perfect_ranker_tau": ceiling}  # fmt: skip
        print(f"| {name} | {len(truth)} of {args.subnets} | {min(truth):.4f} / {np.mean(truth):.4f} / "
              f"{max(truth):.4f} | {doc[name]['sd']:.4f} | {noise:.4f} ({source}) | {ceiling[0]:.2f} "
              f"({ceiling[1]:.2f} to {ceiling[2]:.2f}) | {retest} | {task.chance('test'):.4f} |")  # fmt: skip
    repeated = {key: by_seed for key, by_seed in ledger.repeats.items() if len(by_seed) >= 2}
    if repeated:
        print()
        print("Repeatability: subnets trained again with other seeds (--train-seed)")
        print("| space | subnet | standalone test by training seed | sd |")
        print("|---|---|---|---|")
        for (space, config), by_seed in sorted(repeated.items()):
            seeds = ", ".join(f"{seed}: {acc:.4f}" for seed, acc in sorted(by_seed.items()))
            print(f"| {space} | {config} | {seeds} | {np.std(list(by_seed.values()), ddof=1):.4f} |")
    return doc
