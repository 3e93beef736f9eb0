"""Does the search pay off? ``xsearch run`` on ListOps with lengths up to 1024, end to end, and the figures.

1. Search: among the trials at least ``--min-speedup`` times faster than the reference Transformer
   (median onnxruntime latency on this CPU, same study, same measurement), the most accurate one,
   against the reference's validation accuracy.
2. Pipeline: the shipped model (picked under ``pick.min_speedup``, trained, pruned, distilled from the
   reference, exported, int8) against the reference Transformer trained with the same budget: test
   accuracy through onnxruntime, latency measured interleaved in one process, file size.

Targets (issue 7): search >= 3x faster at <= 1 point lower accuracy; pipeline >= 5x faster and
>= 3.7x smaller within 1 point. Budgets are training *steps*, so the figures do not depend on how
busy the machine is; latency ratios come from the same run.

    python bench/pipeline.py                   # about 40 minutes on 2 cores
    python bench/pipeline.py --trials 6 --search-steps 10 --train-steps 40 --name bench-quick
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    import optuna

    from xsearch.pipeline import load_pipeline_config, run_pipeline
    from xsearch.pipeline.summary import print_summary, summary_markdown
    from xsearch.search import describe_trial, reference_trial, trial_latency_ms, trial_task_metric

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", default="bench-lo1024")
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--search-steps", type=int, default=60, help="training steps per search trial")
    p.add_argument("--train-steps", type=int, default=400, help="final training of the picked and reference models")
    p.add_argument("--finetune-steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--min-speedup", type=float, default=3.0)
    p.add_argument("--prune-heads", type=float, default=0.0)
    p.add_argument("--prune-ffn", type=float, default=0.5)
    args = p.parse_args(argv)

    overrides = {
        "task.options": {"max_len": args.max_len, "n_train": 4000, "n_valid": 300, "n_test": 500},
        "search.space": "default",
        "search.trials": args.trials,
        "search.train_steps": args.search_steps,
        "search.train_seconds": None,
        "search.batch_size": args.batch_size,
        "search.lr": 0.001,
        "search.latency_repeats": 10,
        "pick.min_speedup": args.min_speedup,
        "train.steps": args.train_steps,
        "train.seconds": None,
        "train.batch_size": args.batch_size,
        "train.lr": 0.001,
        "compress.prune_heads": args.prune_heads,
        "compress.prune_ffn": args.prune_ffn,
        "compress.finetune_steps": args.finetune_steps,
        "compress.batch_size": args.batch_size,
        "compress.lr": 0.0005,
        "verify.latency_repeats": 30,
    }
    cfg = load_pipeline_config(None, overrides, name=args.name)
    cfg.runs_dir = args.runs_dir
    summary = run_pipeline(cfg, progress=sys.stdout.isatty())

    study = optuna.load_study(
        study_name="search", storage=f"sqlite:///{(cfg.run_dir / '01-search' / 'study.db').resolve()}"
    )
    ref = reference_trial(study)
    done = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    fast = [t for t in done if trial_latency_ms(ref) / trial_latency_ms(t) >= args.min_speedup]
    best = max(fast, key=lambda t: trial_task_metric(t), default=None)
    print(f"\n## Search ({len(done)} complete trials, ListOps max_len {args.max_len}, {args.search_steps} steps each)")
    print("| trial | architecture | valid accuracy | latency ms | speedup | delta |\n|---|---|---|---|---|---|")
    for t in [ref] + ([best] if best else []):
        label = f"{t.number} (reference)" if t is ref else str(t.number)
        accuracy = trial_task_metric(t)
        speedup, delta = trial_latency_ms(ref) / trial_latency_ms(t), 100 * (accuracy - trial_task_metric(ref))
        print(f"| {label} | {describe_trial(t)} | {accuracy:.4f} | {trial_latency_ms(t):.2f} | {speedup:.2f}x | "
              f"{delta:+.1f} pts |")  # fmt: skip
    if best is None:
        print(f"no trial at least {args.min_speedup}x faster than the reference")
    print("\n## Pipeline\n")
    print(summary_markdown(summary))
    print_summary(summary)
    v = summary["shipped_vs_reference"]
    verdict = {
        "search_ok": best is not None and 100 * (trial_task_metric(best) - trial_task_metric(ref)) >= -1.0,
        "pipeline_ok": v["speedup"] >= 5 and v["smaller"] >= 3.7 and v["metric_delta_points"] >= -1.0,
    }
    print(json.dumps(verdict))
    (Path(cfg.run_dir) / "bench.json").write_text(json.dumps({"args": vars(args), **verdict}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
