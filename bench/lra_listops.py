"""ListOps with Long Range Arena's preset: the whole pipeline, with and without self-pretraining.

1. ``xsearch run`` on ``listops --preset lra`` (lengths up to 2,000; LRA's splits are 96,000 / 2,000 / 2,000,
   ``--n-train`` etc. take fewer, and the table says which) with ``pretrain.enabled``: search, pick, self-pretrain
   the pick and the reference (each ``--pretrain-steps``), fine-tune them (``--train-steps``), compress, export,
   int8, verify through onnxruntime.
2. The same two architectures trained from new weights with the same ``--train-steps``, exported and scored
   through onnxruntime: the "without pretraining" cells; and the searched one mean-pooled (ListOps' models read
   the first token, its outermost operator, by default): the "before" of that change.
3. A table (test accuracy through onnxruntime beside the majority class, latency from the run's verify stage,
   steps, CPU seconds) and ``curves.png``: validation accuracy against training steps of the four models.

Target (issue 18): within 2 hours on 2 cores, a shipped model >= 37.3% test accuracy and >= 3x faster than the
reference measured in the same run. Budgets are in steps; seconds depend on the machine's load.

    python bench/lra_listops.py [--n-train 96000] [--max-len 2000] [--trials 12] [--search-steps 40]
                                [--pretrain-steps 1000] [--train-steps 1000] [--batch-size 16] [--name lra]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def from_scratch(cfg, task, config: dict, work: Path, name: str) -> dict:
    """``config`` trained from new weights with the run's train: budget, exported and scored through onnxruntime."""
    from xsearch.export import to_onnx
    from xsearch.training import evaluate_onnx
    from xsearch.training.recipe import train_model

    start, cpu = time.perf_counter(), cpu_seconds()
    trained = train_model(config, task, cfg.train, progress=sys.stderr.isatty())
    path = work / f"{name}.onnx"
    to_onnx(trained.model, path, task=task.describe())
    test = evaluate_onnx(path, task, "test", threads=cfg.threads)
    return {"test": test, "steps": trained.result.steps, "seconds": time.perf_counter() - start,
            "cpu_seconds": cpu_seconds() - cpu,
            "history": [{"step": h["step"], "valid": h["valid"]} for h in trained.result.history]}  # fmt: skip


def first_token_baseline(task) -> float:
    """Test accuracy of answering, for each first token (ListOps: the outermost operator), the most frequent
    label it has on the train split: what a model that learns nothing but that token scores."""
    from collections import Counter, defaultdict

    seqs, labels = task.data["train"]
    by_first: dict[int, Counter] = defaultdict(Counter)
    for seq, label in zip(seqs, labels):
        by_first[int(seq[0])][int(label)] += 1
    overall = Counter(int(y) for y in labels).most_common(1)[0][0]
    answer = {first: counts.most_common(1)[0][0] for first, counts in by_first.items()}
    seqs, labels = task.data["test"]
    return sum(answer.get(int(seq[0]), overall) == int(y) for seq, y in zip(seqs, labels)) / len(labels)


