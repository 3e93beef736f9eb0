"""torch eager vs onnxruntime fp32 vs onnxruntime dynamic int8, per attention variant.

For each variant: a 2-layer classifier (d_model 256, 4 heads, max_len 4096) exported to ONNX
and quantized (dynamic int8), timed at N = 1024 and 4096, batch 1, 2 threads: the three
engines in alternating rounds, so they share the machine's load.
Then a ListOps model is trained briefly and the int8 model's test accuracy is compared
with the fp32 model's through the onnxruntime-only Predictor.

    python bench/export.py [--variants a,b] [--lengths 1024,4096] [--repeats 6] [--rounds 3]
                           [--train-seconds 120] [--markdown]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

import xsearch
from xsearch.export import Predictor, quantize_onnx, to_onnx
from xsearch.latency import measure, measure_interleaved
from xsearch.tasks import get_task

THREADS = 2
BENCH_PARAMS = {"local": {"block_size": 256}, "linformer": {"k": 256}, "performer": {"nb_features": 256}}


def speed_rows(names: list[str], lengths: list[int], repeats: int, rounds: int, work: Path) -> list[list[str]]:
    rows = []
    for name in names:
        torch.manual_seed(0)
        cfg = xsearch.ModelConfig(
            vocab_size=32, max_len=max(lengths), d_model=256, n_layers=2, n_heads=4, n_classes=10,
            attention=name, attention_params=BENCH_PARAMS.get(name, {}),
        )  # fmt: skip
        model = xsearch.build_model(cfg).eval()
        fp32, int8 = work / f"{name}.onnx", work / f"{name}.int8.onnx"
        try:
            to_onnx(model, fp32, check=False)
            quantize_onnx(fp32, int8, "dynamic-int8")
        except Exception as e:  # report and go on with the other variants
            rows.append([name, f"export failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}"])
            continue
        cells = [name]
        for n in lengths:
            # Alternating rounds (a warm-up run each), so a drift in machine load hits all three alike.
            st = measure_interleaved({"torch": model, "fp32": fp32, "int8": int8}, "ort-cpu", seq_len=n,
                                     threads=THREADS, warmup=1, repeats=repeats, rounds=rounds,
                                     targets={"torch": "torch-cpu"})  # fmt: skip
            t, f, q = (st[k].median_ms for k in ("torch", "fp32", "int8"))
            cells += [f"{t:.1f}", f"{f:.1f}", f"{q:.1f}", f"{t / f:.2f}x", f"{f / q:.2f}x"]
        print(f"  {' '.join(cells)}", file=sys.stderr, flush=True)
        rows.append(cells)
    return rows


def accuracy_rows(attention: str, seconds: float, work: Path) -> list[list[str]]:
    task = get_task("listops", n_train=4000, n_valid=200, n_test=1000)
    torch.manual_seed(0)
    cfg = xsearch.ModelConfig(**task.model_fields(), d_model=256, n_layers=2, n_heads=4, d_ff=512,
                              attention=attention, attention_params=BENCH_PARAMS.get(attention, {}))  # fmt: skip
    model = xsearch.build_model(cfg)
    xsearch.train(model, task, seconds=seconds, batch_size=32, lr=1e-3, progress=False)
    torch_acc = xsearch.evaluate(model, task, "test")
    fp32, int8 = work / "listops.onnx", work / "listops.int8.onnx"
    to_onnx(model, fp32, task=task.describe())
    quantize_onnx(fp32, int8, "dynamic-int8")
    rows = [["torch eager", f"{torch_acc:.4f}", "", ""]]
    for label, path in (("onnxruntime fp32", fp32), ("onnxruntime int8", int8)):
        p = Predictor(path, threads=THREADS)
        correct = total = 0
        for ids, mask, labels in task.batches("test", 64):
            pred = p.logits(ids.numpy(), mask.numpy()).argmax(-1)
            correct += int((pred == labels.numpy()).sum())
            total += len(labels)
        lat = measure(path, "ort-cpu", seq_len=task.max_len, threads=THREADS, repeats=20).median_ms
        rows.append([label, f"{correct / total:.4f}", f"{lat:.2f}", f"{path.stat().st_size / 1e6:.2f}"])
    return rows


def table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(r + [""] * (len(header) - len(r))) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(h), *(len(r[i]) if i < len(r) else 0 for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", help="comma-separated (default: all)")
    p.add_argument("--lengths", default="1024,4096")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds the repeats are spread over")
    p.add_argument("--accuracy-attention", default="local")
    p.add_argument("--train-seconds", type=float, default=120.0)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(THREADS)
    names = args.variants.split(",") if args.variants else xsearch.list_attentions()
    lengths = [int(x) for x in args.lengths.split(",")]
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        header = ["variant"]
        for n in lengths:
            header += [f"torch ms N={n}", "ort fp32 ms", "ort int8 ms", "fp32 vs torch", "int8 vs fp32"]
        print(f"latency, 2-layer d_model 256 classifier, batch 1, {THREADS} threads (median of {args.repeats})")
        print(table(header, speed_rows(names, lengths, args.repeats, args.rounds, work), args.markdown))
        if args.train_seconds > 0:
            what = f"{args.accuracy_attention}, d_model 256, trained {args.train_seconds:.0f} s"
            print(f"\nListOps test accuracy ({what})")
            rows = accuracy_rows(args.accuracy_attention, args.train_seconds, work)
            print(table(["engine", "test accuracy", "ort ms (N=256)", "file MB"], rows, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
