"""Reading a space: shipped names or YAML files, validated on load, with what cannot work for the task dropped."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from xsearch.errors import MissingPathError
from xsearch.search_spaces.dims import Dim, SpaceError, parse_dim
from xsearch.search_spaces.space import SearchSpace

log = logging.getLogger("xsearch.search")

PACKAGE = "xsearch.search_spaces"  # where the shipped .yaml files live
MODEL_KEYS = {"d_model", "n_layers", "n_heads", "ffn_ratio", "weight_sharing", "pos_encoding", "dropout", "pooling"}
TOP_KEYS = {"name", "description", "reference", "model", "attention", "per_layer"}
# What the vanilla Transformer uses where a space's reference does not say.
REFERENCE_DEFAULTS = {
    "weight_sharing": "none",
    "ffn_ratio": 4,
    "pos_encoding": "sinusoidal",
    "dropout": 0.0,
    "pooling": "mean",
}


def list_spaces() -> list[str]:
    """Names of the spaces shipped with xsearch."""
    return sorted(p.name[:-5] for p in resources.files(PACKAGE).iterdir() if p.name.endswith(".yaml"))


def _read(name_or_path: str | Path) -> tuple[str, str]:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise MissingPathError(f"no such search space file: {path}")
        text, source = path.read_text(encoding="utf-8"), str(path)
    else:
        if name_or_path not in list_spaces():
            raise SpaceError(
                f"unknown search space {name_or_path!r}; shipped: {', '.join(list_spaces())} (or a .yaml path)"
            )
        text = resources.files(PACKAGE).joinpath(f"{name_or_path}.yaml").read_text(encoding="utf-8")
        source = f"{name_or_path}.yaml"
    return source, text


def _parse(source: str, text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpaceError(f"{source}: malformed YAML ({e})") from None


def load_space(
    name_or_path: str | Path,
    *,
    causal: bool | None = None,
    max_len: int | None = None,
    defaults: dict[str, Any] | None = None,
) -> SearchSpace:
    """Load and validate a space; drop what cannot work for the task.

    Args:
        name_or_path: a shipped space name (``list_spaces()``) or a YAML path.
        causal: True for decoder tasks (``lm``): variants that cannot decode are removed.
        max_len: the task's sequence length: length parameters beyond it are removed, and
            variants left without a valid value are dropped.
        defaults: model dimensions the task suggests (``Task.model_defaults()``): each one the
            space leaves out becomes a fixed dimension, and the reference takes it where inside.

    Raises:
        SpaceError: a malformed file, with the key and value at fault.
    """
    source, text = _read(name_or_path)
    return space_from_yaml(text, source=source, causal=causal, max_len=max_len, defaults=defaults)


def load_space_for_task(name_or_path: str | Path, task, *, defaults: dict[str, Any] | None = None) -> SearchSpace:
    """``load_space`` fitted to ``task`` (a ``Task``): its kind, length and model defaults (``defaults`` over
    them: model values the space takes where it does not set its own)."""
    defaults = {**task.model_defaults(), **(defaults or {})}
    return load_space(name_or_path, causal=task.kind == "lm", max_len=task.max_len, defaults=defaults)


def space_from_yaml(
    text: str,
    *,
    source: str = "<yaml>",
    causal: bool | None = None,
    max_len: int | None = None,
    defaults: dict[str, Any] | None = None,
) -> SearchSpace:
    """``load_space`` of a space's YAML text (``SearchSpace.to_yaml()``; a supernet keeps its space so)."""
    from xsearch.attention import attention_spec, build_attention, list_attentions

    doc = _parse(source, text)
    if not isinstance(doc, dict):
        raise SpaceError(f"{source}: expected a mapping at the top level")
    unknown = sorted(set(doc) - TOP_KEYS)
    if unknown:
        raise SpaceError(f"{source}: unknown key {unknown[0]!r} (valid: {', '.join(sorted(TOP_KEYS))})")
    for key in ("model", "attention"):
        if not isinstance(doc.get(key), dict) or not doc[key]:
            raise SpaceError(f"{source}: '{key}' must be a non-empty mapping")
    per_layer = doc.get("per_layer", False)
    if not isinstance(per_layer, bool):
        raise SpaceError(f"{source}: per_layer must be true or false, got {per_layer!r}")
    model = {}
    for key, raw in doc["model"].items():
        if key not in MODEL_KEYS:
            raise SpaceError(f"{source}: unknown model key {key!r} (valid: {', '.join(sorted(MODEL_KEYS))})")
        model[key] = parse_dim(f"{source}: model.{key}", raw)
    for key, value in (defaults or {}).items():
        if key not in MODEL_KEYS:
            raise SpaceError(f"task default {key!r} is not a model dimension (valid: {', '.join(sorted(MODEL_KEYS))})")
        model.setdefault(key, Dim(choices=(value,)))
    for key, choices in _model_choices().items():  # the ModelConfig fields of closed choice (pooling, ...)
        for v in model[key].values() if key in model else ():
            if v not in choices:
                raise SpaceError(f"{source}: model.{key} {v!r} is not one of {list(choices)}")
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
    sharing = model.get("weight_sharing")
    if per_layer and sharing is not None and sharing.values() != ["none"]:
        raise SpaceError(
            f"{source}: model.weight_sharing {sharing.to_yaml()!r} in a per_layer space "
            "(layers that differ share nothing: leave it out or set it to none)"
        )

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
            dim = parse_dim(where, raw)
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
    prefer = {**REFERENCE_DEFAULTS, **(defaults or {})}
    for key, dim in model.items():  # dimensions the reference leaves open: the task's or the vanilla value
        if key not in reference:
            default = prefer.get(key)
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
        per_layer=per_layer,
    )


def _model_choices() -> dict[str, tuple]:
    """Model dimension -> the values ``ModelConfig`` accepts, for the dimensions it declares with choices."""
    from xsearch.config import ModelConfig

    fields = {f.name: f.metadata.get("choices") for f in dataclasses.fields(ModelConfig)}
    return {k: tuple(fields[k]) for k in MODEL_KEYS if fields.get(k)}


def _fit_lengths(params: dict[str, Dim], max_len: int) -> tuple[dict[str, Dim], str | None]:
    """Drop choices of the parameters measured in tokens that are longer than the task (``LENGTH_PARAMS``)."""
    from xsearch.attention import LENGTH_PARAMS

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
    """Every single choice builds (others at their first value), so bad values fail on load.

    Without a task (``max_len`` None) the check runs at a length that admits every length choice.
    """
    from xsearch.attention import LENGTH_PARAMS

    first = {p: d.values()[0] for p, d in params.items()}
    lengths = [v for p, d in params.items() if p in LENGTH_PARAMS for v in d.values() if isinstance(v, (int, float))]
    probe_len = max_len or int(max([64, *lengths]))
    for p, dim in params.items():
        for v in dim.values():
            try:
                build_attention(name, 16, 2, causal=bool(causal), max_len=probe_len, **{**first, p: v})
            except ValueError as e:
                raise SpaceError(f"{source}: attention.{name}.{p}={v!r} does not build: {e}") from None
