"""How well the latency predictor predicts unseen architectures of the ``default`` space.

Sweeps the ``default`` space on ListOps (max_len 1024) with target ``ort-cpu`` and 2 threads,
measuring random architectures without training them (``xsearch latency sweep``), fits the
predictor (``xsearch latency fit``) and prints, for architectures held out of the fit: MAPE,
Kendall tau and the worst errors by attention variant, over ``--splits`` different held-out
splits. ``--retest N`` times N held-out architectures a second time, in a group of their own, and
scores the predictions against both timings (how much of the error is measurement noise).
``--mixed`` adds a second sweep whose architectures are each measured at one of 256, 512 and 1024
tokens.

Each architecture is exported to ONNX (about ten seconds) and timed in groups with the space's
reference, the machine's speed divided out (see ``xsearch latency sweep --rounds/--group``); the
study keeps the measurements, so a re-run with the same storage costs only the fit.

    python bench/latency_predictor.py [--samples 80] [--splits 5] [--retest 40] [--mixed] [--storage URL]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

from xsearch.latency.device import describe_device
from xsearch.latency.predictor import (
    LatencyPredictor,
    fit_with_holdout,
    holdout_metrics,
    kendall_tau,
    mape,
    row_features,
    split_by_architecture,
)
from xsearch.latency.predictor.data import rows_from_study, select_rows
from xsearch.latency.sweep import SweepSettings, run_sweep

THREADS = 2
TASK_OPTIONS = {"max_len": 1024, "n_train": 64, "n_valid": 16, "n_test": 16}  # only the model fields are used


def sweep_and_fit(name: str, samples: int, seq_lens: list[int], args) -> tuple[LatencyPredictor, dict]:
    start = time.perf_counter()
    settings = SweepSettings(
        task="listops", task_options=TASK_OPTIONS, space="default", target="ort-cpu", samples=samples,
        storage=args.storage, study=name, seq_lens=seq_lens, threads=THREADS, latency_repeats=args.repeats,
        rounds=args.rounds, group=args.group, seed=args.seed,
    )  # fmt: skip
    study = run_sweep(settings, progress=not args.quiet)
    sweep_s = time.perf_counter() - start
    rows = select_rows(rows_from_study(study), target="ort-cpu", threads=THREADS)
    start = time.perf_counter()
    feats = [row_features(r) for r in rows]
    predictor = fit_with_holdout(rows, test_fraction=args.test_fraction, seed=args.seed, features=feats)
    fit_s = time.perf_counter() - start
    splits = [predictor.metrics] + [
        holdout_metrics(rows, feats, test_fraction=args.test_fraction, seed=args.seed + k)
        for k in range(1, args.splits)
    ]  # fmt: skip
    info = {
        "sweep_s": sweep_s,
        "fit_s": fit_s,
        "measured": len(rows),
        "device": describe_device(rows[0].device or {}),
        "splits": splits,
        "rows": rows,
        "study": study,
    }
    return predictor, info


def retest(predictor: LatencyPredictor, info: dict, args) -> dict:
    """Time ``args.retest`` held-out architectures again, in a group of their own with the reference.

    The second timing is scaled like the sweep's (by the reference's latency in its group against
    its median over the sweep), so the two labels of one architecture differ only by measurement
    noise; the held-out predictions for a typical session are scored against both (the retest's
    session is new: the fit knows no speed for it).
    """
    import torch

    import xsearch
    from xsearch.latency.rounds import time_in_rounds
    from xsearch.search_spaces import load_space
    from xsearch.tasks import get_task

    rows = info["rows"]
    held_out = split_by_architecture(rows, args.test_fraction, args.seed)[1]
    predicted = {i: m["predicted_typical_ms"] for i, m in zip(held_out, predictor.metrics["test"])}
    test = held_out[: args.retest]
    fields = get_task("listops", **TASK_OPTIONS).model_fields()
    torch.manual_seed(0)
    models = {"reference": xsearch.build_model(load_space("default", max_len=1024).reference_config(fields)).eval()}
    for i in test:
        models[str(i)] = xsearch.build_model(xsearch.ModelConfig.from_dict(rows[i].config)).eval()
    timed = time_in_rounds(models, "ort-cpu", seq_len=1024, threads=THREADS, per_round=-(-args.repeats // args.rounds),
                           rounds=args.rounds, seed=args.seed + 1)  # fmt: skip
    refs = [t.user_attrs["latency_reference_ms"] for t in info["study"].get_trials(deepcopy=False)
            if t.user_attrs.get("latency_reference_ms")]  # fmt: skip
    scale = statistics.median(refs) / timed.stats["reference"].median_ms
    again = [timed.stats[str(i)].median_ms * scale for i in test]
    first = [rows[i].latency_ms for i in test]
    pred = [predicted[i] for i in test]
    return {
        "n": len(test),
        "label_dev": 100 * statistics.fmean(abs(a - b) / b for a, b in zip(again, first)),
        "mape_first": mape(first, pred),
        "mape_again": mape(again, pred),
        "tau_first": kendall_tau(first, pred),
        "tau_again": kendall_tau(again, pred),
    }


def print_tables(runs: list[tuple[str, LatencyPredictor, dict]]) -> None:
    print(f"\ntarget ort-cpu, {THREADS} threads, batch 1; {runs[0][2]['device']}")
    print("held-out = architectures never seen by the fit (split by architecture, seeded)\n")
    head = f"{'sweep':22s} {'rows train/test':>15s} {'archs train/test':>16s} {'MAPE %':>7s} {'Kendall tau':>11s}"
    print(head + f" {'sweep min':>9s} {'fit s':>6s}")
    for name, p, info in runs:
        m = p.metrics
        print(f"{name:22s} {m['n_train']:>7d}/{m['n_test']:<7d} {m['n_train_architectures']:>8d}/"
              f"{m['n_test_architectures']:<7d} {m['mape']:7.1f} {m['kendall_tau']:11.3f} {info['sweep_s'] / 60:9.1f} "
              f"{info['fit_s']:6.1f}")  # fmt: skip
    print("\n(sweep min: wall time of this run's sweep; 0 when the study already held every sample)")
    for name, _, info in runs:
        splits = info["splits"]
        print(f"\n{name}: {len(splits)} held-out splits (split seed: MAPE %, tau)")
        print("  " + "  ".join(f"{m['split_seed']}: {m['mape']:.1f}, {m['kendall_tau']:.3f}" for m in splits))
        print(f"  mean MAPE {statistics.fmean(m['mape'] for m in splits):.1f} %, "
              f"mean tau {statistics.fmean(m['kendall_tau'] for m in splits):.3f}")  # fmt: skip
        print(f"  against a typical session's prediction (session speed not applied): mean MAPE "
              f"{statistics.fmean(m['mape_typical_session'] for m in splits):.1f} %, mean tau "
              f"{statistics.fmean(m['kendall_tau_typical_session'] for m in splits):.3f}")  # fmt: skip
    for name, p, info in runs:
        print(f"\nerrors by variant, {name} ({info['measured']} architectures measured):")
        cols = f"{'attention':18s} {'test rows':>9s} {'mean err %':>10s} {'max err %':>9s}"
        print(f"  {cols}  worst (measured -> predicted)")
        by: dict[str, list[dict]] = {}
        for row in p.metrics["test"]:
            row["err"] = 100 * abs(row["predicted_ms"] - row["measured_ms"]) / row["measured_ms"]
            by.setdefault(row["attention"], []).append(row)
        for attention, rows in sorted(by.items(), key=lambda kv: -max(r["err"] for r in kv[1])):
            worst = max(rows, key=lambda r: r["err"])
            print(f"  {attention:18s} {len(rows):9d} {statistics.fmean(r['err'] for r in rows):10.1f} "
                  f"{worst['err']:9.1f}  {worst['measured_ms']:.1f} -> {worst['predicted_ms']:.1f} ms "
                  f"at {worst['seq_len']}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=80, help="architectures of the seq_len 1024 sweep")
    p.add_argument("--mixed", action="store_true", help="also sweep with seq_len drawn from 256, 512, 1024")
    p.add_argument("--mixed-samples", type=int, default=80)
    p.add_argument("--storage", default="sqlite:///runs/latency_bench.db")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--repeats", type=int, default=30, help="timed runs per architecture (see `latency sweep`)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--group", type=int, default=50)
    p.add_argument("--splits", type=int, default=5, help="held-out splits to score (seeds seed, seed+1, ...)")
    p.add_argument("--retest", type=int, default=0, metavar="N",
                   help="time N held-out architectures again; score the predictions against both labels")  # fmt: skip
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    for noisy in ("torch", "onnxscript", "onnx_ir"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    runs = [("seq_len 1024", *sweep_and_fit("bench-1024", args.samples, [1024], args))]
    if args.mixed:
        runs.append(("seq_len 256/512/1024", *sweep_and_fit("bench-mixed", args.mixed_samples, [256, 512, 1024], args)))
    print_tables(runs)
    if args.retest:
        r = retest(runs[0][1], runs[0][2], args)
        print(f"\nretest: {r['n']} held-out architectures timed again in a group of their own (seq_len 1024)")
        print(f"  label vs label again: mean deviation {r['label_dev']:.1f} %")
        print(f"  typical-session predictions vs the sweep's labels: MAPE {r['mape_first']:.1f} %, "
              f"Kendall tau {r['tau_first']:.3f}")  # fmt: skip
        print(f"  typical-session predictions vs the second timing:  MAPE {r['mape_again']:.1f} %, "
              f"Kendall tau {r['tau_again']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
