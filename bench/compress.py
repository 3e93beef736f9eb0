"""Compression pay-off: prune + distill + int8 against the uncompressed fp32 model, one run.

A ListOps model (from a search study with --storage/--study, or a representative config) is
trained; a copy is pruned, fine-tuned with distillation from the original, exported and
quantized to dynamic int8. Both are timed under onnxruntime on this CPU and scored on the test
split through the Predictor. The three ONNX files are timed interleaved in one process
(``measure_interleaved``), so a change in machine load hits all three alike.

    python bench/compress.py [--storage sqlite:///runs/xsearch.db --study NAME] [--train-seconds 180]
                             [--max-len 256] [--heads 0.5] [--ffn 0.5]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import torch

import xsearch
from xsearch.compress import distill, prune
from xsearch.export import Predictor, quantize_onnx, to_onnx
from xsearch.latency import measure_interleaved
from xsearch.tasks import get_task

THREADS = 2


def accuracy(path: Path, task) -> float:
    p = Predictor(path, threads=THREADS)
    correct = total = 0
    for ids, mask, labels in task.batches("test", 64):
        correct += int((p.logits(ids.numpy(), mask.numpy()).argmax(-1) == labels.numpy()).sum())
        total += len(labels)
    return correct / total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--storage")
    p.add_argument("--study")
    p.add_argument("--max-latency-ms", type=float)
    p.add_argument("--train-seconds", type=float, default=180.0)
    p.add_argument("--distill-steps", type=int, default=1500)
    p.add_argument("--heads", type=float, default=0.5)
    p.add_argument("--ffn", type=float, default=0.5)
    p.add_argument("--max-len", type=int, default=256, help="ListOps sequence length (and the timed length)")
    args = p.parse_args()
    torch.set_num_threads(THREADS)
    task = get_task("listops", n_train=6000, n_valid=300, n_test=1000, max_len=args.max_len)
    if args.study:
        from xsearch.search.report import pick
        from xsearch.storage import load_study as load

        trial = pick(load(args.storage, args.study), args.max_latency_ms)
        cfg = xsearch.ModelConfig.from_dict(trial.user_attrs["model_config"])
        source = f"trial {trial.number} of study {args.study!r}"
    else:
        cfg = xsearch.ModelConfig(**task.model_fields(), d_model=128, n_layers=2, n_heads=4, d_ff=512,
                                  attention="local", attention_params={"block_size": 64})  # fmt: skip
        source = "representative config (local, d_model 128)"
    torch.manual_seed(0)
    model = xsearch.build_model(cfg)
    print(f"model: {source}: {cfg.attention} d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads",
          file=sys.stderr)  # fmt: skip
    xsearch.train(model, task, seconds=args.train_seconds, batch_size=32, lr=1e-3, progress=False)
    small = prune(copy.deepcopy(model), heads=args.heads, ffn=args.ffn)
    distill(small, model, task, steps=args.distill_steps, temperature=2.0, alpha=0.5, batch_size=32, lr=5e-4,
            progress=False)  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        base, pruned, q = Path(d) / "base.onnx", Path(d) / "pruned.onnx", Path(d) / "pruned.int8.onnx"
        to_onnx(model, base, task=task.describe())
        to_onnx(small, pruned, task=task.describe())
        quantize_onnx(pruned, q, "dynamic-int8")
        variants = (("fp32 (uncompressed)", model, base), ("pruned + distilled fp32", small, pruned),
                    ("pruned + distilled int8", small, q))  # fmt: skip
        stats = measure_interleaved({label: path for label, _, path in variants}, "ort-cpu", seq_len=task.max_len,
                                    threads=THREADS, repeats=60, rounds=6)  # fmt: skip
        rows = [(label, xsearch.count_parameters(m), path.stat().st_size, stats[label].median_ms, accuracy(path, task))
                for label, m, path in variants]  # fmt: skip
    base_row = rows[0]
    print(
        f"| model | parameters | file KB | ort-cpu ms (N={task.max_len}) | speedup | smaller | test accuracy | delta |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, params, size, lat, acc in rows:
        print(f"| {label} | {params:,} | {size / 1e3:.0f} | {lat:.2f} | {base_row[3] / lat:.2f}x | "
              f"{base_row[2] / size:.2f}x | {acc:.4f} | {100 * (acc - base_row[4]):+.1f} pts |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
