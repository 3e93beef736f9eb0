"""``ModelConfig``: everything needed to rebuild a model, as plain JSON-able data."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from xsearch.errors import XSearchError
from xsearch.settings import option

HEADS = ("classify", "lm")
WEIGHT_SHARING = ("none", "all", "attention", "ffn")
POS_ENCODINGS = ("sinusoidal", "nested_sinusoidal", "learned")
POOLINGS = ("mean", "first")
#: What one entry of ``ModelConfig.layers`` may set; a key it leaves out takes the config's own value.
LAYER_KEYS = ("attention", "attention_params", "n_heads", "head_dim", "d_ff")


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise XSearchError(f"ModelConfig.{name} must be a positive int, got {value!r}")


def _choice(name: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise XSearchError(f"ModelConfig.{name} must be one of {list(options)}, got {value!r}")


@dataclass
class ModelConfig:
    """Architecture of an xsearch model; validated on construction.

    Attributes:
        vocab_size: number of token ids (id 0 is padding).
        max_len: longest sequence the model accepts.
        d_model: width of the residual stream.
        n_layers: number of Transformer blocks.
        n_heads: attention heads per block.
        head_dim: per-head width (default ``d_model // n_heads``; pruning can change ``n_heads``
            while keeping it).
        d_ff: hidden width of the feed-forward sub-layer (default ``4 * d_model``).
        attention: a name from ``xsearch.list_attentions()``.
        attention_params: that variant's hyper-parameters (defaults filled in).
        causal: decoder mode; required for ``head="lm"``.
        head: ``"classify"`` (pooled over real tokens -> ``n_classes``) or ``"lm"`` (per position -> vocab).
        n_classes: classes of the ``classify`` head.
        weight_sharing: ``"none"``, ``"all"`` (one block reused, ALBERT), ``"attention"`` or ``"ffn"``.
        dropout: dropout rate.
        pos_encoding: ``"sinusoidal"``, ``"nested_sinusoidal"`` (the same frequencies in an order in which a
            narrower width's table is the leading columns of a wider one's: ``sinusoidal_positions``) or
            ``"learned"``.
        pooling: how the ``classify`` head reads the sequence: ``"mean"`` over the real tokens, or
            ``"first"``: the first token's final state (Long Range Arena's CLS pooling; ListOps'
            answer is decided by its outermost operator, which is always the first token).
        ffn_dims: per-layer FFN widths after pruning (``None`` = ``d_ff`` everywhere).
        layers: one dict per layer (``LAYER_KEYS``: attention, attention_params, n_heads,
            head_dim, d_ff) for a heterogeneous model; ``n_layers`` must equal its length. A key
            an entry leaves out takes the config's own value (``attention_params`` only where the
            entry keeps the config's attention; ``head_dim`` is ``d_model // n_heads`` where the
            entry sets its own heads). Entries are stored complete. ``None``: every layer is the
            config's own.
    """

    vocab_size: int
    max_len: int
    d_model: int = option(128, "width of the residual stream")
    n_layers: int = option(2, "Transformer blocks")
    n_heads: int = option(4, "attention heads per block")
    head_dim: int | None = option(None, "width of each head (default: d_model / heads)")
    d_ff: int | None = option(None, "hidden width of the feed-forward layers (default: 4 x d_model)")
    attention: str = option("full", "attention variant (see `xsearch list`)")
    attention_params: dict[str, Any] = option(factory=dict, help="the variant's parameters (defaults filled in)")
    causal: bool = False
    head: str = "classify"
    n_classes: int = 2
    weight_sharing: str = option("none", "weights shared across layers", choices=WEIGHT_SHARING)
    dropout: float = option(0.0, "dropout rate")
    pos_encoding: str = option("sinusoidal", "position encoding", choices=POS_ENCODINGS)
    pooling: str = option(
        "mean", "what the classify head reads: the mean over real tokens or the first token", choices=POOLINGS
    )
    ffn_dims: list[int] | None = None
    layers: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "d_model", "n_layers", "n_heads"):
            _positive_int(name, getattr(self, name))
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise XSearchError(
                    f"ModelConfig: d_model={self.d_model} is not divisible by n_heads={self.n_heads}; set head_dim"
                )
            self.head_dim = self.d_model // self.n_heads
        _positive_int("head_dim", self.head_dim)
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        _positive_int("d_ff", self.d_ff)
        _choice("head", self.head, HEADS)
        _choice("weight_sharing", self.weight_sharing, WEIGHT_SHARING)
        _choice("pos_encoding", self.pos_encoding, POS_ENCODINGS)
        _choice("pooling", self.pooling, POOLINGS)
        if not isinstance(self.causal, bool):
            raise XSearchError(f"ModelConfig.causal must be a bool, got {self.causal!r}")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise XSearchError(f"ModelConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if self.head == "classify":
            _positive_int("n_classes", self.n_classes)
            if self.n_classes < 2:
                raise XSearchError(f"ModelConfig.n_classes must be >= 2, got {self.n_classes}")
        if self.head == "lm" and not self.causal:
            raise XSearchError("ModelConfig: head='lm' needs causal=True (a language model must not see the future)")
        if self.ffn_dims is not None:
            if len(self.ffn_dims) != self.n_layers:
                raise XSearchError(f"ModelConfig.ffn_dims has {len(self.ffn_dims)} entries for {self.n_layers} layers")
            for d in self.ffn_dims:
                _positive_int("ffn_dims[i]", d)
        self.attention_params = self._check_attention("ModelConfig", self.attention, self.attention_params)
        if self.layers is not None:
            self.layers = self._resolve_layers(self.layers)

    def _check_attention(self, where: str, name: Any, params: Any) -> dict[str, Any]:
        """Name, parameters and causality checked against the registry (imports torch); the resolved params."""
        from xsearch.attention import attention_spec, list_attentions

        if not isinstance(params, dict):
            raise XSearchError(f"{where}.attention_params must be a dict, got {params!r}")
        if name not in list_attentions():
            raise XSearchError(f"{where}.attention: unknown attention {name!r} (valid: {', '.join(list_attentions())})")
        spec = attention_spec(name)
        try:
            params = spec.resolve_params(params)
            spec.check_limits(params, self.max_len)
        except XSearchError as e:
            raise XSearchError(f"{where}: {e}") from None
        if self.causal and not spec.causal:
            raise XSearchError(
                f"{where}: attention {name!r} cannot be causal "
                f"(decoder-capable: {', '.join(list_attentions(causal=True))})"
            )
        return params

    def _resolve_layers(self, layers: Any) -> list[dict[str, Any]]:
        if not isinstance(layers, list) or not layers:
            raise XSearchError(f"ModelConfig.layers must be a non-empty list of dicts, got {layers!r}")
        if len(layers) != self.n_layers:
            raise XSearchError(f"ModelConfig.layers has {len(layers)} entries for n_layers={self.n_layers}")
        if self.ffn_dims is not None:
            raise XSearchError("ModelConfig: set each layer's d_ff in layers, not ffn_dims, for a per-layer model")
        out = []
        for i, entry in enumerate(layers):
            where = f"ModelConfig.layers[{i}]"
            if not isinstance(entry, dict):
                raise XSearchError(f"{where} must be a dict, got {entry!r}")
            unknown = sorted(set(entry) - set(LAYER_KEYS))
            if unknown:
                raise XSearchError(f"{where}: unknown key {unknown[0]!r} (valid: {', '.join(LAYER_KEYS)})")
            attention = entry.get("attention", self.attention)
            own = self.attention_params if attention == self.attention else {}
            n_heads = entry.get("n_heads", self.n_heads)
            _positive_int(f"layers[{i}].n_heads", n_heads)
            head_dim = entry.get("head_dim")
            if head_dim is None:
                if "n_heads" not in entry:
                    head_dim = self.head_dim
                elif self.d_model % n_heads:
                    raise XSearchError(
                        f"{where}: d_model={self.d_model} is not divisible by n_heads={n_heads}; set head_dim"
                    )
                else:
                    head_dim = self.d_model // n_heads
            _positive_int(f"layers[{i}].head_dim", head_dim)
            d_ff = entry.get("d_ff", self.d_ff)
            _positive_int(f"layers[{i}].d_ff", d_ff)
            params = self._check_attention(where, attention, entry.get("attention_params", own))
            out.append({"attention": attention, "attention_params": params, "n_heads": n_heads,
                        "head_dim": head_dim, "d_ff": d_ff})  # fmt: skip
        shared = {"all": LAYER_KEYS, "attention": LAYER_KEYS[:4], "ffn": ("d_ff",)}.get(self.weight_sharing, ())
        for i, entry in enumerate(out[1:], start=1):
            for key in shared:
                if entry[key] != out[0][key]:
                    raise XSearchError(
                        f"ModelConfig.layers[{i}].{key}={entry[key]!r} differs from layer 0's {out[0][key]!r}, "
                        f"but weight_sharing={self.weight_sharing!r} shares it"
                    )
        return out

    def layer_configs(self) -> list[dict[str, Any]]:
        """Each layer's ``LAYER_KEYS`` (complete), for a per-layer config and a uniform one alike.

        A pruned uniform config's ``ffn_dims`` are its layers' ``d_ff``.
        """
        if self.layers is not None:
            return [dict(entry, attention_params=dict(entry["attention_params"])) for entry in self.layers]
        dims = self.ffn_dims or [self.d_ff] * self.n_layers
        return [
            {"attention": self.attention, "attention_params": dict(self.attention_params), "n_heads": self.n_heads,
             "head_dim": self.head_dim, "d_ff": d}
            for d in dims
        ]  # fmt: skip

    @property
    def per_layer(self) -> bool:
        """Whether the layers differ (a ``layers`` list whose entries are not all the same)."""
        return self.layers is not None and any(entry != self.layers[0] for entry in self.layers[1:])

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-able) of every field."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Rebuild from ``to_dict()`` output; unknown keys are an error naming them."""
        if not isinstance(data, dict):
            raise XSearchError(f"ModelConfig.from_dict needs a dict, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise XSearchError(f"ModelConfig: unknown field {unknown[0]!r} (valid: {', '.join(sorted(known))})")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise XSearchError(f"ModelConfig: malformed JSON ({e})") from None
        return cls.from_dict(data)


def describe_config(cfg: ModelConfig | dict[str, Any]) -> str:
    """One line for a model config (or its dict): ``local(block_size=64) d128 L2 H4 ff256``; the weight sharing,
    pooling and position encoding follow where they are not the defaults (``share=all pool=first pos=learned``).

    A per-layer config lists its layers: ``d128 L2 [local(block_size=64) H4 ff256 | linear() H8 ff512]``.
    """
    if isinstance(cfg, ModelConfig):
        cfg = cfg.to_dict()
    share, pooling = cfg.get("weight_sharing", "none"), cfg.get("pooling", "mean")
    pos = cfg.get("pos_encoding", "sinusoidal")
    tail = ("" if share == "none" else f" share={share}") + ("" if pooling == "mean" else f" pool={pooling}")
    tail += "" if pos == "sinusoidal" else f" pos={pos}"
    layers = cfg.get("layers")
    if layers and any(entry != layers[0] for entry in layers[1:]):
        inner = " | ".join(
            f"{_attention_text(e['attention'], e['attention_params'])} H{e['n_heads']} ff{e['d_ff']}" for e in layers
        )
        return f"d{cfg.get('d_model')} L{cfg.get('n_layers')} [{inner}]{tail}"
    if layers:  # the same entry in every layer: the uniform line
        cfg = {**cfg, **layers[0], "ffn_dims": None}
    dims = sorted(set(cfg.get("ffn_dims") or []))
    ff = "/".join(map(str, dims)) if dims else cfg.get("d_ff")  # pruned FFN widths when the model was pruned
    size = f"d{cfg.get('d_model')} L{cfg.get('n_layers')} H{cfg.get('n_heads')} ff{ff}"
    return f"{_attention_text(cfg.get('attention', '?'), cfg.get('attention_params'))} {size}{tail}"


def _attention_text(name: str, params: dict[str, Any] | None) -> str:
    return f"{name}(" + ",".join(f"{k}={v}" for k, v in (params or {}).items()) + ")"
