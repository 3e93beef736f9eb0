"""The attention zoo: one file per efficient-attention variant, registered by name."""

from xsearch.attention._base import (
    COUNT_LIMITS,
    FAMILIES,
    LENGTH_PARAMS,
    Attention,
    AttentionSpec,
    exporting,
    slice_linear,
)
from xsearch.attention._fused import standard_ops_only
from xsearch.attention._registry import (
    attention_class,
    attention_spec,
    build_attention,
    list_attentions,
    register,
)

__all__ = [
    "COUNT_LIMITS",
    "LENGTH_PARAMS",
    "FAMILIES",
    "Attention",
    "AttentionSpec",
    "attention_class",
    "attention_spec",
    "build_attention",
    "list_attentions",
    "exporting",
    "register",
    "slice_linear",
    "standard_ops_only",
]
