"""``xsearch search``, ``xsearch report`` and ``xsearch pick``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from xsearch.cli.args import UsageError, add_settings, add_task_args, checked_task, settings_from_args, task_options
from xsearch.search.settings import DEFAULT_STORAGE, PickSettings, SearchSettings


def register(name: str, p: argparse.ArgumentParser) -> None:
    if name == "search":
        add_task_args(p, required=True)
        add_settings(p.add_argument_group("search"), SearchSettings)
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.set_defaults(func=cmd_search)
        return
    p.add_argument("--storage", default=DEFAULT_STORAGE, metavar="URL", help=f"the study's storage ({DEFAULT_STORAGE})")
    p.add_argument("--study", default="xsearch", help="study name")
    if name == "report":
        p.add_argument("--out", required=True, help="output folder")
        p.set_defaults(func=cmd_report)
    else:
        add_settings(p, PickSettings)
        p.add_argument("--out", required=True, help="the config JSON to write")
        p.set_defaults(func=cmd_pick)


def cmd_search(args: argparse.Namespace) -> int:
    from xsearch.search.run import run_search

    name, options = checked_task(args.task, task_options(args))
    settings = settings_from_args(SearchSettings, args, fixed={"task": name, "task_options": options})
    start = time.perf_counter()
    study = run_search(settings, progress=not args.quiet)
    seconds = time.perf_counter() - start
    print_front(study)
    started = [t for t in study.get_trials(deepcopy=False) if t.datetime_start is not None
               and t.datetime_start.timestamp() >= time.time() - seconds]  # fmt: skip
    if started:  # this run's candidates (finished, pruned or failed), and its pace
        print(
            f"{len(started)} candidates in {seconds:.0f} s: {60 * len(started) / seconds:.1f} per minute"
            + (" (scored with the supernet's weights)" if settings.supernet else "")
        )
    return 0


def print_front(study) -> None:
    """The study's trial states, its pruning, and its Pareto front against the reference and the chance level."""
    from xsearch.search.study import (
        describe_trial,
        pareto_front,
        reference_trial,
        shown_beside,
        state_counts,
        study_chance,
        trial_latency_ms,
        trial_metric,
        trial_task_metric,
    )

    ref = reference_trial(study)
    front = pareto_front(study)
    metric = study.user_attrs.get("metric", "metric")
    print(f"study {study.study_name!r}: " + ", ".join(f"{v} {k}" for k, v in state_counts(study).items()))
    _print_pruning(study)
    if not front:
        print("no feasible completed trial yet")
        return
    chance = study_chance(study)
    also = shown_beside(metric)  # (the accuracy beside a loss, with its chance level)
    levels = [(metric, chance)] + ([(also, study_chance(study, also))] if also else [])
    level = ", ".join(f"{name} {value:.4f}" for name, value in levels if value is not None)
    print(f"Pareto front ({len(front)} trials), against the reference Transformer"
          + (f"; chance level (validation) {level}" if level else "") + ":")  # fmt: skip
    extra = f"  {also:>9s}" if also else ""
    print(f"  {'#':>4s}  {metric:>13s}{extra}  {'latency ms':>10s}  {'speedup':>8s}  {'delta':>8s}  architecture")

    def beside(t) -> str:  # the accuracy column
        value = trial_task_metric(t)
        return f"  {'-' if value is None else f'{value:.4f}':>9s}" if also else ""

    for t in front:
        value, lat = trial_metric(t), trial_latency_ms(t)
        speed = f"{trial_latency_ms(ref) / lat:.2f}x" if ref else "-"
        delta = f"{value - trial_metric(ref):+.4f}" if ref else "-"
        print(f"  {t.number:4d}  {value:13.4f}{beside(t)}  {lat:10.2f}  {speed:>8s}  {delta:>8s}  "
              f"{describe_trial(t)}")  # fmt: skip
    if ref:
        value = trial_task_metric(ref) if also else None
        also_ref = f" ({also} {value:.4f})" if value is not None else ""
        print(f"  reference #{ref.number}: {metric} {trial_metric(ref):.4f}{also_ref}, {trial_latency_ms(ref):.2f} ms")


def _print_pruning(study) -> None:
    """One line on a budgeted study: trials pruned before training, stopped early, and training steps spent."""
    trials = study.get_trials(deepcopy=False)
    reasons = [t.user_attrs.get("pruned", "") for t in trials if t.state.name == "PRUNED"]
    if not reasons:
        return
    budget = sum(r.startswith("over budget") for r in reasons)
    early = sum(r.startswith("stopped early") for r in reasons)
    steps = sum(int(t.user_attrs.get("train_steps") or 0) for t in trials)
    print(f"pruned: {budget} over budget before training, {early} stopped early; {steps} training steps in all")


def cmd_report(args: argparse.Namespace) -> int:
    from xsearch.search.report import write_report
    from xsearch.storage import load_study

    study = load_study(args.storage, args.study)
    write_report(study, args.out)
    print_front(study)
    print(f"wrote {args.out}/pareto.html, pareto.png, trials.csv, front.json")
    return 0


def cmd_pick(args: argparse.Namespace) -> int:
    from xsearch.search.report import pick
    from xsearch.search.study import (
        describe_trial,
        shown_beside,
        study_chance,
        trial_latency_ms,
        trial_metric,
        trial_task_metric,
    )
    from xsearch.serialization import atomic_write_text
    from xsearch.storage import load_study

    settings = settings_from_args(PickSettings, args)
    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder; give the JSON file to write")
    study = load_study(args.storage, args.study)
    t = pick(study, settings)
    value, latency = trial_metric(t), trial_latency_ms(t)
    metric = study.user_attrs.get("metric", "metric")
    doc = {
        "model": t.user_attrs["model_config"],
        "trial": t.number,
        "study": study.study_name,
        metric: value,
        "chance": study_chance(study),
        "latency_ms": latency,
        "task": study.user_attrs.get("task"),
    }
    beside = shown_beside(metric)
    if beside and trial_task_metric(t) is not None:  # and the accuracy, with its chance level
        doc |= {beside: trial_task_metric(t), f"{beside}_chance": study_chance(study, beside)}
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(doc, indent=2, default=str))
    also = f", {beside} {doc[beside]:.4f}" if beside in doc else ""
    print(f"picked trial {t.number}: {describe_trial(t)} ({metric} {value:.4f}{also}, {latency:.2f} ms) -> {out}")
    return 0
