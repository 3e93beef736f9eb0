"""`make demo`: train small models on generated ListOps, report accuracy and latency."""

from __future__ import annotations

import logging
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    import xsearch
    from xsearch.latency import measure
    from xsearch.tasks import get_task

    argv = sys.argv[1:] if argv is None else argv
    seconds = float(argv[0]) if argv else 45.0
    logging.basicConfig(level=logging.WARNING)
    console = Console()
    torch.set_num_threads(2)
    console.print("[bold]xsearch demo[/]: ListOps (lengths 64-256), 2-layer models, d_model 64")
    task = get_task("listops", n_train=2000, n_valid=200, n_test=200)
    rows = []
    for attention, params in (("full", {}), ("linear", {}), ("local", {"block_size": 32})):
        torch.manual_seed(0)
        cfg = xsearch.ModelConfig(
            **task.model_fields(),
            d_model=64,
            n_layers=2,
            n_heads=4,
            d_ff=128,
            attention=attention,
            attention_params=params,
        )
        model = xsearch.build_model(cfg)
        console.print(f"training [cyan]{attention}[/] for {seconds:.0f} s ...")
        result = xsearch.train(model, task, seconds=seconds, batch_size=32, lr=2e-3, progress=True)
        acc = xsearch.evaluate(model, task, "test")
        lat = measure(model, "torch-cpu", seq_len=task.max_len, threads=2, repeats=20)
        xsearch.save_model(model, f"runs/demo/{attention}", task=task.describe())
        rows.append((attention, result.steps, acc, lat.median_ms, lat.p90_ms, xsearch.count_parameters(model)))
    table = Table(title="ListOps test accuracy and torch-cpu latency (batch 1, 256 tokens, 2 threads)")
    for col in ("attention", "steps", "accuracy", "median ms", "p90 ms", "speedup vs full", "parameters"):
        table.add_column(col, justify="right")
    base = rows[0][3]
    for name, steps, acc, med, p90, params in rows:
        table.add_row(name, str(steps), f"{acc:.3f}", f"{med:.2f}", f"{p90:.2f}", f"{base / med:.2f}x", f"{params:,}")
    console.print(table)
    console.print("models saved under runs/demo/ (try: xsearch eval runs/demo/linear)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
