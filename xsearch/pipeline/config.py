"""``pipeline.yaml``: the schema of ``xsearch run``, its embedded default, and validation.

The default configuration is one commented YAML text (``DEFAULT_YAML``, printed by
``xsearch run --print-config``); a user's file only states what it changes and is merged over it.
Every key is checked against the dataclasses below, so a typo or a value of the wrong type fails
at once with the key's dotted name, before any work starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

TARGETS = ("ort-cpu", "torch-cpu", "ort-cuda", "torch-cuda")
QUANTIZE_MODES = ("dynamic-int8", "static-int8", "fp16", "none")
TEACHERS = ("reference", "searched", "none")

DEFAULT_YAML = """\
# xsearch run: search -> report -> pick -> train -> reference -> compress -> export -> quantize -> verify -> summary
# Every stage writes into runs/<name>/NN-<stage>; re-running the same command continues after the last
# finished stage. Give only the keys you change; the rest come from here.
name: default            # the run folder is <runs_dir>/<name>
runs_dir: runs
target: ort-cpu          # where latency is measured and the model will run: ort-cpu | torch-cpu | ort-cuda | torch-cuda
threads: 2               # threads for latency measurement (and the deployed model)
batch: 1                 # batch size at which latency is measured

task:
  name: listops          # listops | text | lm (see `xsearch train --help` for their options)
  options:               # passed to the task: e.g. data: train.jsonl (text), path: corpus.txt (lm)
    n_train: 4000
    n_valid: 500
    n_test: 500
    max_len: 256

search:
  space: tiny            # a shipped space (`xsearch spaces`) or a .yaml file
  trials: 8              # trials in the study, the reference Transformer included
  train_steps: null      # per trial: give train_steps or train_seconds
  train_seconds: 8
  batch_size: 32
  lr: 0.002
  sampler: tpe           # tpe | nsga2 | random
  seed: 0
  max_latency_ms: null   # a latency constraint on the search itself
  max_params: null
  seq_len: null          # length at which latency is measured (default: the task's max_len)
  latency_repeats: 10

pick:                    # the most accurate feasible trial within both budgets (null = no limit)
  max_latency_ms: null
  min_speedup: null      # e.g. 3: at least 3x faster than the reference Transformer in the search

train:                   # the picked model and the reference Transformer, each trained with this budget
  steps: null
  seconds: 30
  batch_size: 32
  lr: 0.002
  seed: 0
  keep_best: true        # keep the weights of the best validation point (a small fast model can overfit)

compress:
  prune_heads: 0.0       # fraction of attention heads removed
  prune_ffn: 0.5         # fraction of FFN channels removed
  importance: magnitude  # magnitude | taylor
  finetune_steps: 200    # fine-tuning after pruning (0: none)
  teacher: reference     # distil from: reference | searched (the unpruned model) | none (plain fine-tuning)
  temperature: 2.0
  alpha: 0.5
  lr: 0.001

export:
  quantize: dynamic-int8 # dynamic-int8 | static-int8 | fp16 | none

verify:
  latency_repeats: 30    # per model, interleaved between the models compared
