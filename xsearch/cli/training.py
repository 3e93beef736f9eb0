"""``xsearch train``, ``xsearch pretrain``, ``xsearch eval`` and ``xsearch adapt``."""

from __future__ import annotations

import argparse
import json
import logging

from xsearch.cli.args import (
    UsageError,
    add_model_args,
    add_settings,
    add_task_args,
    build_task,
    checked_task,
    model_config_from_args,
    output_dir,
    positive_int,
    settings_from_args,
    task_of_model,
    task_options,
)
from xsearch.compress.settings import AdapterSettings
from xsearch.training.settings import PretrainSettings, TrainSettings

log = logging.getLogger("xsearch")
ADAPT_DEFAULTS = {"steps": 300}


def register(name: str, p: argparse.ArgumentParser) -> None:
    if name == "train":
        add_task_args(p, required=True)
        add_model_args(p)
        p.add_argument("--init", metavar="DIR", help="start from a saved model's architecture and weights (a "
                       "subnet from `xsearch supernet extract`; a folder of `xsearch pretrain`: a new head) "
                       "instead of new ones")  # fmt: skip
        add_settings(p.add_argument_group("training"), TrainSettings)
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.add_argument("--out", required=True, help="output folder (config.json + model.safetensors)")
        p.set_defaults(func=cmd_train)
    elif name == "pretrain":
        add_task_args(p, required=True)
        add_model_args(p)
        add_settings(p.add_argument_group("pretraining"), PretrainSettings)
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.add_argument("--out", required=True, help="output folder (run the same command again to resume)")
        p.set_defaults(func=cmd_pretrain)
    elif name == "eval":
        p.add_argument("model", help="a saved model folder")
        add_task_args(p, required=False)
        p.add_argument("--split", default="test", choices=["train", "valid", "test"])
        p.add_argument("--batch-size", type=positive_int, default=64)
        p.add_argument("--threads", type=positive_int)
        p.add_argument("--json", action="store_true", help="print one JSON object")
        p.set_defaults(func=cmd_eval)
    else:
        p.add_argument("model", help="a saved base model folder")
        add_task_args(p, required=True)
        add_settings(p.add_argument_group("adapters"), AdapterSettings)
        add_settings(p.add_argument_group("training"), TrainSettings, defaults=ADAPT_DEFAULTS,
                     exclude=("keep_best",))  # fmt: skip
        p.add_argument("--quiet", action="store_true")
        p.add_argument("--out", required=True, help="output folder (adapters.safetensors + adapters.json)")
        p.set_defaults(func=cmd_adapt)


def metric_key(task_kind: str) -> str:
    return "bits_per_byte" if task_kind == "lm" else "accuracy"


def cmd_train(args: argparse.Namespace) -> int:
    from xsearch.training.device import resolve_device

    settings = settings_from_args(TrainSettings, args)
    resolve_device(settings.device)  # (before the task is built)
    out = output_dir(args.out)
    if args.init is not None:
        return _train_from(args, settings, out)
    task, cfg = _task_and_config(args)
    return _train_and_save(args, settings, out, task, cfg)


def _task_and_config(args: argparse.Namespace):
    """The task the flags name, and the model they describe for it (a bad attention fails before the task is
    built, which is slower)."""
    if args.attention is not None:
        from xsearch.attention import attention_spec
        from xsearch.settings import parse_assignments

        attention_spec(args.attention).resolve_params(parse_assignments(args.set, "--set"))
    name, options = checked_task(args.task, task_options(args))
    task = build_task(name, options)
    return task, model_config_from_args(args, task)


def cmd_pretrain(args: argparse.Namespace) -> int:
    """``xsearch pretrain``: self-pretraining on the task's own inputs (resumes a checkpoint found in --out)."""
    import torch

    from xsearch.model import build_model
    from xsearch.training.device import resolve_device
    from xsearch.training.pretrain import pretrain

    settings = settings_from_args(PretrainSettings, args)
    resolve_device(settings.device)  # (before the task is built)
    out = output_dir(args.out)
    task, cfg = _task_and_config(args)
    torch.manual_seed(settings.seed)
    record = pretrain(build_model(cfg), task, settings, out=out, progress=not args.quiet)
    first, last = record["history"][0], record["history"][-1]
    restored = (f", restored {first['valid_restored']:.3f} -> {last['valid_restored']:.3f}"
                if "valid_restored" in last else "")  # fmt: skip
    print(f"saved {out}  objective={record['objective']}  steps={record['steps']}  valid loss "
          f"{first['valid_loss']:.4f} -> {last['valid_loss']:.4f}{restored}")  # fmt: skip
    return 0


