"""Blockwise local attention (survey: Blockwise Patterns; as in Blockwise Self-Attention and
the Image Transformer's 1-D local attention): the sequence is cut into blocks of
``block_size``; each query block attends its own block and the ``lookback`` blocks before it.
"""

from __future__ import annotations

import torch

from xsearch.attention._base import Attention, AttentionSpec, positive_int, sdpa
from xsearch.attention._blocks import (
    block_windows,
    blocked_sdpa,
    from_blocks,
    real_tokens,
    to_blocks,
    window_positions,
)
from xsearch.attention._decode import kv_ring, kv_ring_write, lengths_of, ring_positions
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

    Decoding state: a ring buffer of the last ``(lookback + 1) * block_size`` keys and values,
    ``key`` and ``value`` ``(B, H, R, Dh)``, constant in the context length.
    """

    state_names = ("key", "value")

    @property
    def ring_size(self) -> int:
        """Slots of the decoding ring: the widest window a query sees, itself included."""
        return (self.params["lookback"] + 1) * self.params["block_size"]

    def prefill(self, x, mask=None):
        mask = self.check_decoding(x, mask)
        q, k, v = self.project_qkv(x)
        y = self.finish(self.attend(q, k, v, mask), mask)
        length = lengths_of(x, mask)
        ring = self.ring_size
        state = kv_ring(k, v, length, ring)
        return y, {"length": length, **state}

    def step(self, x_t, state):
        length = self.check_step(x_t, state)
        bs, lb = self.params["block_size"], self.params["lookback"]
        q, k, v = self.project_qkv(x_t[:, None])  # (B, H, 1, Dh)
        key, value = kv_ring_write(state, k, v, length)  # (B, H, R, Dh)
        pos = ring_positions(length, key.shape[2])  # (B, R): the position each slot holds
        first = length - torch.remainder(length, bs) - lb * bs  # the window's first position
        seen = (pos >= first[:, None]) & (pos >= 0)
        out = sdpa(q, key, value, seen[:, None, None, :])  # (B, H, 1, Dh)
        return self.finish(out, None)[:, 0], {"length": length + 1, "key": key, "value": value}

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
