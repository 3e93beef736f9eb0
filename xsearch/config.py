"""``ModelConfig``: everything needed to rebuild a model, as plain JSON-able data."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from xsearch.errors import XSearchError
from xsearch.settings import option

HEADS = ("classify", "lm")
WEIGHT_SHARING = ("none", "all", "attention", "ffn")
POS_ENCODINGS = ("sinusoidal", "learned")


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
        pos_encoding: ``"sinusoidal"`` or ``"learned"``.
        ffn_dims: per-layer FFN widths after pruning (``None`` = ``d_ff`` everywhere).
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
    ffn_dims: list[int] | None = None

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
        if not isinstance(self.attention_params, dict):
            raise XSearchError(f"ModelConfig.attention_params must be a dict, got {self.attention_params!r}")
        if self.ffn_dims is not None:
            if len(self.ffn_dims) != self.n_layers:
                raise XSearchError(f"ModelConfig.ffn_dims has {len(self.ffn_dims)} entries for {self.n_layers} layers")
            for d in self.ffn_dims:
                _positive_int("ffn_dims[i]", d)
        # Name, parameters and causality are checked against the registry (imports torch).
        from xsearch.attention import attention_spec

        spec = attention_spec(self.attention)
        self.attention_params = spec.resolve_params(self.attention_params)
        spec.check_limits(self.attention_params, self.max_len)
        if self.causal and not spec.causal:
            from xsearch.attention import list_attentions

            raise XSearchError(
                f"ModelConfig: attention {self.attention!r} cannot be causal "
                f"(decoder-capable: {', '.join(list_attentions(causal=True))})"
            )

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
    """One line for a model config (or its dict): ``local(block_size=64) d128 L2 H4 ff256``."""
    if isinstance(cfg, ModelConfig):
        cfg = cfg.to_dict()
    params = ",".join(f"{k}={v}" for k, v in (cfg.get("attention_params") or {}).items())
    dims = sorted(set(cfg.get("ffn_dims") or []))
    ff = "/".join(map(str, dims)) if dims else cfg.get("d_ff")  # pruned FFN widths when the model was pruned
    size = f"d{cfg.get('d_model')} L{cfg.get('n_layers')} H{cfg.get('n_heads')} ff{ff}"
    share = cfg.get("weight_sharing", "none")
    return f"{cfg.get('attention', '?')}({params}) {size}" + ("" if share == "none" else f" share={share}")
