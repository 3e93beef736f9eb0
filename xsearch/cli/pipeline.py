"""``xsearch run``: the whole pipeline on a pipeline.yaml (or the embedded default), restartable."""

from __future__ import annotations

import argparse
import logging
import sys

from xsearch.cli.args import UsageError


def register(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="a pipeline.yaml (default: the embedded default; see --print-config)")
    p.add_argument("--print-config", action="store_true", help="print the default pipeline.yaml and exit")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a key, e.g. search.trials=20 (null clears it)")  # fmt: skip
    p.add_argument("--name", help="run name (the folder under runs_dir); overrides the config's")
    p.add_argument("--runs-dir", help="where run folders live (default: the config's runs_dir)")
    p.add_argument("--fresh", action="store_true", help="delete the run folder and start over")
    p.add_argument("--redo-from", metavar="STAGE", help="redo this stage and the later ones (search: adds trials)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from xsearch.errors import SettingError
    from xsearch.pipeline import default_yaml, load_pipeline_config, run_pipeline
    from xsearch.pipeline.summary import print_summary
    from xsearch.settings import parse_assignments

    if args.print_config:
        print(default_yaml(), end="")
        return 0
    try:
        overrides = parse_assignments(args.set, "--set")
    except SettingError as e:
        raise UsageError(str(e)) from None
    if args.runs_dir is not None:
        overrides["runs_dir"] = args.runs_dir
    cfg = load_pipeline_config(args.config, overrides, name=args.name)
    logging.getLogger("xsearch.export").setLevel(logging.WARNING)  # the export stage prints its own parity line
    print(f"xsearch run: {cfg.run_dir}  (task {cfg.task.name}, space {cfg.search.space}, target {cfg.target}, "
          f"{cfg.search.trials} trials)")  # fmt: skip
    try:
        summary = run_pipeline(cfg, fresh=args.fresh, redo_from=args.redo_from, progress=not args.quiet, echo=print)
    except KeyboardInterrupt:
        print(f"xsearch: interrupted; run the same command again to continue {cfg.run_dir}", file=sys.stderr)
        return 130
    print_summary(summary)
    return 0
