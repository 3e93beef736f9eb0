"""Reading a finished study: Pareto front, CSV of trials, plots (with the task's chance level), and picking a model."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import optuna

from xsearch.errors import SettingError, XSearchError
from xsearch.search.settings import PickSettings
from xsearch.search.study import (
    CHANCE_KIND,
    describe_trial,
    is_feasible,
    metric_is_maximized,
    pareto_front,
    reference_trial,
    shown_beside,
    study_chance,
    trial_latency_ms,
    trial_metric,
)
from xsearch.serialization import atomic_write_text


def _architecture_columns(cfg: dict[str, Any], attention: str) -> dict[str, Any]:
    """attention, attention_params, d_model, n_layers, n_heads, d_ff; a per-layer config's joined by "/"."""
    layers = cfg.get("layers")
    if not layers or all(entry == layers[0] for entry in layers[1:]):
        uniform = {**cfg, **(layers[0] if layers else {})}
        return {
            "attention": uniform.get("attention", attention),
            "attention_params": json.dumps(uniform.get("attention_params", {}), sort_keys=True),
            "d_model": cfg.get("d_model", ""),
            "n_layers": cfg.get("n_layers", ""),
            "n_heads": uniform.get("n_heads", ""),
            "d_ff": uniform.get("d_ff", ""),
        }
    return {
        "attention": "/".join(entry["attention"] for entry in layers),
        "attention_params": json.dumps([entry["attention_params"] for entry in layers], sort_keys=True),
        "d_model": cfg.get("d_model", ""),
        "n_layers": cfg.get("n_layers", ""),
        "n_heads": "/".join(str(entry["n_heads"]) for entry in layers),
        "d_ff": "/".join(str(entry["d_ff"]) for entry in layers),
    }


def other_metrics(study: optuna.Study) -> dict[str, float | None]:
    """The validation scores a study's trials record besides the one they are ranked by (``accuracy`` in a study
    ranked by ``valid_loss``, and the other way round), each with its chance level."""
    ranked = study.user_attrs.get("metric")
    return {m: study_chance(study, m) for m in study.user_attrs.get("chances") or {} if m != ranked}


def _row(
    t: optuna.trial.FrozenTrial,
    ref: optuna.trial.FrozenTrial | None,
    chance: float | None,
    others: dict[str, float | None] | None = None,
) -> dict[str, Any]:
    cfg = t.user_attrs.get("model_config") or {}
    lat = trial_latency_ms(t)
    complete = t.state == optuna.trial.TrialState.COMPLETE
    row = {
        "number": t.number,
        "state": t.state.name,
        "reference": bool(t.user_attrs.get("reference")),
        "feasible": is_feasible(t) if complete else "",
        **_architecture_columns(cfg, t.params.get("attention", "")),
        "weight_sharing": cfg.get("weight_sharing", ""),
        "n_parameters": t.user_attrs.get("n_parameters", ""),
        "metric": trial_metric(t) if complete else "",
        "chance": "" if chance is None else round(chance, 4),
        "metric_vs_chance": round(trial_metric(t) - chance, 4) if complete and chance is not None else "",
        "latency_ms": lat if lat is not None else "",
        "latency_p90_ms": (t.user_attrs.get("latency") or {}).get("p90_ms", ""),
        "train_seconds": t.user_attrs.get("train_seconds", ""),
        "train_steps": t.user_attrs.get("train_steps", ""),
        "speedup_vs_reference": "",
        "metric_delta_vs_reference": "",
        "duplicate_of": t.user_attrs.get("duplicate_of", ""),
        "pruned": t.user_attrs.get("pruned", ""),
        "error": t.user_attrs.get("error", ""),
    }
    for name, level in (others or {}).items():  # the other validation scores, each with its chance level
        row[name] = t.user_attrs.get(name, "") if complete else ""
        row[f"{name}_chance"] = "" if level is None else round(level, 4)
    if ref is not None and complete and lat is not None:
        row["speedup_vs_reference"] = round(trial_latency_ms(ref) / lat, 3)
        row["metric_delta_vs_reference"] = round(trial_metric(t) - trial_metric(ref), 4)
    return row


