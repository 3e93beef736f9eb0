"""Sparse Transformer (Child et al.), the fixed factorized pattern: every query attends its own
block and a set of strided summary positions that carry information across blocks.
"""

from __future__ import annotations

import torch

from xsearch.attention._base import Attention, AttentionSpec, pad_to_multiple, positive_int
from xsearch.attention._blocks import blocked_sdpa, from_blocks, real_tokens, to_blocks
from xsearch.attention._registry import register


@register(
    AttentionSpec(
        name="sparse",
        paper="Generating Long Sequences with Sparse Transformers",
        family=("FP",),
        complexity="O(N·(b + N/s))",
        causal=True,
        params={"block_size": 128, "stride": 128},
        small_params={"block_size": 8, "stride": 4},
    )
)
class SparseAttention(Attention):
    """Fixed pattern: query i attends (1) every key of its block of ``block_size`` (earlier
    ones only in causal mode) and (2) the summary positions ``j ≡ stride-1 (mod stride)``
    outside its block (in causal mode: before its block). With ``stride == block_size`` this
    is the paper's fixed pattern with one summary cell per block; both heads of the
    factorisation are merged into one attention so each query normalises over the union.
    """

    def check_params(self, block_size, stride):
        positive_int("sparse", "block_size", block_size)
        positive_int("sparse", "stride", stride)

    def attend(self, q, k, v, mask):
        bs, st = self.params["block_size"], self.params["stride"]
        b, h, n, d = q.shape
        qb = to_blocks(q, bs)  # (B, nb, H, bs, Dh)
        nb = qb.shape[1]
        kp, vp = pad_to_multiple(k, bs, dim=2), pad_to_multiple(v, bs, dim=2)  # (B, H, Np, Dh)
        ks = kp[:, :, st - 1 :: st]  # (B, H, S, Dh): summary keys
        vs = vp[:, :, st - 1 :: st]
        s = ks.shape[2]
        kw = torch.cat([to_blocks(k, bs), ks[:, None].expand(b, nb, h, s, d)], dim=-2)  # (B, nb, H, bs+S, Dh)
        vw = torch.cat([to_blocks(v, bs), vs[:, None].expand(b, nb, h, s, d)], dim=-2)

        real = real_tokens(mask, b, n, bs, q.device)  # (B, Np)
        qpos = torch.arange(nb * bs, device=q.device).reshape(nb, bs)  # (nb, bs) == own-block key slots
        spos = torch.arange(s, device=q.device) * st + (st - 1)  # (S,)
        start = qpos[:, :1]  # (nb, 1)
        real_own = real.reshape(b, nb, 1, bs) > 0.5  # (B, nb, 1, bs)
        real_sum = (real[:, st - 1 :: st] > 0.5)[:, None, None, :]  # (B, 1, 1, S)
        if self.causal:
            own = real_own & (qpos[:, None, :] <= qpos[:, :, None])  # (B, nb, bs, bs)
            summ = real_sum & (spos[None, :] < start)[None, :, None, :]  # (B, nb, 1, S)
        else:
            own = real_own
            outside = (spos[None, :] < start) | (spos[None, :] >= start + bs)  # (nb, S)
            summ = real_sum & outside[None, :, None, :]
        if mask is not None:
            # A padded query may see itself, so its row is never fully masked (real rows unchanged).
            own = own | torch.eye(bs, dtype=torch.bool, device=q.device)
        rows = own.shape[2]  # bs when the pattern depends on the query, else 1
        allowed = torch.cat([own.expand(b, nb, rows, bs), summ.expand(b, nb, rows, s)], dim=-1)  # (B, nb, rows, bs+S)
        out = blocked_sdpa(qb, kw, vw, allowed, self.dropout_p if self.training else 0.0)
        return from_blocks(out, n)
