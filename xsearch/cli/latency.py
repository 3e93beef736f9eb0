"""``xsearch latency {sweep,fit,predict}``: latency data, the latency predictor, and its predictions."""

from __future__ import annotations

import argparse
import logging

from xsearch.cli.args import (
    Parser,
    add_settings,
    add_task_args,
    checked_task,
    positive_int,
    read_config_file,
    settings_from_args,
    task_options,
)
from xsearch.latency.sweep import SweepSettings
from xsearch.latency.target import list_targets
from xsearch.search.settings import DEFAULT_STORAGE

log = logging.getLogger("xsearch")


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {value}")
    return value


def register(name: str, group: argparse.ArgumentParser) -> None:
    """The ``latency`` command group."""
    cmds = group.add_subparsers(dest="latency_command", required=True, parser_class=Parser, metavar="COMMAND")

    s = cmds.add_parser("sweep", help="measure the latency of random architectures of a space (no training)")
    add_task_args(s, required=True)
    add_settings(s.add_argument_group("sweep"), SweepSettings)
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_sweep)

    s = cmds.add_parser("fit", help="fit a latency predictor on measured trials; print its held-out error")
    s.add_argument("--storage", default=DEFAULT_STORAGE, metavar="URL")
    s.add_argument("--study", action="append", required=True, help="a sweep or search study (repeatable)")
    s.add_argument("--target", choices=list_targets(), help="the target to fit for, when the studies hold several")
    s.add_argument("--threads", type=positive_int, help="the thread count to fit for, when the studies hold several")
    s.add_argument("--test-fraction", type=_fraction, default=0.2, help="share of architectures held out")
    s.add_argument("--seed", type=int, default=0, help="seeds the held-out split and the fit")
    s.add_argument("--quiet", action="store_true")
    s.add_argument("--out", required=True, help="the predictor JSON to write")
    s.set_defaults(func=cmd_fit)

    s = cmds.add_parser("predict", help="predicted latency of one architecture")
    s.add_argument("predictor", help="a predictor JSON from `xsearch latency fit`")
    s.add_argument("--config", required=True, help="a ModelConfig JSON (as `xsearch pick` writes) or model folder")
    s.add_argument("--seq-len", type=positive_int, help="default: the config's max_len")
    s.add_argument("--batch", type=positive_int, default=1)
    s.set_defaults(func=cmd_predict)


def cmd_sweep(args: argparse.Namespace) -> int:
    from xsearch.latency.sweep import run_sweep
    from xsearch.search.study import state_counts

    name, options = checked_task(args.task, task_options(args))
    settings = settings_from_args(SweepSettings, args, fixed={"task": name, "task_options": options})
    study = run_sweep(settings, progress=not args.quiet)
    print(f"study {study.study_name!r}: " + ", ".join(f"{v} {k}" for k, v in state_counts(study).items()))
    print(f"fit a predictor: xsearch latency fit --storage {settings.storage} --study "
          f"{settings.study} --out predictor.json")  # fmt: skip
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from xsearch.latency.device import describe_device
    from xsearch.latency.predictor.data import load_rows, select_rows
    from xsearch.latency.predictor.holdout import fit_with_holdout

    rows = select_rows(load_rows(args.storage, args.study), target=args.target, threads=args.threads)
    log.info("%d measured rows on %s (%s)", len(rows), rows[0].target, describe_device(rows[0].device or {}))
    with Progress(transient=True, disable=args.quiet) as bar:
        task = bar.add_task("features", total=len(rows))
        predictor = fit_with_holdout(
            rows, test_fraction=args.test_fraction, seed=args.seed, progress=lambda i, n: bar.update(task, completed=i)
        )
    m = predictor.metrics
    tau = "-" if m["kendall_tau"] is None else f"{m['kendall_tau']:.3f}"
    print(f"fitted on {predictor.data['rows']} rows ({predictor.data['architectures']} architectures), target "
          f"{predictor.target}, {describe_device(predictor.device)}")  # fmt: skip
    print(f"held-out ({m['n_test_architectures']} unseen architectures, {m['n_test']} rows): "
          f"MAPE {m['mape']:.1f}%  Kendall tau {tau}")  # fmt: skip
    if m.get("sessions"):
        tau_typical = "-" if m["kendall_tau_typical_session"] is None else f"{m['kendall_tau_typical_session']:.3f}"
        print(f"  ({m['sessions']} measurement sessions, each one's speed estimated from the fitted rows; "
              f"against a typical session's prediction: MAPE {m['mape_typical_session']:.1f}%  "
              f"Kendall tau {tau_typical})")  # fmt: skip
    out = predictor.save(args.out)
    print(f"wrote {out}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from xsearch.config import ModelConfig
    from xsearch.latency.predictor.fit import LatencyPredictor

    predictor = LatencyPredictor.load(args.predictor)
    cfg = ModelConfig.from_dict(read_config_file(args.config))
    seq_len = args.seq_len or cfg.max_len
    ms = predictor.predict(cfg, seq_len, args.batch)
    print(f"{ms:.2f} ms predicted ({predictor.target}, seq_len {seq_len}, batch {args.batch})")
    return 0
