"""The final summary of ``xsearch run``: the reference Transformer, the searched model and the shipped model
side by side with the task's chance level (``summary.json``, ``summary.md`` and a table in the terminal).

A model that does not beat the chance level by a clear margin (two standard errors of an accuracy at
chance on the test split, and at least one point) is flagged, with what to raise: a speedup of a model
that learnt nothing is not a result.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from xsearch.serialization import atomic_write_text

ROWS = (
    ("reference", "reference Transformer (fp32)"),
    ("searched", "searched model (fp32)"),
    ("shipped", "shipped model"),
)


def chance_margin(chance: float, n_test: int, higher_is_better: bool) -> float:
    """How far past the chance level a metric must be to count as learnt: two standard errors of an accuracy
    at chance on ``n_test`` examples (at least one point); for bits per byte, 0.05 bits."""
    if not higher_is_better:
        return 0.05
    return max(0.01, 2.0 * math.sqrt(chance * (1.0 - chance) / max(n_test, 1)))


def beats_chance(metric: float, chance: float, margin: float, higher_is_better: bool) -> bool:
    return metric > chance + margin if higher_is_better else metric < chance - margin


def chance_warnings(models: dict[str, Any], chance: float, margin: float, higher_is_better: bool, cfg) -> list[str]:
    """One line per model that does not clearly beat the chance level, saying what to raise."""
    out = []
    for name, m in models.items():
        if beats_chance(m["test_metric"], chance, margin, higher_is_better):
            continue
        need = f"> {chance + margin:.4f}" if higher_is_better else f"< {chance - margin:.4f}"
        budget = (f"train.steps (now {cfg.train.steps})" if cfg.train.steps is not None
                  else f"train.seconds (now {cfg.train.seconds:g}; better, a step budget: train.steps)")  # fmt: skip
        if cfg.search.mode == "supernet":
            search = (f"supernet.steps (now {cfg.supernet.steps})" if cfg.supernet.steps is not None
                      else f"supernet.seconds (now {cfg.supernet.seconds:g})")  # fmt: skip
        elif cfg.search.train_steps is not None:
            search = f"search.train_steps (now {cfg.search.train_steps})"
        else:
            search = f"search.train_seconds (now {cfg.search.train_seconds:g})"
        out.append(f"the {name} model's test {m['metric']} {m['test_metric']:.4f} does not clearly beat the chance "
                   f"level {chance:.4f} (needs {need}): raise {budget}"
                   + (f" and {search}" if name != "reference" else "") + ", or train.lr")  # fmt: skip
    return out


def build_summary(ctx) -> dict[str, Any]:
    """Collect the figures of a finished run from its stage results."""
    import xsearch
    from xsearch.search.study import metric_name

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
    chance = verify["chance"]
    margin = chance_margin(chance, verify["test_size"], higher_is_better)
    for m in models.values():
        m["metric"] = metric_name(ctx.task.kind)
        m["beats_chance"] = beats_chance(m["test_metric"], chance, margin, higher_is_better)

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
        "chance": chance,
        "chance_kind": "unigram model" if ctx.task.kind == "lm" else "majority class",
        "chance_margin": margin,
        "warnings": chance_warnings(models, chance, margin, higher_is_better, ctx.cfg),
        "target": verify["target"],
        "search_target": ctx.cfg.target,
        "seq_len": verify["seq_len"],
        "latency_mode": verify.get("latency_mode", "forward"),
        "context": verify.get("context"),
        "batch": verify["batch"],
        "threads": verify["threads"],
        "models": models,
        "searched_vs_reference": versus("searched"),
        "shipped_vs_reference": versus("shipped"),
        "train_steps": {
            "search_per_trial": ctx.cfg.search.train_steps if ctx.cfg.search.mode == "standalone" else 0,
            "supernet": ctx.result("supernet")["steps"] if ctx.cfg.search.mode == "supernet" else None,
            "pretrain": {k: ctx.result("pretrain")[k]["steps"] for k in ("picked", "reference")}
            if ctx.cfg.pretrain.enabled
            else None,
            "searched": sources["searched"]["steps"],
            "reference": sources["reference"]["steps"],
            "finetune": ctx.cfg.compress.finetune_steps,
        },
        "search": {
            "mode": ctx.cfg.search.mode,
            "space": ctx.cfg.search.space,
            "trials": search["trials"],
            "duplicates": search.get("duplicates", 0),
            "pareto_front": search["front"],
            "picked_trial": pick["trial"],
            "budget_ms": pick["budget_ms"],
            "pareto_png": f"{ctx.folder('report').name}/pareto.png",
            "pareto_html": f"{ctx.folder('report').name}/pareto.html",
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


def _chance_cells(summary: dict[str, Any]) -> list[str] | None:
    """The table's chance row (None for a summary written before chance levels were recorded)."""
    if summary.get("chance") is None:
        return None
    return [f"{summary['chance']:.4f}"] + ["-"] * (len(_header(summary)) - 2)


