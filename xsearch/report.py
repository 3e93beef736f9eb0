"""Reading a finished study: Pareto front, CSV of trials, plots, and picking a model."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import optuna

from xsearch.search import (
    describe_trial,
    is_feasible,
    metric_is_maximized,
    pareto_front,
    reference_trial,
    trial_latency_ms,
    trial_metric,
)
from xsearch.serialization import atomic_write_text
from xsearch.storage import mask_url, open_storage


def load(storage: str, study: str) -> optuna.Study:
    """Load an existing study (of either kind), with a clear error when it does not exist."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    backend = open_storage(storage)
    try:
        return optuna.load_study(study_name=study, storage=backend)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage=backend)]
        raise ValueError(
            f"no study {study!r} in {mask_url(storage)} (studies there: {', '.join(names) or 'none'})"
        ) from None


def _row(t: optuna.trial.FrozenTrial, ref: optuna.trial.FrozenTrial | None) -> dict[str, Any]:
    cfg = t.user_attrs.get("model_config") or {}
    lat = trial_latency_ms(t)
    complete = t.state == optuna.trial.TrialState.COMPLETE
    row = {
        "number": t.number,
        "state": t.state.name,
        "reference": bool(t.user_attrs.get("reference")),
        "feasible": is_feasible(t) if complete else "",
        "attention": cfg.get("attention", t.params.get("attention", "")),
        "attention_params": json.dumps(cfg.get("attention_params", {}), sort_keys=True),
        "d_model": cfg.get("d_model", ""),
        "n_layers": cfg.get("n_layers", ""),
        "n_heads": cfg.get("n_heads", ""),
        "d_ff": cfg.get("d_ff", ""),
        "weight_sharing": cfg.get("weight_sharing", ""),
        "n_parameters": t.user_attrs.get("n_parameters", ""),
        "metric": trial_metric(t) if complete else "",
        "latency_ms": lat if lat is not None else "",
        "latency_p90_ms": (t.user_attrs.get("latency") or {}).get("p90_ms", ""),
        "train_seconds": t.user_attrs.get("train_seconds", ""),
        "train_steps": t.user_attrs.get("train_steps", ""),
        "speedup_vs_reference": "",
        "metric_delta_vs_reference": "",
        "pruned": t.user_attrs.get("pruned", ""),
        "error": t.user_attrs.get("error", ""),
    }
    if ref is not None and complete and lat is not None:
        row["speedup_vs_reference"] = round(trial_latency_ms(ref) / lat, 3)
        row["metric_delta_vs_reference"] = round(trial_metric(t) - trial_metric(ref), 4)
    return row


def write_report(study: optuna.Study, out: str | os.PathLike) -> dict[str, Any]:
    """Write ``pareto.html``, ``pareto.png``, ``trials.csv`` and ``front.json`` into ``out``.

    Returns:
        ``{"front": [...rows...], "reference": row | None, "metric": name}``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ref = reference_trial(study)
    metric = study.user_attrs.get("metric", "accuracy")
    trials = study.get_trials(deepcopy=False)
    rows = [_row(t, ref) for t in trials]
    tmp = out / f".trials.csv.tmp-{os.getpid()}"
    with tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["number"])
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, out / "trials.csv")
    front = pareto_front(study)
    front_rows = [
        {**_row(t, ref), "model_config": t.user_attrs.get("model_config"), "description": describe_trial(t)}
        for t in front
    ]
    doc = {"study": study.study_name, "metric": metric, "reference": _row(ref, ref) if ref else None,
           "front": front_rows}  # fmt: skip
    atomic_write_text(out / "front.json", json.dumps(doc, indent=2, default=str))
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and trial_latency_ms(t) is not None]
    _plot_html(complete, front, ref, metric, out / "pareto.html")
    _plot_png(complete, front, ref, metric, out / "pareto.png")
    return {"front": front_rows, "reference": doc["reference"], "metric": metric}


def _points(trials):
    return [trial_latency_ms(t) for t in trials], [trial_metric(t) for t in trials]


def _plot_html(complete, front, ref, metric, path: Path) -> None:
    import plotly.graph_objects as go

    feas = [t for t in complete if is_feasible(t)]
    infeas = [t for t in complete if not is_feasible(t)]
    fig = go.Figure()
    for trials, name, style in (
        (feas, "feasible", dict(color="#8aa", size=8)),
        (infeas, "over budget", dict(color="#d66", size=8, symbol="x")),
        (front, "Pareto front", dict(color="#1f5fbf", size=11)),
    ):
        if not trials:
            continue
        x, y = _points(trials)
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="markers+lines" if name == "Pareto front" else "markers", name=name, marker=style,
            line=dict(shape="hv") if name == "Pareto front" else None,
            text=[f"#{t.number} {describe_trial(t)}" for t in trials], hovertemplate="%{text}<br>%{x:.2f} ms, %{y:.4f}",
        ))  # fmt: skip
    if ref is not None:
        star = dict(color="black", size=16, symbol="star")
        fig.add_trace(go.Scatter(x=[trial_latency_ms(ref)], y=[trial_metric(ref)], mode="markers",
                                 name="reference (full)", marker=star))  # fmt: skip
    fig.update_layout(title="xsearch: accuracy against measured latency", xaxis_title="latency (ms, median)",
                      yaxis_title=metric, xaxis_type="log", template="plotly_white")  # fmt: skip
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fig.write_html(str(tmp), include_plotlyjs=True, full_html=True)
    os.replace(tmp, path)


def _plot_png(complete, front, ref, metric, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    feas = [t for t in complete if is_feasible(t)]
    infeas = [t for t in complete if not is_feasible(t)]
    if feas:
        ax.scatter(*_points(feas), c="#8aa", label="feasible", zorder=2)
    if infeas:
        ax.scatter(*_points(infeas), c="#d66", marker="x", label="over budget", zorder=2)
    if front:
        x, y = _points(front)
        ax.step(x, y, where="post", c="#1f5fbf", zorder=3)
        ax.scatter(x, y, c="#1f5fbf", s=45, label="Pareto front", zorder=4)
        for t in front:
            ax.annotate(describe_trial(t).split("(")[0], (trial_latency_ms(t), trial_metric(t)), fontsize=7,
                        xytext=(4, 4), textcoords="offset points")  # fmt: skip
    if ref is not None:
        ax.scatter([trial_latency_ms(ref)], [trial_metric(ref)], c="black", marker="*", s=180, label="reference (full)",
                   zorder=5)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, median)")
    ax.set_ylabel(metric)
    ax.set_title("xsearch: accuracy against measured latency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)


def pick(study: optuna.Study, max_latency_ms: float | None = None) -> optuna.trial.FrozenTrial:
    """The best (by the task metric) feasible COMPLETE trial with latency within the budget (either kind of study)."""
    maximize = metric_is_maximized(study)
    cands = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state == optuna.trial.TrialState.COMPLETE and is_feasible(t) and trial_latency_ms(t) is not None
        and (max_latency_ms is None or trial_latency_ms(t) <= max_latency_ms)
    ]  # fmt: skip
    if not cands:
        budget = f" under {max_latency_ms} ms" if max_latency_ms is not None else ""
        raise ValueError(f"no feasible completed trial{budget} in study {study.study_name!r}")
    return sorted(cands, key=lambda t: ((-1 if maximize else 1) * trial_metric(t), trial_latency_ms(t)))[0]