def write_report(study: optuna.Study, out: str | os.PathLike) -> dict[str, Any]:
    """Write ``pareto.html``, ``pareto.png``, ``trials.csv`` and ``front.json`` into ``out``.

    Every row of ``trials.csv`` carries the chance level, on the split the trials are scored on, of the metric they
    are ranked by (``chance``: the label frequencies for ``valid_loss``, the majority class for ``accuracy``, a
    unigram model for ``lm``) and the metric's distance from it; the plots draw it as a dashed line. The other
    validation score a classification trial records (``accuracy`` in a study ranked by ``valid_loss``, and the
    other way round) has a column of its own, with its chance level beside it.

    Returns:
        ``{"front": [...rows...], "reference": row | None, "metric": name, "chance": level | None}``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ref = reference_trial(study)
    metric = study.user_attrs.get("metric", "accuracy")
    chance, others = study_chance(study), other_metrics(study)
    trials = study.get_trials(deepcopy=False)
    rows = [_row(t, ref, chance, others) for t in trials]
    tmp = out / f".trials.csv.tmp-{os.getpid()}"
    with tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["number"])
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, out / "trials.csv")
    front = pareto_front(study)
    front_rows = [
        {
            **_row(t, ref, chance, others),
            "model_config": t.user_attrs.get("model_config"),
            "description": describe_trial(t),
        }
        for t in front
    ]
    doc = {"study": study.study_name, "metric": metric, "chance": chance,
           "reference": _row(ref, ref, chance, others) if ref else None, "front": front_rows}  # fmt: skip
    atomic_write_text(out / "front.json", json.dumps(doc, indent=2, default=str))
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and trial_latency_ms(t) is not None]
    _plot_html(complete, front, ref, metric, chance, out / "pareto.html")
    _plot_png(complete, front, ref, metric, chance, out / "pareto.png")
    return {"front": front_rows, "reference": doc["reference"], "metric": metric, "chance": chance}


def chance_label(metric: str, chance: float) -> str:
    return f"chance ({CHANCE_KIND.get(metric, 'majority class')}) {chance:.3f}"


def _points(trials):
    return [trial_latency_ms(t) for t in trials], [trial_metric(t) for t in trials]


def _hover(t: optuna.trial.FrozenTrial, metric: str) -> str:
    """A trial's hover text: its number, architecture, what it is ranked by and, beside a loss, its accuracy."""
    beside = shown_beside(metric)
    value = t.user_attrs.get(beside) if beside else None
    also = f", {beside} {value:.4f}" if value is not None else ""
    return f"#{t.number} {describe_trial(t)}<br>{metric} {trial_metric(t):.4f}{also}"


def _plot_html(complete, front, ref, metric, chance, path: Path) -> None:
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
            text=[_hover(t, metric) for t in trials], hovertemplate="%{text}<br>%{x:.2f} ms",
        ))  # fmt: skip
    if ref is not None:
        star = dict(color="black", size=16, symbol="star")
        fig.add_trace(go.Scatter(x=[trial_latency_ms(ref)], y=[trial_metric(ref)], mode="markers",
                                 name="reference (full)", marker=star))  # fmt: skip
    if chance is not None:
        fig.add_hline(y=chance, line_dash="dash", line_color="#999", annotation_text=chance_label(metric, chance))
    fig.update_layout(title=f"xsearch: {metric} against measured latency", xaxis_title="latency (ms, median)",
                      yaxis_title=metric, xaxis_type="log", template="plotly_white")  # fmt: skip
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fig.write_html(str(tmp), include_plotlyjs=True, full_html=True)
    os.replace(tmp, path)


def _plot_png(complete, front, ref, metric, chance, path: Path) -> None:
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
    if chance is not None:
        ax.axhline(chance, color="#999", linestyle="--", linewidth=1, label=chance_label(metric, chance), zorder=1)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, median)")
    ax.set_ylabel(metric)
    ax.set_title(f"xsearch: {metric} against measured latency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)


def pick_budget(study: optuna.Study, settings: PickSettings | None = None) -> float | None:
    """The latency budget ``settings`` set on ``study``: the tighter of ``max_latency_ms`` and the reference's
    latency over ``min_speedup`` (None: no limit)."""
    settings = settings or PickSettings()
    budgets = [settings.max_latency_ms]
    if settings.min_speedup is not None:
        ref = reference_trial(study)
        if ref is None:
            raise SettingError("min_speedup", f"{{0}} needs the study's reference trial, and {study.study_name!r} "
                               "has no completed one")  # fmt: skip
        budgets.append(trial_latency_ms(ref) / settings.min_speedup)
    return min((b for b in budgets if b is not None), default=None)


def pick(study: optuna.Study, settings: PickSettings | float | None = None) -> optuna.trial.FrozenTrial:
    """The best feasible COMPLETE trial within the budget, by what the study ranks by (either kind of study).

    Args:
        settings: ``PickSettings`` (or a latency budget in ms, or None: no budget).

    Raises:
        XSearchError: no such trial, naming the budget and the fastest feasible trial's latency.
    """
    if not isinstance(settings, PickSettings):
        settings = PickSettings(max_latency_ms=settings)
    budget = pick_budget(study, settings)
    maximize = metric_is_maximized(study)
    feasible = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state == optuna.trial.TrialState.COMPLETE and is_feasible(t) and trial_latency_ms(t) is not None
    ]
    cands = [t for t in feasible if budget is None or trial_latency_ms(t) <= budget]
    if not cands:
        within = f" within {budget:.2f} ms" if budget is not None else ""
        fastest = min(feasible, key=trial_latency_ms, default=None)
        best = f"; the fastest feasible trial takes {trial_latency_ms(fastest):.2f} ms" if fastest else ""
        raise XSearchError(f"no feasible completed trial{within} in study {study.study_name!r}{best}")
    return sorted(cands, key=lambda t: ((-1 if maximize else 1) * trial_metric(t), trial_latency_ms(t)))[0]
