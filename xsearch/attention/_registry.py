"""Register, list and build attention variants by name."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

from torch import nn

from xsearch.attention._base import Attention, AttentionSpec
from xsearch.errors import XSearchError

_REGISTRY: dict[str, type[Attention]] = {}
_LOADED = False


def register(spec: AttentionSpec):
    """Class decorator: attach ``spec`` to an ``Attention`` subclass and register it under ``spec.name``."""

    def wrap(cls: type[Attention]) -> type[Attention]:
        if spec.name in _REGISTRY and _REGISTRY[spec.name] is not cls:
            raise XSearchError(f"attention {spec.name!r} is registered twice")
        cls.spec = spec
        _REGISTRY[spec.name] = cls
        return cls

    return wrap


def _load_all() -> None:
    """Import every variant module in this package (one file per variant, no leading underscore)."""
    global _LOADED
    if _LOADED:
        return
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if not info.name.startswith("_"):
            importlib.import_module(f"xsearch.attention.{info.name}")
    _LOADED = True


def list_attentions(causal: bool | None = None) -> list[str]:
    """Sorted names of the registered variants; ``causal=True`` keeps the decoder-capable ones."""
    _load_all()
    return sorted(n for n, c in _REGISTRY.items() if causal is None or c.spec.causal == causal)


def attention_class(name: str) -> type[Attention]:
    """The class registered under ``name``; ``ValueError`` listing the valid names otherwise."""
    _load_all()
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise XSearchError(f"unknown attention {name!r}; valid: {', '.join(list_attentions())}") from None


def attention_spec(name: str) -> AttentionSpec:
    """The ``AttentionSpec`` of variant ``name``."""
    return attention_class(name).spec


def build_attention(
    name: str,
    d_model: int,
    n_heads: int,
    *,
    causal: bool = False,
    max_len: int | None = None,
    dropout: float = 0.0,
    head_dim: int | None = None,
    **params: Any,
) -> nn.Module:
    """Build attention variant ``name``: a module mapping ``(B, N, d_model)`` to ``(B, N, d_model)``.

    Args:
        name: a name from ``list_attentions()``.
        d_model: model width.
        n_heads: number of heads.
        causal: decoder mode (no position attends a later one).
        max_len: longest sequence the module accepts (required by variants with
            length-dependent parameters such as ``linformer``).
        dropout: dropout on the output projection.
        head_dim: per-head width; defaults to ``d_model // n_heads``.
        **params: the variant's hyper-parameters (see ``attention_spec(name).params``).

    Raises:
        ValueError: unknown name, unknown or invalid parameter, or ``causal=True`` for a
            variant that cannot decode.
    """
    cls = attention_class(name)
    if causal and not cls.spec.causal:
        decoders = ", ".join(list_attentions(causal=True))
        raise XSearchError(f"attention {name!r} cannot be causal (decoder-capable: {decoders})")
    return cls(d_model, n_heads, causal=causal, max_len=max_len, dropout=dropout, head_dim=head_dim, **params)
