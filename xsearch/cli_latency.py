"""``xsearch latency {sweep,fit,predict}``: latency data, the latency predictor, and its predictions."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from xsearch.cli import add_task_args, task_options
from xsearch.latency import TARGETS

log = logging.getLogger("xsearch")


def _lengths(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--seq-lens expects comma-separated integers, got {text!r}") from None
    if not values:
        raise ValueError(f"--seq-lens expects comma-separated integers, got {text!r}")
    return values


def cmd_sweep(args: argparse.Namespace) -> int:
    from xsearch.latency_sweep import SweepSettings, run_sweep
    from xsearch.search_spaces import load_space

    seq_lens = [args.seq_len] if args.seq_len is not None else _lengths(args.seq_lens) if args.seq_lens else None
    settings = SweepSettings(
        task=args.task,
        task_options=task_options(args),
        space=args.space,
        target=args.target,
        samples=args.samples,
        storage=args.storage,
        study=args.study,
        seq_lens=seq_lens,
        batch=args.batch,
        threads=args.threads,
        latency_repeats=args.repeats,
        rounds=args.rounds,
        group=args.group,
        seed=args.seed,
    )
    load_space(args.space)  # a bad space fails before the task is built
    study = run_sweep(settings, progress=not args.quiet)
    states: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        states[t.state.name] = states.get(t.state.name, 0) + 1
    print(f"study {study.study_name!r}: " + ", ".join(f"{v} {k}" for k, v in sorted(states.items())))
    print(f"fit a predictor: xsearch latency fit --storage {args.storage} --study {args.study} --out predictor.json")
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from xsearch.latency_predictor import fit_with_holdout
    from xsearch.latency_sweep import describe_device, load_rows, select_rows

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


def _read_config(path: str) -> dict:
    from xsearch.serialization import load_config, read_json

    p = Path(path)
    if p.is_dir():
        return load_config(p).to_dict()
    doc = read_json(p)
    cfg = doc.get("model", doc) if isinstance(doc, dict) else doc
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a JSON object with the model config")
    return cfg


def cmd_predict(args: argparse.Namespace) -> int:
    from xsearch.config import ModelConfig
    from xsearch.latency_predictor import LatencyPredictor

    predictor = LatencyPredictor.load(args.predictor)
    cfg = ModelConfig.from_dict(_read_config(args.config))
    seq_len = args.seq_len or cfg.max_len
    ms = predictor.predict(cfg, seq_len, args.batch)
    print(f"{ms:.2f} ms predicted ({predictor.target}, seq_len {seq_len}, batch {args.batch})")
    return 0


def add_latency_parser(sub) -> None:
    """The ``latency`` command group, added to the top-level subparsers ``sub``."""
    from xsearch.search import DEFAULT_STORAGE

    group = sub.add_parser("latency", help="latency data and the latency predictor (sweep, fit, predict)")
    cmds = group.add_subparsers(dest="latency_command", required=True, parser_class=type(group))

    s = cmds.add_parser("sweep", help="measure the latency of random architectures of a space (no training)")
    add_task_args(s, required=True)
    s.add_argument("--space", default="default", help="a shipped space (xsearch spaces) or a .yaml path")
    s.add_argument("--target", default="ort-cpu", choices=list(TARGETS))
    s.add_argument("--samples", type=int, default=300, help="measured architectures wanted in the study (total)")
    s.add_argument("--storage", default=DEFAULT_STORAGE, help="any Optuna storage URL")
    s.add_argument("--study", default="latency", help="study name (re-running adds up to --samples)")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--seq-len", type=int, help="length to measure at (default: task max_len)")
    g.add_argument("--seq-lens", help="lengths to draw from, e.g. 256,512,1024")
    s.add_argument("--batch", type=int, default=1)
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--repeats", type=int, default=30, help="timed runs per architecture, spread over --rounds")
    s.add_argument("--rounds", type=int, default=10,
                   help="round-robin passes over a group, each round's machine speed divided out")  # fmt: skip
    s.add_argument("--group", type=int, default=50, help="architectures timed together with the reference")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_sweep)

    s = cmds.add_parser("fit", help="fit a latency predictor on measured trials; print its held-out error")
    s.add_argument("--storage", default=DEFAULT_STORAGE)
    s.add_argument("--study", action="append", required=True, help="a sweep or search study (repeatable)")
    s.add_argument("--target", choices=list(TARGETS), help="the target to fit for, when the studies hold several")
    s.add_argument("--threads", type=int, help="the thread count to fit for, when the studies hold several")
    s.add_argument("--test-fraction", type=float, default=0.2, help="share of architectures held out")
    s.add_argument("--seed", type=int, default=0, help="seeds the held-out split and the fit")
    s.add_argument("--quiet", action="store_true")
    s.add_argument("--out", required=True, help="the predictor JSON to write")
    s.set_defaults(func=cmd_fit)

    s = cmds.add_parser("predict", help="predicted latency of one architecture")
    s.add_argument("predictor", help="a predictor JSON from `xsearch latency fit`")
    s.add_argument("--config", required=True, help="a ModelConfig JSON (as `xsearch pick` writes) or model folder")
    s.add_argument("--seq-len", type=int, help="default: the config's max_len")
    s.add_argument("--batch", type=int, default=1)
    s.set_defaults(func=cmd_predict)