def _chance_label(summary: dict[str, Any]) -> str:
    return f"chance ({summary.get('chance_kind', 'majority class')})"


def timed_what(summary: dict[str, Any]) -> str:
    """What each latency of the summary is: a forward pass, a prefill or one decode step."""
    mode = summary.get("latency_mode", "forward")
    if mode == "decode":
        return f"one decode step after {summary['context']} tokens"
    return f"{'a prefill of ' if mode == 'prefill' else ''}{summary['seq_len']} tokens"


def budget_line(summary: dict[str, Any]) -> str:
    """The run's training budgets, in steps (what a user reproduces)."""
    t = summary.get("train_steps") or {}
    if not t:
        return ""
    parts = [f"reference {t['reference']}", f"searched {t['searched']}", f"shipped's fine-tune {t['finetune']}"]
    if t.get("supernet"):
        parts.insert(0, f"supernet {t['supernet']}")
    elif t.get("search_per_trial"):
        parts.insert(0, f"search {t['search_per_trial']} per trial")
    pre = t.get("pretrain")
    if pre:
        parts.append(f"self-pretraining before training: reference {pre['reference']}, searched {pre['picked']}")
    return "Budgets in steps: " + "; ".join(parts) + "."


def _header(summary: dict[str, Any]) -> list[str]:
    return ["model", f"test {summary['metric']}", "latency ms", "parameters", "file MB", "speedup", "smaller", "delta"]


def summary_markdown(summary: dict[str, Any]) -> str:
    s = summary
    shipped = s["models"]["shipped"]
    lines = [
        f"# xsearch run: {s['run']}",
        "",
        f"Task `{s['task']['name']}` (max_len {s['task']['max_len']}), latency on `{s['target']}` at batch "
        f"{s['batch']}, {timed_what(s)}, {s['threads']} threads, measured interleaved in one process; "
        f"test-split {s['metric']} computed through onnxruntime from the ONNX files.",
        "",
        "| " + " | ".join(_header(s)[:1] + ["architecture"] + _header(s)[1:]) + " |",
        "|" + "---|" * (len(_header(s)) + 1),
    ]
    for name, label in ROWS:
        lines.append(f"| {label} | {s['models'][name]['description']} | " + " | ".join(_cells(s, name)) + " |")
    if _chance_cells(s):
        lines.append(f"| {_chance_label(s)} | - | " + " | ".join(_chance_cells(s)) + " |")
    v = s["shipped_vs_reference"]
    warnings = s.get("warnings") or []
    if warnings:
        lines += ["", "**Warning: a model here learnt nothing measurable; its speedup is not a result.**", ""]
        lines += [f"- {w}" for w in warnings]
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
        + (
            f" ({s['search']['duplicates']} repeating an earlier trial, not trained again)"
            if s["search"].get("duplicates")
            else ""
        )
        + f"; picked trial "
        f"{s['search']['picked_trial']}"
        + (f" under {s['search']['budget_ms']:.2f} ms" if s["search"]["budget_ms"] else "")
        + f"; Pareto front {s['search']['pareto_front']}.",  # fmt: skip
        "",
        budget_line(s),
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
    title = f"{s['run']}: {s['task']['name']} on {s['target']} ({timed_what(s)}, {s['threads']} threads)"
    table = Table(box=box.SIMPLE_HEAD, title=title)
    for i, col in enumerate(_header(s)):
        table.add_column(col, justify="left" if i == 0 else "right")
    for name, _ in ROWS:
        table.add_row(name, *_cells(s, name))
    if _chance_cells(s):
        table.add_row("chance", *_chance_cells(s))
    console.print(table)
    for name, label in ROWS:
        console.print(f"  {name:9s} {s['models'][name]['description']}  ({label})", highlight=False, soft_wrap=True)
    if _chance_cells(s):
        console.print(f"  {'chance':9s} {s.get('chance_kind', 'majority class')} of the test split", highlight=False)
    v = s["shipped_vs_reference"]
    console.print(f"shipped: {s['run']}/{s['models']['shipped']['file']}  ({v['speedup']:.2f}x faster, "
                  f"{v['smaller']:.2f}x smaller)\nsummary: {s['run']}/summary.md   "
                  f"plot: {s['run']}/{s['search']['pareto_png']}", soft_wrap=True, highlight=False)  # fmt: skip
    for w in s.get("warnings") or []:
        console.print(f"[bold red]warning:[/] {w}", soft_wrap=True, highlight=False)
