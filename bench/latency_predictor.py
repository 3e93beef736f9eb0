"""How well the latency predictor predicts unseen architectures of the ``default`` space.

Sweeps the ``default`` space on ListOps (max_len 1024) with target ``ort-cpu`` and 2 threads,
measuring random architectures without training them (``xsearch latency sweep``), fits the
predictor (``xsearch latency fit``) and prints, for architectures held out of the fit: MAPE,
Kendall tau and the worst errors by attention variant. ``--mixed`` adds a second sweep whose
architectures are each measured at one of 256, 512 and 1024 tokens.

Each architecture is exported to ONNX (a few seconds) and timed; the latency cache keeps the
measurements, so a re-run with the same storage and seed costs only the fit. On a shared
machine only runs that other processes did not slow down are kept (see ``--wait-idle``).

    python bench/latency_predictor.py [--samples 80] [--mixed] [--mixed-samples 80] [--storage URL]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

from xsearch.latency_predictor import LatencyPredictor, fit_with_holdout
from xsearch.latency_sweep import SweepSettings, describe_device, rows_from_study, run_sweep, select_rows

THREADS = 2
TASK_OPTIONS = {"max_len": 1024, "n_train": 64, "n_valid": 16, "n_test": 16}  # only the model fields are used


def sweep_and_fit(name: str, samples: int, seq_lens: list[int], args) -> tuple[LatencyPredictor, dict]:
    start = time.perf_counter()
    settings = SweepSettings(
        task="listops", task_options=TASK_OPTIONS, space="default", target="ort-cpu", samples=samples,
        storage=args.storage, study=name, seq_lens=seq_lens, threads=THREADS, latency_repeats=10, seed=args.seed,
        wait_idle=args.wait_idle,
    )  # fmt: skip
    study = run_sweep(settings, progress=not args.quiet)
    sweep_s = time.perf_counter() - start
    rows = select_rows(rows_from_study(study), target="ort-cpu", threads=THREADS)
    start = time.perf_counter()
    predictor = fit_with_holdout(rows, test_fraction=args.test_fraction, seed=args.seed)
    trials = [t for t in study.get_trials(deepcopy=False) if "latency" in t.user_attrs]
    info = {
        "sweep_s": sweep_s,
        "fit_s": time.perf_counter() - start,
        "measured": sum(not t.user_attrs.get("latency_cached") for t in trials),
        "disturbed": sum(bool(t.user_attrs.get("latency_disturbed")) for t in trials),
        "device": describe_device(rows[0].device or {}),
    }
    return predictor, info


def print_tables(runs: list[tuple[str, LatencyPredictor, dict]]) -> None:
    print(f"\ntarget ort-cpu, {THREADS} threads, batch 1; {runs[0][2]['device']}")
    print("held-out = architectures never seen by the fit (split by architecture, seeded)\n")
    head = f"{'sweep':22s} {'rows train/test':>15s} {'archs train/test':>16s} {'MAPE %':>7s} {'Kendall tau':>11s}"
    print(head + f" {'sweep min':>9s} {'fit s':>6s} {'left out':>8s}")
    for name, p, info in runs:
        m = p.metrics
        print(f"{name:22s} {m['n_train']:>7d}/{m['n_test']:<7d} {m['n_train_architectures']:>8d}/"
              f"{m['n_test_architectures']:<7d} {m['mape']:7.1f} {m['kendall_tau']:11.3f} {info['sweep_s'] / 60:9.1f} "
              f"{info['fit_s']:6.1f} {info['disturbed']:8d}")  # fmt: skip
    print("\n(sweep min: wall time of the sweep, where cached measurements cost nothing; left out: measurements")
    print(" that other processes kept disturbing for --wait-idle seconds, not used by the fit)")
    for name, p, info in runs:
        print(f"\nerrors by variant, {name} ({info['measured']} architectures measured in this run):")
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
    p.add_argument("--wait-idle", type=float, default=120.0, help="see `xsearch latency sweep --wait-idle`")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    for noisy in ("torch", "onnxscript", "onnx_ir"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    runs = [("seq_len 1024", *sweep_and_fit("bench-1024", args.samples, [1024], args))]
    if args.mixed:
        runs.append(("seq_len 256/512/1024", *sweep_and_fit("bench-mixed", args.mixed_samples, [256, 512, 1024], args)))
    print_tables(runs)


if __name__ == "__main__":
    main()
