"""The attention zoo: one file per efficient-attention variant, registered by name."""

from xsearch.attention._base import FAMILIES, Attention, AttentionSpec
from xsearch.attention._registry import (
    attention_class,
    attention_spec,
    build_attention,
    list_attentions,
    register,
)

__all__ = [
    "FAMILIES",
    "Attention",
    "AttentionSpec",
    "attention_class",
    "attention_spec",
    "build_attention",
    "list_attentions",
    "register",
]
