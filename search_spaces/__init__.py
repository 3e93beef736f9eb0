"""Search spaces: YAML files validated on load and turned into define-by-run Optuna suggestions.

A space names the model dimensions (``d_model``, ``n_layers``, ``n_heads``, ``ffn_ratio``,
``weight_sharing``, ...), the attention variants with their parameters, and the reference
(vanilla Transformer) configuration that every study starts with. A value is a list
(categorical), a mapping ``{low, high[, step][, log]}`` (an int or float range) or a scalar
(fixed). Variant parameters are suggested under namespaced names (``attention.linformer.k``).

    from xsearch.search_spaces import load_space, list_spaces
    space = load_space("default", causal=False, max_len=512)
    cfg = space.suggest(trial, task)            # -> ModelConfig
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("xsearch.search")

MODEL_KEYS = {"d_model", "n_layers", "n_heads", "ffn_ratio", "weight_sharing", "pos_encoding", "dropout"}
TOP_KEYS = {"name", "description", "reference", "model", "attention"}
# Parameters measured in tokens: choices longer than the task's max_len are dropped on load.
# What the vanilla Transformer uses where a space's reference does not say.
REFERENCE_DEFAULTS = {"weight_sharing": "none", "ffn_ratio": 4, "pos_encoding": "sinusoidal", "dropout": 0.0}
LENGTH_PARAMS = {"block_size", "window", "segment_len", "bucket_size", "width", "stride", "radius", "mem_len"}


class SpaceError(ValueError):
    """A search space file that is malformed or names something that does not exist."""


@dataclass(frozen=True)
class Dim:
    """One searchable value: ``choices`` (categorical), or an int/float range, or a constant."""

    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False

    @property
    def is_range(self) -> bool:
        return self.choices is None

    @property
    def is_int(self) -> bool:
        return self.is_range and isinstance(self.low, int) and isinstance(self.high, int)

    def values(self) -> list[Any]:
        """Representative values (all choices, or the ends of a range) for validation."""
        return list(self.choices) if self.choices is not None else [self.low, self.high]

    def suggest(self, trial, name: str) -> Any:
        if self.choices is not None:
            if len(self.choices) == 1:
                return self.choices[0]
            return trial.suggest_categorical(name, list(self.choices))
        if self.is_int:
            return trial.suggest_int(name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(name, float(self.low), float(self.high), step=self.step, log=self.log)

    def to_yaml(self) -> Any:
        if self.choices is not None:
            return list(self.choices)
        out = {"low": self.low, "high": self.high}
        if self.step is not None:
            out["step"] = self.step
        if self.log:
            out["log"] = True
        return out


def _parse_dim(where: str, raw: Any) -> Dim:
    if isinstance(raw, list):
        if not raw:
            raise SpaceError(f"{where}: empty list of choices")
        if len({type(v) for v in raw}) > 1 and not all(isinstance(v, (int, float)) for v in raw):
            raise SpaceError(f"{where}: mixed value types in {raw!r}")
        return Dim(choices=tuple(raw))
    if isinstance(raw, dict):
        unknown = sorted(set(raw) - {"low", "high", "step", "log"})
        if unknown:
            raise SpaceError(f"{where}: unknown range key {unknown[0]!r} (valid: low, high, step, log)")
        if "low" not in raw or "high" not in raw:
            raise SpaceError(f"{where}: a range needs 'low' and 'high', got {raw!r}")
        low, high = raw["low"], raw["high"]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)):
            raise SpaceError(f"{where}: 'low' and 'high' must be numbers, got {low!r}, {high!r}")
        if low > high:
            raise SpaceError(f"{where}: low={low} is greater than high={high}")
        log_scale = raw.get("log", False)
        if not isinstance(log_scale, bool):
            raise SpaceError(f"{where}: 'log' must be true or false, got {log_scale!r}")
        if log_scale and low <= 0:
            raise SpaceError(f"{where}: a log range needs low > 0, got {low}")
        return Dim(low=low, high=high, step=raw.get("step"), log=log_scale)
    if isinstance(raw, (int, float, str, bool)):
        return Dim(choices=(raw,))
    raise SpaceError(f"{where}: expected a list, a {{low, high}} range or a value, got {raw!r}")


@dataclass
class SearchSpace:
    """A validated search space.

    Attributes:
        name: the space's name.
        model: model dimension -> ``Dim``.
        attention: variant name -> {parameter -> ``Dim``}.
        reference: the vanilla Transformer configuration (model keys, ``attention: full``).
        excluded: variants removed on load, with the reason.
    """

    name: str
    model: dict[str, Dim]
    attention: dict[str, dict[str, Dim]]
    reference: dict[str, Any]
    description: str = ""
    excluded: dict[str, str] = field(default_factory=dict)

    def suggest(self, trial, task_fields: dict[str, Any]):
        """Define-by-run suggestions for one trial; returns the ``ModelConfig``."""
        from xsearch.config import ModelConfig

        attention = Dim(choices=tuple(self.attention)).suggest(trial, "attention")
        params = {p: d.suggest(trial, f"attention.{attention}.{p}") for p, d in self.attention[attention].items()}
        dims = {k: d.suggest(trial, k) for k, d in self.model.items()}
        return self._config(attention, params, dims, task_fields, ModelConfig)

    def reference_config(self, task_fields: dict[str, Any]):
        """The reference Transformer as a ``ModelConfig``."""
        from xsearch.config import ModelConfig

        dims = {k: v for k, v in self.reference.items() if k != "attention"}
        return self._config(self.reference.get("attention", "full"), {}, dims, task_fields, ModelConfig)

    def reference_params(self) -> dict[str, Any]:
        """The reference as Optuna parameters (for ``study.enqueue_trial``)."""
        out = {"attention": self.reference.get("attention", "full")}
        for k, d in self.model.items():
            if (d.choices is None or len(d.choices) > 1) and k in self.reference:
                out[k] = self.reference[k]
        return out

    @staticmethod
    def _config(attention, params, dims, task_fields, model_config_cls):
        dims = dict(dims)
        ratio = dims.pop("ffn_ratio", 4)
        cfg = {**dims, "attention": attention, "attention_params": params, **task_fields}
        cfg["d_ff"] = max(1, int(round(cfg["d_model"] * ratio)))
        return model_config_cls.from_dict(cfg)

    def to_yaml(self) -> str:
        doc = {
            "name": self.name,
            "description": self.description,
            "reference": self.reference,
            "model": {k: d.to_yaml() for k, d in self.model.items()},
            "attention": {a: {p: d.to_yaml() for p, d in ps.items()} for a, ps in self.attention.items()},
        }
        return yaml.safe_dump(doc, sort_keys=False)

    def size(self) -> float:
        """Number of discrete configurations (inf when a float range is searched)."""

        def count(d: Dim) -> float:
            if d.choices is not None:
                return len(d.choices)
            if d.is_int:
                return (int(d.high) - int(d.low)) // int(d.step or 1) + 1
            return math.inf

        model = math.prod(count(d) for d in self.model.values())
        return model * sum(math.prod(count(d) for d in ps.values()) for ps in self.attention.values())


def list_spaces() -> list[str]:
    """Names of the spaces shipped with xsearch."""
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".yaml"))


def _read(name_or_path: str | Path) -> tuple[str, Any]:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"no such search space file: {path}")
        text, source = path.read_text(encoding="utf-8"), str(path)
    else:
        if name_or_path not in list_spaces():
            raise SpaceError(
                f"unknown search space {name_or_path!r}; shipped: {', '.join(list_spaces())} (or a .yaml path)"
            )
        text = resources.files(__name__).joinpath(f"{name_or_path}.yaml").read_text(encoding="utf-8")
        source = f"{name_or_path}.yaml"
    try:
        return source, yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpaceError(f"{source}: malformed YAML ({e})") from None


def load_space(name_or_path: str | Path, *, causal: bool | None = None, max_len: int | None = None) -> SearchSpace:
    """Load and validate a space; drop what cannot work for the task.

    Args:
        name_or_path: a shipped space name (``list_spaces()``) or a YAML path.
        causal: True for decoder tasks (``lm``): variants that cannot decode are removed.
        max_len: the task's sequence length: length parameters beyond it are removed, and
            variants left without a valid value are dropped.

    Raises:
        SpaceError: a malformed file, with the key and value at fault.
    """
    from xsearch.attention import attention_spec, build_attention, list_attentions

    source, doc = _read(name_or_path)
    if not isinstance(doc, dict):
        raise SpaceError(f"{source}: expected a mapping at the top level")
    unknown = sorted(set(doc) - TOP_KEYS)
    if unknown:
        raise SpaceError(f"{source}: unknown key {unknown[0]!r} (valid: {', '.join(sorted(TOP_KEYS))})")
    for key in ("model", "attention"):
        if not isinstance(doc.get(key), dict) or not doc[key]:
            raise SpaceError(f"{source}: '{key}' must be a non-empty mapping")
    model = {}
    for key, raw in doc["model"].items():
        if key not in MODEL_KEYS:
            raise SpaceError(f"{source}: unknown model key {key!r} (valid: {', '.join(sorted(MODEL_KEYS))})")
        model[key] = _parse_dim(f"{source}: model.{key}", raw)
    for key in ("d_model", "n_layers", "n_heads"):
        if key not in model:
            raise SpaceError(f"{source}: model.{key} is required")
    for key in ("d_model", "n_layers", "n_heads"):
        for v in model[key].values():
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise SpaceError(f"{source}: model.{key} values must be positive ints, got {v!r}")
    if model["d_model"].is_range or model["n_heads"].is_range:
        raise SpaceError(
            f"{source}: model.d_model and model.n_heads must be lists (each d_model must split into heads)"
        )
    for d, h in itertools.product(model["d_model"].values(), model["n_heads"].values()):
        if d % h:
            raise SpaceError(f"{source}: model.d_model {d} is not divisible by model.n_heads {h}")

    attention: dict[str, dict[str, Dim]] = {}
    excluded: dict[str, str] = {}
    valid = list_attentions()
    for name, raw_params in doc["attention"].items():
        if name not in valid:
            raise SpaceError(f"{source}: unknown attention {name!r} (valid: {', '.join(valid)})")
        raw_params = raw_params or {}
        if not isinstance(raw_params, dict):
            raise SpaceError(f"{source}: attention.{name} must be a mapping of parameters, got {raw_params!r}")
        spec = attention_spec(name)
        params = {}
        for p, raw in raw_params.items():
            where = f"{source}: attention.{name}.{p}"
            if p not in spec.params:
                raise SpaceError(f"{where}: {name!r} has no parameter {p!r} (valid: {', '.join(spec.params)})")
            dim = _parse_dim(where, raw)
            for v in dim.values():
                try:
                    spec.resolve_params({p: v})
                except ValueError as e:
                    raise SpaceError(f"{where}: {e}") from None
            params[p] = dim
        if causal and not spec.causal:
            excluded[name] = "cannot decode (causal task)"
            continue
        if max_len is not None:
            params, why = _fit_lengths(params, max_len)
            if why:
                excluded[name] = why
                continue
        attention[name] = params
    if not attention:
        raise SpaceError(f"{source}: no attention variant is left for this task ({excluded})")
    for name, params in attention.items():
        _check_builds(source, name, params, causal, max_len, build_attention)

    reference = dict(doc.get("reference") or {"attention": "full"})
    ref_attention = reference.get("attention", "full")
    if ref_attention not in attention:
        raise SpaceError(f"{source}: reference.attention {ref_attention!r} is not in the space's attention list")
    for key, value in reference.items():
        if key == "attention":
            continue
        if key not in model:
            raise SpaceError(f"{source}: reference.{key} is not a model dimension of the space")
        dim = model[key]
        ok = value in dim.choices if dim.choices is not None else dim.low <= value <= dim.high
        if not ok:
            raise SpaceError(f"{source}: reference.{key}={value!r} is outside the space ({dim.to_yaml()})")
    missing = [k for k in ("d_model", "n_layers", "n_heads") if k not in reference]
    if missing:
        raise SpaceError(f"{source}: reference needs {', '.join(missing)}")
    for key, dim in model.items():  # dimensions the reference leaves open: the vanilla value
        if key not in reference:
            default = REFERENCE_DEFAULTS.get(key)
            inside = default is not None and (
                default in dim.choices if dim.choices is not None else dim.low <= default <= dim.high
            )
            reference[key] = default if inside else dim.values()[0]
    for name, why in excluded.items():
        log.info("search space %s: %s excluded: %s", doc.get("name", source), name, why)
    return SearchSpace(
        name=str(doc.get("name", Path(source).stem)),
        model=model,
        attention=attention,
        reference=reference,
        description=str(doc.get("description", "")),
        excluded=excluded,
    )


def _fit_lengths(params: dict[str, Dim], max_len: int) -> tuple[dict[str, Dim], str | None]:
    out = {}
    for p, dim in params.items():
        if p not in LENGTH_PARAMS:
            out[p] = dim
            continue
        if dim.choices is not None:
            keep = tuple(v for v in dim.choices if v <= max_len)
            if not keep:
                return params, f"every {p} in {list(dim.choices)} exceeds max_len={max_len}"
            out[p] = Dim(choices=keep)
        else:
            if dim.low > max_len:
                return params, f"{p} >= {dim.low} exceeds max_len={max_len}"
            out[p] = Dim(low=dim.low, high=min(dim.high, max_len), step=dim.step, log=dim.log)
    return out, None


def _check_builds(source, name, params, causal, max_len, build_attention) -> None:
    """Every single choice builds (others at their first value), so bad values fail on load."""
    first = {p: d.values()[0] for p, d in params.items()}
    for p, dim in params.items():
        for v in dim.values():
            try:
                build_attention(name, 16, 2, causal=bool(causal), max_len=max_len or 64, **{**first, p: v})
            except ValueError as e:
                raise SpaceError(f"{source}: attention.{name}.{p}={v!r} does not build: {e}") from None