def _train_and_save(args: argparse.Namespace, settings: TrainSettings, out, task, cfg, init=None) -> int:
    from xsearch.serialization import atomic_write_text, save_model, staged_directory
    from xsearch.training.recipe import train_model

    trained = train_model(cfg, task, settings, progress=not args.quiet, init=init)
    key = f"test_{metric_key(task.kind)}"
    metrics = {
        "steps": trained.result.steps,
        "train_seconds": round(trained.result.seconds, 2),
        "final_loss": trained.result.final_loss,
        "valid": trained.result.valid_metric,
        key: trained.test_metric,
        "chance": trained.chance,
        "parameters": trained.parameters,
        "init": args.init,
    }
    with staged_directory(out) as stage:
        save_model(trained.model, stage, task=task.describe())
        atomic_write_text(stage / "metrics.json", json.dumps(metrics, indent=2))
    print(f"saved {out}  steps={trained.result.steps}  {key}={trained.test_metric:.4f} (chance "
          f"{trained.chance:.4f})  parameters={trained.parameters}")  # fmt: skip
    return 0


def _train_from(args: argparse.Namespace, settings: TrainSettings, out) -> int:
    """``xsearch train --init DIR``: the folder's model, trained further on the task (with a new head when the
    folder is a pretraining)."""
    from xsearch.cli.args import MODEL_FLAGS
    from xsearch.serialization import load_model
    from xsearch.training.pretrain import init_from_pretrained, is_pretrained

    given = [flag for key, flag in MODEL_FLAGS.items() if getattr(args, key, None) is not None]
    given += ["--config"] * (args.config is not None) + ["--set"] * bool(args.set)
    if given:
        raise UsageError(f"--init takes the architecture of {args.init}: leave out {given[0]}")
    pretrained = is_pretrained(args.init)
    model = None if pretrained else load_model(args.init)
    name, options = checked_task(args.task, task_options(args))
    task = build_task(name, options)
    if pretrained:
        model = init_from_pretrained(args.init, task, seed=settings.seed)
    for key, value in task.model_fields().items():
        if getattr(model.config, key) != value:
            raise UsageError(f"--init {args.init} is a model with {key}={getattr(model.config, key)!r}, but the task "
                             f"needs {key}={value!r}")  # fmt: skip
    return _train_and_save(args, settings, out, task, model.config, init=model)


def cmd_eval(args: argparse.Namespace) -> int:
    import time

    import torch

    from xsearch.serialization import load_model, load_task_info
    from xsearch.tasks.encoding import Encoding
    from xsearch.training.loop import evaluate

    model = load_model(args.model)
    info = load_task_info(args.model) or {}
    task = build_task(*task_of_model(args.model, args))
    if info.get("encoding") and Encoding.from_dict(info["encoding"]) != task.encoding:
        raise UsageError(f"task {task.name!r} encodes input differently from the task {args.model} was trained on")
    if task.max_len > model.config.max_len:
        raise UsageError(f"task max_len={task.max_len} exceeds the model's max_len={model.config.max_len}")
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    metric = evaluate(model, task, args.split, batch_size=args.batch_size)
    seconds = time.perf_counter() - start
    key = metric_key(task.kind)
    chance = task.chance(args.split)
    result = {"model": str(args.model), "task": task.name, "split": args.split, key: metric, "chance": chance,
              "seconds": round(seconds, 2)}  # fmt: skip
    print(json.dumps(result) if args.json else
          f"{task.name} {args.split} {key} = {metric:.4f}  (chance {chance:.4f}; {seconds:.1f} s)")  # fmt: skip
    return 0


def cmd_adapt(args: argparse.Namespace) -> int:
    import torch

    from xsearch.compress import add_adapters, save_adapters
    from xsearch.serialization import load_model, staged_directory
    from xsearch.training.device import resolve_device
    from xsearch.training.loop import evaluate, train

    adapters = settings_from_args(AdapterSettings, args)
    training = settings_from_args(TrainSettings, args, defaults=ADAPT_DEFAULTS)
    resolve_device(training.device)  # (before the model is loaded)
    out = output_dir(args.out)
    model = load_model(args.model)
    name, options = checked_task(args.task, task_options(args))
    task = build_task(name, options)
    if task.max_len > model.config.max_len:
        raise UsageError(f"task max_len={task.max_len} exceeds the model's max_len={model.config.max_len}")
    if task.encoding.vocab_size > model.config.vocab_size:
        raise UsageError(f"task vocabulary ({task.encoding.vocab_size}) is larger than the model's "
                         f"({model.config.vocab_size})")  # fmt: skip
    torch.manual_seed(training.seed)
    add_adapters(model, kind=adapters.kind, size=adapters.size, targets=adapters.target_names(),
                 n_classes=task.n_classes if task.kind == "classify" else None)  # fmt: skip
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    train(model, task, progress=not args.quiet, **training.loop_options())
    metric = evaluate(model, task, "test")
    with staged_directory(out) as stage:
        save_adapters(model, stage, task=task.describe())
    print(f"saved adapters to {out} ({n_train:,} trainable parameters); test {metric_key(task.kind)} {metric:.4f} "
          f"(chance {task.chance('test'):.4f})")  # fmt: skip
    return 0
