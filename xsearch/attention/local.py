"""Blockwise local attention (survey: Blockwise Patterns; as in Blockwise Self-Attention and
the Image Transformer's 1-D local attention): the sequence is cut into blocks of
``block_size``; each query block attends its own block and the ``lookback`` blocks before it.
"""

from __future__ import annotations

from xsearch.attention._base import Attention, AttentionSpec, positive_int
from xsearch.attention._blocks import (
    block_windows,
    blocked_sdpa,
    from_blocks,
    real_tokens,
    to_blocks,
    window_positions,
)
from xsearch.attention._registry import register
from xsearch.errors import XSearchError


@register(
    AttentionSpec(
        name="local",
        paper="Blockwise Self-Attention for Long Document Understanding",
        family=("FP",),
        complexity="O(N·b)",
        causal=True,
        params={"block_size": 128, "lookback": 1},
        small_params={"block_size": 8},
    )
)
class LocalAttention(Attention):
    """Each block of ``block_size`` queries attends its own block and ``lookback`` previous blocks.

    In causal mode keys after the query inside its own block are masked too. The sequence
    is padded to a whole number of blocks inside; that padding is masked.
    """

    def check_params(self, block_size, lookback):
        positive_int("local", "block_size", block_size)
        if lookback < 0:
            raise XSearchError(f"attention 'local': parameter 'lookback' must be >= 0, got {lookback}")

    def attend(self, q, k, v, mask):
        bs, lb = self.params["block_size"], self.params["lookback"]
        b, _, n, _ = q.shape
        qb = to_blocks(q, bs)  # (B, nb, H, bs, Dh)
        kw = block_windows(to_blocks(k, bs), lb)  # (B, nb, H, W, Dh)
        vw = block_windows(to_blocks(v, bs), lb)
        nb = qb.shape[1]
        kpos = window_positions(nb, bs, lb, device=q.device)  # (nb, W)
        qpos = kpos[:, lb * bs :]  # (nb, bs): the own-block slots
        real = block_windows(real_tokens(mask, b, n, bs, q.device).reshape(b, nb, bs, 1), lb)
        allowed = real[..., 0].unsqueeze(2) > 0.5  # (B, nb, 1, W)
        if self.causal:
            allowed = allowed & (kpos[:, None, :] <= qpos[:, :, None])  # (B, nb, bs, W)
        if mask is not None:
            # A padded query may see itself, so its row is never fully masked; real queries
            # already see their own (real) key, so their outputs do not change.
            allowed = allowed | (kpos[:, None, :] == qpos[:, :, None])
        out = blocked_sdpa(qb, kw, vw, allowed, self.dropout_p if self.training else 0.0)
        return from_blocks(out, n)
