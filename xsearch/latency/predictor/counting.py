"""What one forward pass does, counted while it runs: FLOPs by kind and the elements operations touch.

The operation counts stand in for the memory traffic and per-operator overhead that dominate many
efficient variants on a CPU, where FLOPs alone mislead.
"""

from __future__ import annotations

import math


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of fused attention: ``Q K^T`` and ``P V`` (the CPU kernel is not in torch's table)."""
    *batch, s_q, d_q = query_shape
    s_k, d_v = key_shape[-2], value_shape[-1]
    return 2 * math.prod(batch) * s_q * s_k * (d_q + d_v)


# What an operation costs is read off its kind: matrix products by their FLOPs, the rest by the
# elements they touch (reductions and sorts by what they read, everything else by what it writes).
# Operators that only build constants from shapes (folded away in an exported graph) are counted
# as operations but touch nothing.
_ATTENTION_OPS = frozenset({
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math", "scaled_dot_product_attention",
})  # fmt: skip
_MATMUL_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "convolution", "einsum"})
_REDUCTION_OPS = frozenset({
    "native_layer_norm", "layer_norm", "_softmax", "softmax", "_log_softmax", "logsumexp", "sum", "mean", "amax",
    "amin", "max", "min", "argmax", "argmin", "linalg_vector_norm", "norm", "any", "all", "var", "std", "prod",
    "cumsum", "cumprod",
})  # fmt: skip
_SORT_OPS = frozenset({"sort", "topk", "argsort", "kthvalue", "median"})
_MOVEMENT_OPS = frozenset({
    "cat", "stack", "clone", "_to_copy", "copy", "copy_", "contiguous", "index", "index_select", "gather", "scatter",
    "scatter_add", "scatter_reduce", "index_put", "index_put_", "index_add", "constant_pad_nd", "embedding",
    "repeat", "roll", "flip", "tril", "triu", "masked_select", "_unsafe_view",
})  # fmt: skip
_CONSTANT_OPS = frozenset({
    "arange", "new_full", "new_zeros", "new_ones", "new_empty", "scalar_tensor", "zeros", "ones", "full", "empty",
    "eye", "zeros_like", "ones_like", "full_like", "empty_like", "_local_scalar_dense", "lift_fresh",
})  # fmt: skip
#: The kinds ``forward_counts`` reports, besides ``flops``, ``ops`` and ``elements``.
COUNT_KINDS = ("flops_matmul", "flops_attention", "elements_attention", "elements_pointwise", "elements_reduction",
               "elements_movement", "elements_sort")  # fmt: skip


def _op_kind(name: str) -> str:
    if name in _CONSTANT_OPS:
        return "constant"
    if name in _REDUCTION_OPS:
        return "elements_reduction"
    if name in _SORT_OPS:
        return "elements_sort"
    if name in _MOVEMENT_OPS:
        return "elements_movement"
    return "elements_pointwise"


def forward_counts(model, seq_len: int, batch: int = 1) -> dict[str, int]:
    """Count what one forward pass of ``model`` on ``(batch, seq_len)`` tokens does.

    FLOPs come from ``torch.utils.flop_counter.FlopCounterMode`` (matrix products,
    convolutions, attention), read off the real operations rather than a per-variant formula
    that would have to follow each of the 19 variants' code. ``ops`` counts the tensor
    operations that are not views; ``elements`` sums the sizes of their outputs. The same work
    is also split by kind (``COUNT_KINDS``): FLOPs of matrix products and of fused attention,
    the attention scores that fused attention computes (an exported graph may hold them in memory),
    and the elements touched by pointwise operations, reductions (layer norm, softmax, sums),
    data movement (concatenation, copies, gathers, scatters) and sorts (Reformer's buckets,
    Routing's top-k), which a CPU runs at very different speeds.

    Returns:
        ``{"flops": ..., "ops": ..., "elements": ..., "flops_matmul": ..., ...}``.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch.utils.flop_counter import FlopCounterMode

    def numel(tree) -> int:
        return sum(t.numel() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))

    class _OpCounter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.counts = dict.fromkeys(("ops", "elements", *COUNT_KINDS), 0)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view:
                name = func.overloadpacket.__name__
                self.counts["ops"] += 1
                self.counts["elements"] += numel(out)
                if name in _ATTENTION_OPS:  # the scores: (..., Sq, Sk), in memory unless the kernel fuses
                    query, key = args[0], args[1]
                    self.counts["elements_attention"] += query.shape[:-1].numel() * key.shape[-2]
                elif name not in _MATMUL_OPS:
                    kind = _op_kind(name)
                    if kind in ("elements_reduction", "elements_sort"):
                        self.counts[kind] += numel((args, kwargs))
                    elif kind != "constant":
                        self.counts[kind] += numel(out)
            return out

    cfg = model.config
    ids = torch.randint(1, cfg.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(batch, seq_len, dtype=torch.bool)
    sdpa_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    model.eval().requires_grad_(False)  # FlopCounterMode's module tracker trips over params needing grad
    with (
        torch.no_grad(),
        FlopCounterMode(display=False, custom_mapping={sdpa_cpu: _sdpa_flops}) as flops,
        _OpCounter() as counter,
    ):
        model(ids, mask)
    by_op = flops.get_flop_counts().get("Global", {})
    attention = sum(int(v) for op, v in by_op.items() if getattr(op, "__name__", str(op)) in _ATTENTION_OPS)
    total = int(flops.get_total_flops())
    return {"flops": total, **counter.counts, "flops_matmul": total - attention, "flops_attention": attention}