"""


class PipelineConfigError(ValueError):
    """A pipeline.yaml that does not fit the schema (the message names the key)."""


@dataclass
class TaskSection:
    name: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class SearchSection:
    space: str
    trials: int
    train_steps: int | None
    train_seconds: float | None
    batch_size: int
    lr: float
    sampler: str
    seed: int
    max_latency_ms: float | None
    max_params: int | None
    seq_len: int | None
    latency_repeats: int


@dataclass
class PickSection:
    max_latency_ms: float | None
    min_speedup: float | None


@dataclass
class TrainSection:
    steps: int | None
    seconds: float | None
    batch_size: int
    lr: float
    seed: int
    keep_best: bool


@dataclass
class CompressSection:
    prune_heads: float
    prune_ffn: float
    importance: str
    finetune_steps: int
    teacher: str
    temperature: float
    alpha: float
    lr: float


@dataclass
class ExportSection:
    quantize: str


@dataclass
class VerifySection:
    latency_repeats: int


@dataclass
class PipelineConfig:
    """A whole ``xsearch run``, as validated data."""

    name: str
    runs_dir: str
    target: str
    threads: int
    batch: int
    task: TaskSection
    search: SearchSection
    pick: PickSection
    train: TrainSection
    compress: CompressSection
    export: ExportSection
    verify: VerifySection

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def default_dict() -> dict[str, Any]:
    return yaml.safe_load(DEFAULT_YAML)


def over_defaults(user: dict[str, Any], source: str) -> dict[str, Any]:
    """``user``'s keys merged over the default configuration (keys a newer xsearch added keep their default)."""
    data = default_dict()
    _merge(data, user, "", source)
    return data


def load_pipeline_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None, *, name: str | None = None
) -> PipelineConfig:
    """The default configuration, with ``path``'s keys and then ``overrides`` (dotted keys) merged over it."""
    data = default_dict()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no such pipeline config: {path}")
        try:
            user = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            raise PipelineConfigError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
        if user is None:
            user = {}
        if not isinstance(user, dict):
            raise PipelineConfigError(f"{path}: expected a mapping of keys at the top, got {type(user).__name__}")
        data = over_defaults(user, str(path))
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, value)
    if name is not None:
        data["name"] = name
    return validate(data, str(path) if path is not None else "pipeline config")


def _merge(base: dict[str, Any], user: dict[str, Any], prefix: str, source: str) -> None:
    for key, value in user.items():
        dotted = f"{prefix}{key}"
        if key not in base:
            raise PipelineConfigError(f"{source}: unknown key {dotted!r}{_did_you_mean(key, base)}")
        if isinstance(base[key], dict) and key != "options":
            if not isinstance(value, dict):
                raise PipelineConfigError(f"{source}: {dotted} must be a mapping, got {value!r}")
            _merge(base[key], value, dotted + ".", source)
        elif key == "options":
            if not isinstance(value, dict):
                raise PipelineConfigError(f"{source}: {dotted} must be a mapping, got {value!r}")
            base[key] = dict(value)  # task options replace the default's as a whole (they are task-specific)
        else:
            base[key] = value


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        if part not in node or not isinstance(node[part], dict):
            raise PipelineConfigError(f"--set: unknown key {'.'.join(parts[: i + 1])!r}{_did_you_mean(part, node)}")
        node = node[part]
    last = parts[-1]
    if last not in node and not (len(parts) > 2 and parts[-2] == "options"):
        raise PipelineConfigError(f"--set: unknown key {dotted!r}{_did_you_mean(last, node)}")
    node[last] = value


def _did_you_mean(key: str, options: dict[str, Any]) -> str:
    close = difflib.get_close_matches(str(key), [str(k) for k in options], n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (valid: {', '.join(map(str, options))})"


def validate(data: dict[str, Any], source: str = "pipeline config") -> PipelineConfig:
    """Type-check ``data`` against the schema and the cross-field rules; returns the config."""
    cfg = _build(PipelineConfig, data, "", source)
    _check_rules(cfg, source)
    return cfg


def _build(cls, data: dict[str, Any], prefix: str, source: str):
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}{f.name}"
        if f.name not in data:
            raise PipelineConfigError(f"{source}: missing key {dotted!r}")
        kwargs[f.name] = _coerce(hints[f.name], data[f.name], dotted, source)
    extra = set(data) - {f.name for f in dataclasses.fields(cls)}
    if extra:
        key = sorted(extra)[0]
        raise PipelineConfigError(f"{source}: unknown key {prefix}{key!r}")
    return cls(**kwargs)