def plot_curves(curves: dict[str, list[dict]], chance: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for label, history in curves.items():
        ax.plot([h["step"] for h in history], [h["valid"] for h in history], marker="o", label=label)
    ax.axhline(chance, color="#999", linestyle="--", linewidth=1, label=f"majority class {chance:.3f}")
    ax.axhline(0.3727, color="#c44", linestyle=":", linewidth=1, label="LRA's best efficient model (37.27)")
    ax.set_xlabel("training steps (after pretraining, where there is one)")
    ax.set_ylabel("validation accuracy")
    ax.set_title("ListOps (LRA preset): accuracy against training steps")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from xsearch.pipeline import load_pipeline_config, run_pipeline
    from xsearch.pipeline.summary import summary_markdown

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", default="bench-lra")
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--max-len", type=int, default=2000)
    p.add_argument("--n-train", type=int, default=96_000)
    p.add_argument("--n-valid", type=int, default=2_000)
    p.add_argument("--n-test", type=int, default=2_000)
    p.add_argument("--space", default="default")
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--search-steps", type=int, default=40)
    p.add_argument("--pretrain-steps", type=int, default=1000)
    p.add_argument("--train-steps", type=int, default=1000)
    p.add_argument("--finetune-steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument("--min-speedup", type=float, default=3.0)
    args = p.parse_args(argv)

    options = {"preset": "lra", "max_len": args.max_len, "n_train": args.n_train, "n_valid": args.n_valid,
               "n_test": args.n_test}  # fmt: skip
    overrides = {
        "task.options": options,
        "search.space": args.space,
        "search.trials": args.trials,
        "search.train_steps": args.search_steps,
        "search.train_seconds": None,
        "search.batch_size": args.batch_size,
        "search.lr": args.lr,
        "search.latency_repeats": 5,
        "pick.min_speedup": args.min_speedup,
        "pretrain.enabled": True,
        "pretrain.steps": args.pretrain_steps,
        "pretrain.batch_size": args.batch_size,
        "pretrain.lr": args.lr,
        "train.steps": args.train_steps,
        "train.seconds": None,
        "train.batch_size": args.batch_size,
        "train.lr": args.lr,
        "train.eval_every": max(args.train_steps // 10, 1),
        "compress.finetune_steps": args.finetune_steps,
        "compress.batch_size": args.batch_size,
        "verify.latency_repeats": 20,
    }
    cfg = load_pipeline_config(None, overrides, name=args.name)
    cfg.runs_dir = args.runs_dir
    start, cpu = time.perf_counter(), cpu_seconds()
    summary = run_pipeline(cfg, progress=sys.stdout.isatty())
    pipeline_seconds, pipeline_cpu = time.perf_counter() - start, cpu_seconds() - cpu

    from xsearch.pipeline.runner import RunFolder
    from xsearch.pipeline.stages import RunContext, stages_for

    ctx = RunContext(cfg, RunFolder(cfg.run_dir, stages_for(cfg)), progress=False)
    task, pick = ctx.task, ctx.result("pick")
    work = cfg.run_dir / "bench-from-scratch"
    work.mkdir(parents=True, exist_ok=True)
    scratch = {name: from_scratch(cfg, task, pick[key], work, name)
               for name, key in (("searched", "model_config"), ("reference", "reference_config"))}  # fmt: skip
    # before first-token pooling: the same searched architecture, mean-pooled, the same steps
    mean_pooled = from_scratch(cfg, task, {**pick["model_config"], "pooling": "mean"}, work, "searched-mean")
    chance, m = summary["chance"], summary["models"]
    stages = {name: ctx.result(name) for name in ("pretrain", "train", "reference")}
    rows = [
        ("reference, pretrained", m["reference"]["test_metric"], m["reference"]["latency_ms"],
         stages["pretrain"]["reference"]["steps"], stages["reference"]["steps"]),
        ("reference, from scratch", scratch["reference"]["test"], m["reference"]["latency_ms"], 0,
         scratch["reference"]["steps"]),
        ("searched, pretrained (fp32)", m["searched"]["test_metric"], m["searched"]["latency_ms"],
         stages["pretrain"]["picked"]["steps"], stages["train"]["steps"]),
        ("searched, from scratch (fp32)", scratch["searched"]["test"], m["searched"]["latency_ms"], 0,
         scratch["searched"]["steps"]),
        ("searched, from scratch, mean pooling (fp32)", mean_pooled["test"], m["searched"]["latency_ms"], 0,
         mean_pooled["steps"]),
        ("shipped (pretrained, pruned, int8)", m["shipped"]["test_metric"], m["shipped"]["latency_ms"],
         stages["pretrain"]["picked"]["steps"], stages["train"]["steps"]),
    ]  # fmt: skip
    ref_ms = m["reference"]["latency_ms"]
    lines = [f"ListOps, LRA preset: max_len {args.max_len}, splits {args.n_train:,} / {args.n_valid:,} / "
             f"{args.n_test:,} (LRA's: 96,000 / 2,000 / 2,000); batch {args.batch_size}; test accuracy through "
             f"onnxruntime; majority class {chance:.4f}", "",
             "| model | architecture | test accuracy | latency ms | speedup | pretrain steps | train steps |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, acc, ms, pre, steps in rows:
        arch = m["reference" if label.startswith("reference") else "searched"]["description"]
        if "mean pooling" in label:
            arch = arch.replace(" pool=first", "")  # (describe_config names a pooling other than the mean)
        lines.append(f"| {label} | {arch} | {acc:.4f} | {ms:.2f} | {ref_ms / ms:.2f}x | {pre} | {steps} |")
    lines.append(f"| majority class | - | {chance:.4f} | - | - | - | - |")
    lines.append(
        f"| majority answer of the first token (no model) | - | {first_token_baseline(task):.4f} | - | - | - | - |"
    )
    shipped = m["shipped"]
    met = shipped["test_metric"] >= 0.373 and ref_ms / shipped["latency_ms"] >= 3.0 and pipeline_seconds <= 7200
    lines += [
        "",
        f"Pipeline: {pipeline_seconds / 60:.1f} min wall, {pipeline_cpu / 60:.1f} min CPU; from-scratch "
        f"models: {sum(s['seconds'] for s in scratch.values()) / 60:.1f} min wall, "
        f"{sum(s['cpu_seconds'] for s in scratch.values()) / 60:.1f} min CPU. Pooling: "
        f"{pick['model_config'].get('pooling', 'mean')} (the task's default) unless the row says mean.",
        f"Target (>= 0.373, >= 3x faster than the reference, <= 2 h): {'met' if met else 'NOT met'}.",
    ]
    curves = {"reference, pretrained": stages["reference"]["history"],
              "reference, from scratch": scratch["reference"]["history"],
              "searched, pretrained": stages["train"]["history"],
              "searched, from scratch": scratch["searched"]["history"],
              "searched, from scratch, mean pooling": mean_pooled["history"]}  # fmt: skip
    plot_curves(curves, task.chance("valid"), cfg.run_dir / "curves.png")
    lines.append(f"Curves: {cfg.run_dir / 'curves.png'}")
    text = "\n".join(lines)
    print("\n" + summary_markdown(summary) + "\n" + text)
    (cfg.run_dir / "bench.md").write_text(text + "\n")
    (cfg.run_dir / "bench.json").write_text(json.dumps({"args": vars(args), "rows": rows, "curves": curves,
                                                        "met": met, "pipeline_seconds": pipeline_seconds,
                                                        "pipeline_cpu_seconds": pipeline_cpu}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
