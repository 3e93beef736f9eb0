"""``xsearch supernet {train,extract}``: train a weight-sharing supernet over a space; extract a subnet as a model."""

from __future__ import annotations

import argparse
import json
import logging

from xsearch.cli.args import (
    Parser,
    UsageError,
    add_settings,
    add_task_args,
    build_task,
    checked_task,
    output_dir,
    read_config_file,
    settings_from_args,
    task_options,
)
from xsearch.supernet.settings import SupernetTrainSettings

log = logging.getLogger("xsearch")


def register(name: str, group: argparse.ArgumentParser) -> None:
    """The ``supernet`` command group."""
    cmds = group.add_subparsers(dest="supernet_command", required=True, parser_class=Parser, metavar="COMMAND")

    s = cmds.add_parser("train", help="train a supernet over a space (one sampled subnet per step; resumable)")
    add_task_args(s, required=True)
    s.add_argument("--space", default="default", help="a shipped space (`xsearch spaces`) or a YAML file")
    s.add_argument("--init", metavar="DIR", help="warm-start from a trained model of a subnet of the space (a folder "
                   "of `xsearch train`, such as the space's reference): its weights go into their leading slices "
                   "of the supernet's before the first step")  # fmt: skip
    add_settings(s.add_argument_group("training"), SupernetTrainSettings)
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--out", required=True, help="the supernet folder (run the same command again to resume)")
    s.set_defaults(func=cmd_train)

    s = cmds.add_parser("extract", help="one subnet of a trained supernet as a plain model folder")
    s.add_argument("supernet", help="a supernet folder from `xsearch supernet train`")
    s.add_argument("--config", required=True, help="the subnet: a ModelConfig JSON (as `xsearch pick` writes)")
    s.add_argument("--out", required=True, help="output folder (config.json + model.safetensors)")
    s.set_defaults(func=cmd_extract)


def cmd_train(args: argparse.Namespace) -> int:
    from xsearch.search_spaces import load_space_for_task
    from xsearch.supernet import build_supernet
    from xsearch.supernet.train import train_supernet
    from xsearch.training.device import resolve_device

    settings = settings_from_args(SupernetTrainSettings, args)
    resolve_device(settings.device)  # (before the task is built)
    out = output_dir(args.out)
    name, options = checked_task(args.task, task_options(args))
    task = build_task(name, options)
    fields = task.model_fields()
    space = load_space_for_task(args.space, task)
    sn = build_supernet(space, fields, seed=settings.seed, **settings.layout)
    log.info("supernet over %s: %s parameters", space.name, f"{sn.n_parameters():,}")
    init = None
    if args.init is not None:
        from xsearch.serialization import load_model
        from xsearch.supernet import SubnetMismatchError

        init = load_model(args.init)
        try:
            sn.subnet_tensors(init.config)  # (another task, or not a subnet of the space)
        except SubnetMismatchError as e:
            raise UsageError(f"--init {args.init}: {e}") from None
    record = train_supernet(sn, task, settings, out=out, progress=not args.quiet, init=init)
    metric = "bits_per_byte" if task.kind == "lm" else "accuracy"
    chance = "" if task.kind == "lm" else f" (chance {task.chance('valid'):.4f})"
    print(f"saved {out}  steps={record['steps']}  loss={record['final_loss']:.4f}  reference subnet valid "
          f"{metric}={record['reference_valid']:.4f}{chance}  parameters={sn.n_parameters():,}")  # fmt: skip
    return 0


def cmd_extract(args: argparse.Namespace) -> int:
    from xsearch.serialization import atomic_write_text, save_model, staged_directory
    from xsearch.supernet import extract_subnet, load_supernet
    from xsearch.supernet.io import read_supernet_config

    out = output_dir(args.out)
    doc = read_supernet_config(args.supernet)
    cfg = read_config_file(args.config)
    sn = load_supernet(args.supernet)
    for key, value in sn.task_fields.items():
        if key in cfg and cfg[key] != value:
            raise UsageError(f"{args.config}: {key}={cfg[key]!r}, but the supernet was built for {key}={value!r}")
    model = extract_subnet(sn, {**cfg, **sn.task_fields})
    task = (doc.get("trained") or {}).get("task")
    with staged_directory(out) as stage:
        save_model(model, stage, task=task)
        atomic_write_text(stage / "supernet.json", json.dumps({"supernet": str(args.supernet)}, indent=2))
    print(f"saved {out}  (subnet of {args.supernet})")
    return 0
