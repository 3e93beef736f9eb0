"""Softmax attention as one operator, so that an exported graph runs it as one fused node.

``fused_attention`` is a torch custom op (``xsearch::attention``): in eager torch it is
``scaled_dot_product_attention``; ``xsearch.export`` translates it to onnxruntime's
``com.microsoft.MultiHeadAttention``, whose CPU kernel is a flash attention (blocks of queries
and keys sized to the L2 cache, the scores never written out whole) when there is no mask.
A per-key mask is folded into the product before the call (``_base._attention_graph``), so
key padding does not keep a model off that path. Used only while exporting.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

_ALLOWED = contextvars.ContextVar("xsearch_fused_attention", default=True)


@contextlib.contextmanager
def standard_ops_only():
    """Within this block attention is never fused, so an export uses standard ONNX operators only
    (for runtimes other than onnxruntime)."""
    token = _ALLOWED.set(False)
    try:
        yield
    finally:
        _ALLOWED.reset(token)


@torch.library.custom_op("xsearch::attention", mutates_args=())
def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """``softmax(q k^T * scale) v`` for ``q (B, H, L, Dq)``, ``k (B, H, S, Dq)``, ``v (B, H, S, Dv)``."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)


@fused_attention.register_fake
def _(q, k, v, scale):
    return q.new_empty(*q.shape[:-1], v.shape[-1])


def fused_attention_applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether ``fused_attention`` takes these inputs: 4-D with the same batch and heads (the
    onnxruntime kernel does not broadcast) and float32 (its CPU flash path is float32 only; an
    fp16 conversion later still runs it, unfused), outside ``standard_ops_only``."""
    if not _ALLOWED.get():
        return False
    if not (q.dim() == k.dim() == v.dim() == 4 and q.dtype == k.dtype == v.dtype == torch.float32):
        return False
    same = (statically_known_true(q.shape[i] == t.shape[i]) for t in (k, v) for i in (0, 1))
    return all(same) and statically_known_true(k.shape[2] == v.shape[2])
