"""What the commands share: the one-line argument parser, flags built from the library's settings
dataclasses, the task and model flags, and small value checks."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Container, Iterable, Mapping
from pathlib import Path
from typing import Any

from xsearch.errors import MissingPathError, SettingError, XSearchError
from xsearch.settings import base_type, default_of, option_fields, parse_assignments, type_of


class UsageError(XSearchError):
    """A bad command line; printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``UsageError``) instead of usage + message."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}")


# -- flags from settings -----------------------------------------------------------------------------
def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return values


def add_settings(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    exclude: Iterable[str] = (),
    only: Iterable[str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """One flag per field of the settings class ``cls`` (``--train-steps`` for ``train_steps``, or the
    field's ``flag``), typed, with its choices and the help and default of the declaration.

    Every flag's argparse default is None, so ``settings_from_args`` knows what was given; ``defaults``
    changes the default a command shows and uses (``adapt`` trains 300 steps unless told).
    """
    keep = None if only is None else set(only)
    defaults = defaults or {}
    for f in option_fields(cls, exclude):
        if not f.metadata.get("cli", True) or (keep is not None and f.name not in keep):
            continue
        tp, _ = base_type(type_of(cls, f.name))
        default = defaults.get(f.name, default_of(f))
        help_ = f.metadata.get("help", "")
        kwargs: dict[str, Any] = {"dest": f.name, "default": None}
        if tp is bool:
            kwargs["action"] = argparse.BooleanOptionalAction if default else "store_true"
        else:
            origin = typing.get_origin(tp)
            kwargs["type"] = _int_list if origin is list or tp is list else tp if tp in (int, float, str) else str
            choices = f.metadata.get("choices")
            if choices is not None:
                valid = choices() if callable(choices) else choices
                kwargs["choices"] = valid if isinstance(valid, Container) else list(valid)  # (DeviceNames: cuda:N)
            if f.metadata.get("metavar"):
                kwargs["metavar"] = f.metadata["metavar"]
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in defaults:
                kwargs["required"] = True
            elif default is not None and default != [] and default != {}:
                help_ += f" (default: {default})"
        parser.add_argument(flag_of(f), help=help_, **kwargs)


def settings_from_args(
    cls: type,
    args: argparse.Namespace,
    *,
    fixed: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
):
    """An instance of ``cls`` from the flags ``add_settings`` made (those given), ``defaults`` and ``fixed``.

    Raises:
        UsageError: a value the settings reject, naming the flag (``--train-steps must be > 0, got 0``).
    """
    given = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, f.name, None)
        if value is not None:
            given[f.name] = value
    flags = {f.name: flag_of(f) for f in dataclasses.fields(cls)}
    try:
        return cls(**{**dict(defaults or {}), **given, **dict(fixed or {})})
    except SettingError as e:
        raise UsageError(e.render(lambda name: flags.get(name, name))) from None


# -- the task --------------------------------------------------------------------------------------
def add_task_args(p: argparse.ArgumentParser, required: bool) -> None:
    g = p.add_argument_group("task")
    g.add_argument("--task", required=required, help="listops | pathfinder | text | lm")
    g.add_argument("--data", help="text: a JSONL file split into train/valid/test; lm: a UTF-8 text file")
    g.add_argument("--train-data", help="text: training JSONL")
    g.add_argument("--valid-data", help="text: validation JSONL")
    g.add_argument("--test-data", help="text: test JSONL")
    g.add_argument("--max-len", type=int, help="longest sequence (tokens / bytes)")
    g.add_argument("--preset", help="listops: 'lra' for the Long Range Arena setting")
    g.add_argument(
        "--task-opt", action="append", metavar="KEY=VALUE", help=f"any other task option ({_task_option_names()})"
    )


def _task_option_names() -> str:
    """Each task's options, from their declarations: ``listops: n_train, ...; text: ...``."""
    from xsearch.tasks.options import TASK_OPTIONS

    return "; ".join(
        f"{name}: {', '.join(f.name for f in dataclasses.fields(cls))}" for name, cls in TASK_OPTIONS.items()
    )


def task_options(args: argparse.Namespace, task: str | None = None) -> dict[str, Any]:
    """The task options the flags give (``--data`` is the ``path`` of ``lm``, the ``data`` of ``text``)."""
    task = task or args.task
    opts: dict[str, Any] = {}
    if args.data is not None:
        opts["path" if task == "lm" else "data"] = args.data
    for key, attr in (("train", "train_data"), ("valid", "valid_data"), ("test", "test_data")):
        if getattr(args, attr) is not None:
            opts[key] = getattr(args, attr)
    if args.max_len is not None:
        opts["max_len"] = args.max_len
    if args.preset is not None:
        opts["preset"] = args.preset
    try:
        opts.update(parse_assignments(args.task_opt, "--task-opt"))
    except SettingError as e:
        raise UsageError(str(e)) from None
    return opts


def checked_task(name: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The task's name and options, checked without building it (no data is generated or read)."""
    from xsearch.tasks import check_task_options

    check_task_options(name, options)
    return name, options


def build_task(name: str, options: dict[str, Any]):
    import logging

    from xsearch.tasks import get_task

    logging.getLogger("xsearch").info("building task %s %s", name, options or "")
    return get_task(name, **options)


def task_of_model(model_dir: str | Path, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The task a saved model was trained on (from its task.json), with the flags' options over it."""
    from xsearch.serialization import load_task_info

    info = load_task_info(model_dir) or {}
    name = getattr(args, "task", None) or info.get("name")
    if name is None:
        raise UsageError(f"{model_dir} has no task.json; give --task")
    same = name == info.get("name")
    options = {k: v for k, v in (info.get("options") or {}).items() if v is not None} if same else {}
    options.update(task_options(args, name))
    return checked_task(name, options)


# -- the model -------------------------------------------------------------------------------------
MODEL_FLAGS = {"attention": "--attention", "d_model": "--d-model", "n_layers": "--layers", "n_heads": "--heads",
               "head_dim": "--head-dim", "d_ff": "--d-ff", "weight_sharing": "--weight-sharing",
               "dropout": "--dropout", "pos_encoding": "--pos-encoding", "pooling": "--pooling"}  # fmt: skip


def add_model_args(p: argparse.ArgumentParser) -> None:
    """``--config`` and the ``ModelConfig`` fields a user sets (with their help from the dataclass)."""
    from xsearch.config import ModelConfig

    m = p.add_argument_group("model")
    m.add_argument("--config", help="a ModelConfig JSON (e.g. from `xsearch pick`) or a saved model; flags override it")
    m.add_argument("--set", action="append", metavar="KEY=VALUE", help="an attention parameter")
    for f in dataclasses.fields(ModelConfig):
        if f.name not in MODEL_FLAGS:
            continue
        tp, _ = base_type(type_of(ModelConfig, f.name))
        choices = f.metadata.get("choices")
        m.add_argument(MODEL_FLAGS[f.name], dest=f.name, type=tp, help=f.metadata.get("help"),
                       choices=list(choices) if choices else None)  # fmt: skip


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A ``ModelConfig`` dict from a JSON file (a bare config, or ``{"model": ...}`` as `pick` writes) or a model
    folder."""
    from xsearch.serialization import load_config, read_json

    p = Path(path)
    if p.is_dir():
        return load_config(p).to_dict()
    doc = read_json(p)
    cfg = doc.get("model", doc) if isinstance(doc, dict) else doc
    if not isinstance(cfg, dict):
        raise UsageError(f"{path}: expected a JSON object with the model config")
    return cfg


def model_config_from_args(args: argparse.Namespace, task):
    """The ``ModelConfig`` the flags describe, over ``--config``, over the task's defaults (``model_defaults``),
    with the task's fields (vocabulary, length, head)."""
    from xsearch.config import ModelConfig

    task_fields = task.model_fields()
    base = read_config_file(args.config) if args.config else {}
    flags = {k: getattr(args, k) for k in MODEL_FLAGS if getattr(args, k, None) is not None}
    cfg = {**task.model_defaults(), **base, **flags}
    try:
        params = parse_assignments(args.set, "--set")
    except SettingError as e:
        raise UsageError(str(e)) from None
    if params or args.attention is not None:
        keep = base.get("attention_params", {}) if cfg.get("attention") == base.get("attention") else {}
        cfg["attention_params"] = {**keep, **params}
    if base and base.get("max_len", task_fields["max_len"]) < task_fields["max_len"]:
        raise UsageError(
            f"config max_len={base['max_len']} is shorter than the task's max_len={task_fields['max_len']}"
        )
    cfg.update(task_fields)
    return ModelConfig.from_dict(cfg)


# -- values ----------------------------------------------------------------------------------------
def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def output_dir(path: str | Path, flag: str = "--out") -> Path:
    """Check a folder the command will write (before any work): not a file, and either new, empty, or a
    folder xsearch wrote before (it is replaced as a whole only once the new one is complete)."""
    from xsearch.serialization import check_output_dir

    return check_output_dir(Path(path), flag)


def existing_file(path: str | Path, what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise MissingPathError(f"no such {what}: {p}")
    return p
