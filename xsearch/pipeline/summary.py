"""The final summary of ``xsearch run``: the reference Transformer, the searched model and the shipped model
side by side (``summary.json``, ``summary.md`` and a table in the terminal)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xsearch.serialization import atomic_write_text

ROWS = (
    ("reference", "reference Transformer (fp32)"),
    ("searched", "searched model (fp32)"),
    ("shipped", "shipped model"),
)


def build_summary(ctx) -> dict[str, Any]:
    """Collect the figures of a finished run from its stage results."""
    import xsearch
    from xsearch.search import metric_name

    verify = ctx.result("verify")
    pick = ctx.result("pick")
    search = ctx.result("search")
    quantize = ctx.result("quantize")
    sources = {"reference": ctx.result("reference"), "searched": ctx.result("train"), "shipped": ctx.result("compress")}
    models = {}
    for name, _ in ROWS:
        v = verify["models"][name]
        models[name] = {
            "description": sources[name]["description"],
            "parameters": sources[name]["parameters"],
            "test_metric": v["test_metric"],
            "latency_ms": v["latency"]["median_ms"],
            "latency_p90_ms": v["latency"]["p90_ms"],
            "size_bytes": v["size_bytes"],
            "file": v["file"],
        }
    models["shipped"]["quantization"] = quantize["mode"]
    higher_is_better = ctx.task.kind != "lm"

    def versus(name: str) -> dict[str, float]:
        a, ref = models[name], models["reference"]
        delta = a["test_metric"] - ref["test_metric"]
        return {
            "speedup": ref["latency_ms"] / a["latency_ms"],
            "smaller": ref["size_bytes"] / a["size_bytes"],
            "fewer_parameters": ref["parameters"] / a["parameters"],
            "metric_delta": delta,
            "metric_delta_points": (100 * delta) if higher_is_better else delta,
        }

    return {
        "run": str(ctx.run.root),
        "xsearch_version": xsearch.__version__,
        "task": {"name": ctx.task.name, "max_len": ctx.task.max_len},
        "metric": metric_name(ctx.task.kind),
        "higher_is_better": higher_is_better,
        "target": verify["target"],
        "search_target": ctx.cfg.target,
        "seq_len": verify["seq_len"],
        "batch": verify["batch"],
        "threads": verify["threads"],
        "models": models,
        "searched_vs_reference": versus("searched"),
        "shipped_vs_reference": versus("shipped"),
        "search": {
            "space": ctx.cfg.search.space,
            "trials": search["trials"],
            "pareto_front": search["front"],
            "picked_trial": pick["trial"],
            "budget_ms": pick["budget_ms"],
            "pareto_png": "02-report/pareto.png",
            "pareto_html": "02-report/pareto.html",
        },
    }


def write_summary(summary: dict[str, Any], root: Path) -> None:
    atomic_write_text(root / "summary.json", json.dumps(summary, indent=2))
    atomic_write_text(root / "summary.md", summary_markdown(summary))


def _cells(summary: dict[str, Any], name: str) -> list[str]:
    m = summary["models"][name]
    cells = [
        f"{m['test_metric']:.4f}",
        f"{m['latency_ms']:.2f}",
        f"{m['parameters']:,}",
        f"{m['size_bytes'] / 1e6:.3f}",
    ]
    if name == "reference":
        return cells + ["1.00x", "1.00x", "-"]
    v = summary[f"{name}_vs_reference"]
    delta = f"{v['metric_delta_points']:+.1f} pts" if summary["higher_is_better"] else f"{v['metric_delta']:+.4f}"
    return cells + [f"{v['speedup']:.2f}x", f"{v['smaller']:.2f}x", delta]


def _header(summary: dict[str, Any]) -> list[str]:
    return ["model", f"test {summary['metric']}", "latency ms", "parameters", "file MB", "speedup", "smaller", "delta"]


def summary_markdown(summary: dict[str, Any]) -> str:
    s = summary
    shipped = s["models"]["shipped"]
    lines = [
        f"# xsearch run: {s['run']}",
        "",
        f"Task `{s['task']['name']}` (max_len {s['task']['max_len']}), latency on `{s['target']}` at batch "
        f"{s['batch']}, {s['seq_len']} tokens, {s['threads']} threads, measured interleaved in one process; "
        f"test-split {s['metric']} computed through onnxruntime from the ONNX files.",
        "",
        "| " + " | ".join(_header(s)[:1] + ["architecture"] + _header(s)[1:]) + " |",
        "|" + "---|" * (len(_header(s)) + 1),
    ]
    for name, label in ROWS:
        lines.append(f"| {label} | {s['models'][name]['description']} | " + " | ".join(_cells(s, name)) + " |")
    v = s["shipped_vs_reference"]
    lines += [
        "",
        f"The shipped model ({shipped['quantization']}) is **{v['speedup']:.2f}x faster** and "
        f"**{v['smaller']:.2f}x smaller** than the reference Transformer, "
        + (
            f"{v['metric_delta_points']:+.1f} points of {s['metric']}."
            if s["higher_is_better"]
            else f"{v['metric_delta']:+.4f} {s['metric']}."
        ),  # fmt: skip
        "",
        f"Search: space `{s['search']['space']}`, trials: "
        + ", ".join(f"{n} {state.lower()}" for state, n in sorted(s["search"]["trials"].items()))
        + f"; picked trial "
        f"{s['search']['picked_trial']}"
        + (f" under {s['search']['budget_ms']:.2f} ms" if s["search"]["budget_ms"] else "")
        + f"; Pareto front {s['search']['pareto_front']}.",  # fmt: skip
        "",
        f"![Pareto front]({s['search']['pareto_png']}) (interactive: [{s['search']['pareto_html']}]"
        f"({s['search']['pareto_html']}))",
        "",
        "Deploy:",
        "",
        "```bash",
        f"xsearch predict {s['run']}/{shipped['file']} --input -",
        f"xsearch serve {s['run']}/{shipped['file']} --host 127.0.0.1 --port 8080",
        "```",
        "",
    ]
    return "\n".join(lines)


def print_summary(summary: dict[str, Any], console=None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=max(Console().width, 100))  # the table needs ~90 columns, also in logs
    s = summary
    title = f"{s['run']}: {s['task']['name']} on {s['target']} ({s['seq_len']} tokens, {s['threads']} threads)"
    table = Table(box=box.SIMPLE_HEAD, title=title)
    for i, col in enumerate(_header(s)):
        table.add_column(col, justify="left" if i == 0 else "right")
    for name, _ in ROWS:
        table.add_row(name, *_cells(s, name))
    console.print(table)
    for name, label in ROWS:
        console.print(f"  {name:9s} {s['models'][name]['description']}  ({label})", highlight=False, soft_wrap=True)
    v = s["shipped_vs_reference"]
    console.print(f"shipped: {s['run']}/{s['models']['shipped']['file']}  ({v['speedup']:.2f}x faster, "
                  f"{v['smaller']:.2f}x smaller)\nsummary: {s['run']}/summary.md   "
                  f"plot: {s['run']}/{s['search']['pareto_png']}", soft_wrap=True, highlight=False)  # fmt: skip
