"""`make demo`: train small models on generated ListOps, compare accuracy and latency, then
export the fastest to ONNX, quantize it to int8 and classify a few examples with the
onnxruntime-only Predictor."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch

RUN = Path("runs/demo")


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    import xsearch
    from xsearch.export import Predictor, quantize_onnx, to_onnx
    from xsearch.latency import measure
    from xsearch.tasks import get_task

    argv = sys.argv[1:] if argv is None else argv
    seconds = float(argv[0]) if argv else 45.0
    logging.basicConfig(level=logging.WARNING)
    console = Console()
    torch.set_num_threads(2)
    console.print("[bold]xsearch demo[/]: ListOps (lengths 64-256), 2-layer models, d_model 64")
    task = get_task("listops", n_train=2000, n_valid=200, n_test=200)
    rows, models = [], {}
    for attention, params in (("full", {}), ("linear", {}), ("local", {"block_size": 32})):
        torch.manual_seed(0)
        cfg = xsearch.ModelConfig(
            **task.model_fields(), d_model=64, n_layers=2, n_heads=4, d_ff=128, attention=attention,
            attention_params=params,
        )  # fmt: skip
        model = xsearch.build_model(cfg)
        console.print(f"training [cyan]{attention}[/] for {seconds:.0f} s ...")
        result = xsearch.train(model, task, seconds=seconds, batch_size=32, lr=2e-3, progress=True)
        acc = xsearch.evaluate(model, task, "test")
        lat = measure(model, "torch-cpu", seq_len=task.max_len, threads=2, repeats=20)
        xsearch.save_model(model, RUN / attention, task=task.describe())
        models[attention] = model
        rows.append((attention, result.steps, acc, lat.median_ms, lat.p90_ms, xsearch.count_parameters(model)))
    table = Table(title="ListOps test accuracy and torch-cpu latency (batch 1, 256 tokens, 2 threads)")
    for col in ("attention", "steps", "accuracy", "median ms", "p90 ms", "speedup vs full", "parameters"):
        table.add_column(col, justify="right")
    base = rows[0][3]
    for name, steps, acc, med, p90, params in rows:
        table.add_row(name, str(steps), f"{acc:.3f}", f"{med:.2f}", f"{p90:.2f}", f"{base / med:.2f}x", f"{params:,}")
    console.print(table)

    # Deploy the fastest model: ONNX (checked against onnxruntime), int8, Predictor.
    fastest = min(rows, key=lambda r: r[3])[0]
    fp32, int8 = RUN / f"{fastest}.onnx", RUN / f"{fastest}.int8.onnx"
    report = to_onnx(models[fastest], fp32, task=task.describe())
    quantize_onnx(fp32, int8, "dynamic-int8")
    console.print(
        f"exported [cyan]{fastest}[/] to {fp32} (parity max |diff| {report.max_abs_diff:.1e}) and {int8} "
        f"({fp32.stat().st_size / 1e3:.0f} kB -> {int8.stat().st_size / 1e3:.0f} kB)"
    )
    for path in (fp32, int8):
        lat = measure(path, "ort-cpu", seq_len=task.max_len, threads=2, repeats=20)
        console.print(f"  onnxruntime {path.name}: {lat.median_ms:.2f} ms median")
    predictor = Predictor(int8, threads=2)
    seqs, labels = task.data["test"]
    examples = [task.encoding.decode(s) for s in seqs[:4]]
    for text, label, pred in zip(examples, labels[:4], predictor.predict(examples)):
        short = text if len(text) < 60 else text[:57] + "..."
        console.print(f"  {short:60s} true {label}  predicted {pred.label} ({pred.score:.2f})")
    console.print(f"models under {RUN}/ (try: .venv/bin/xsearch predict {int8} --input - <<< '\"[MAX 1 2 ]\"')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