def _coerce(tp, value: Any, dotted: str, source: str) -> Any:
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise PipelineConfigError(f"{source}: {dotted} must be a mapping, got {value!r}")
        return _build(tp, value, dotted + ".", source)
    args = typing.get_args(tp)
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        if value is None and type(None) in args:
            return None
        (tp,) = [a for a in args if a is not type(None)]
        args = typing.get_args(tp)
    if typing.get_origin(tp) is dict:
        if not isinstance(value, dict):
            raise PipelineConfigError(f"{source}: {dotted} must be a mapping, got {value!r}")
        return dict(value)
    ok = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
        bool: isinstance(value, bool),
    }[tp]
    if not ok:
        kind = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[tp]
        raise PipelineConfigError(f"{source}: {dotted} must be {kind}, got {value!r}")
    return float(value) if tp is float else value


def _check_rules(cfg: PipelineConfig, source: str) -> None:
    from xsearch.search import SAMPLERS
    from xsearch.tasks import list_tasks

    def bad(key: str, value: Any, why: str) -> PipelineConfigError:
        return PipelineConfigError(f"{source}: {key}={value!r}: {why}")

    if not cfg.name or "/" in cfg.name or cfg.name in (".", ".."):
        raise bad("name", cfg.name, "must be a plain folder name")
    choices = {
        "target": (cfg.target, TARGETS),
        "task.name": (cfg.task.name, tuple(list_tasks())),
        "search.sampler": (cfg.search.sampler, SAMPLERS),
        "compress.importance": (cfg.compress.importance, ("magnitude", "taylor")),
        "compress.teacher": (cfg.compress.teacher, TEACHERS),
        "export.quantize": (cfg.export.quantize, QUANTIZE_MODES),
    }
    for key, (value, valid) in choices.items():
        if value not in valid:
            raise bad(key, value, f"must be one of {', '.join(valid)}")
    positive = {
        "threads": cfg.threads,
        "batch": cfg.batch,
        "search.trials": cfg.search.trials,
        "search.batch_size": cfg.search.batch_size,
        "search.lr": cfg.search.lr,
        "search.latency_repeats": cfg.search.latency_repeats,
        "search.train_steps": cfg.search.train_steps,
        "search.train_seconds": cfg.search.train_seconds,
        "search.max_latency_ms": cfg.search.max_latency_ms,
        "search.max_params": cfg.search.max_params,
        "search.seq_len": cfg.search.seq_len,
        "pick.max_latency_ms": cfg.pick.max_latency_ms,
        "pick.min_speedup": cfg.pick.min_speedup,
        "train.steps": cfg.train.steps,
        "train.seconds": cfg.train.seconds,
        "train.batch_size": cfg.train.batch_size,
        "train.lr": cfg.train.lr,
        "compress.temperature": cfg.compress.temperature,
        "compress.lr": cfg.compress.lr,
        "verify.latency_repeats": cfg.verify.latency_repeats,
    }
    for key, value in positive.items():
        if value is not None and value <= 0:
            raise bad(key, value, "must be > 0")
    for a, b, steps, seconds in (
        ("search.train_steps", "search.train_seconds", cfg.search.train_steps, cfg.search.train_seconds),
        ("train.steps", "train.seconds", cfg.train.steps, cfg.train.seconds),
    ):
        if (steps is None) == (seconds is None):
            raise PipelineConfigError(f"{source}: give exactly one of {a} and {b} (the other null)")
    for key, value in (
        ("compress.prune_heads", cfg.compress.prune_heads),
        ("compress.prune_ffn", cfg.compress.prune_ffn),
    ):
        if not 0.0 <= value < 1.0:
            raise bad(key, value, "must be a fraction in [0, 1)")
    if not 0.0 <= cfg.compress.alpha <= 1.0:
        raise bad("compress.alpha", cfg.compress.alpha, "must be in [0, 1]")
    if cfg.compress.finetune_steps < 0:
        raise bad("compress.finetune_steps", cfg.compress.finetune_steps, "must be >= 0")
