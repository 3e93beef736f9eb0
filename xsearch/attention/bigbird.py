"""BigBird (Zaheer et al.), the block-sparse ITC pattern: every query block attends a window of
3 blocks, the global blocks and a few random blocks; the global blocks attend everything.
"""

from __future__ import annotations

import math

import torch

from xsearch.attention._base import Attention, AttentionSpec, positive_int, sdpa
from xsearch.attention._blocks import blocked_sdpa, from_blocks, gather_windows, to_blocks
from xsearch.attention._registry import register
from xsearch.errors import XSearchError


def draw_random_blocks(nb: int, n_global: int, r: int) -> torch.Tensor:
    """``(nb, r)`` long: for query block ``i``, ``r`` distinct key blocks outside the global blocks
    and outside ``{i-1, i, i+1}``, drawn without replacement from torch's global generator.

    Where fewer than ``r`` candidates exist (and for the global blocks, which need none) the
    slot holds ``nb``, an index that is always out of range and therefore masked.
    """
    out = torch.full((nb, r), nb, dtype=torch.long)
    for i in range(n_global, nb):
        cand = torch.tensor([j for j in range(n_global, nb) if abs(j - i) > 1], dtype=torch.long)
        take = min(r, len(cand))
        out[i, :take] = cand[torch.randperm(len(cand))[:take]]
    return out


@register(
    AttentionSpec(
        name="bigbird",
        paper="Big Bird: Transformers for Longer Sequences",
        family=("FP", "M"),
        complexity="O(N·b·(g + 3 + r))",
        causal=False,
        params={"block_size": 64, "n_global_blocks": 2, "n_random_blocks": 3},
        small_params={"block_size": 4, "n_global_blocks": 1, "n_random_blocks": 2},
    )
)
class BigBirdAttention(Attention):
    """Block-sparse attention with blocks of ``block_size`` tokens (BigBird-ITC).

    A query block ``i`` attends (1) the window of blocks ``i-1, i, i+1``, (2) the first
    ``n_global_blocks`` blocks (global tokens drawn from the sequence, as in ITC) and (3)
    ``n_random_blocks`` random blocks; all of it in one softmax. The global blocks attend
    every token. Window blocks that are global are read only through the global columns and
    the random blocks avoid the window and the global blocks, so no key counts twice. The
    reference implementation makes the first and the last block global; here the first
    ``n_global_blocks`` are, so the pattern of a sequence does not depend on its padded length.

    The random blocks are drawn once at construction from torch's global generator for the
    ``ceil(max_len / block_size)`` blocks of the longest sequence and kept in the buffer
    ``random_blocks`` (saved with the weights), the same in training and eval, like the
    reference implementation, which seeds its draw per layer. A shorter
    sequence uses the rows of its blocks and masks the random blocks beyond its end, so a
    sequence's pattern never depends on how much padding follows it.
    """

    def check_params(self, block_size, n_global_blocks, n_random_blocks):
        positive_int("bigbird", "block_size", block_size)
        for key, value in (("n_global_blocks", n_global_blocks), ("n_random_blocks", n_random_blocks)):
            if value < 0:
                raise XSearchError(f"attention 'bigbird': parameter {key!r} must be >= 0, got {value}")
        if self.max_len is None:
            raise XSearchError("attention 'bigbird' needs max_len (its random blocks are drawn for max_len)")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        nb_max = math.ceil(self.max_len / self.params["block_size"])
        blocks = draw_random_blocks(nb_max, self.params["n_global_blocks"], self.params["n_random_blocks"])
        self.register_buffer("random_blocks", blocks)  # (nb_max, r)

    def attend(self, q, k, v, mask):
        bs, r, gb = self.params["block_size"], self.params["n_random_blocks"], self.params["n_global_blocks"]
        gt = gb * bs  # global tokens
        b, h, n, d = q.shape
        dev = q.device
        p = self.dropout_p if self.training else 0.0
        real = torch.ones(b, n, dtype=torch.bool, device=dev) if mask is None else mask  # (B, N)
        qb = to_blocks(q, bs)  # (B, nb, H, bs, Dh)
        nb = qb.shape[1]

        # The key blocks of every query block s: the window s-1, s, s+1, then the random blocks
        # (this length's rows of the buffer), then the global blocks.
        s = torch.arange(nb, device=dev)[:, None]  # (nb, 1)
        blocks = [s - 1, s, s + 1]
        if r:
            blocks.append(self.random_blocks.index_select(0, s[:, 0]))  # (nb, r); masked slots hold >= nb
        if gb:
            blocks.append(torch.arange(gb, device=dev)[None, :].expand(nb, gb))
        blk = torch.cat(blocks, dim=1)  # (nb, M)
        pos = (blk[:, :, None] * bs + torch.arange(bs, device=dev)).reshape(nb, -1)  # (nb, W): key positions
        inside = (pos >= 0) & (pos < n)
        idx = torch.where(inside, pos, torch.zeros_like(pos))  # masked slots read position 0
        slot = torch.arange(pos.shape[1], device=dev)  # (W,)
        # Global positions in the window are read through the global columns only, so none counts twice.
        ok = inside & ((slot >= 3 * bs) | (pos >= gt))  # (nb, W)
        ok = real.index_select(1, idx.reshape(-1)).reshape(b, nb, -1) & ok  # (B, nb, W)
        # No row may be fully masked. A block with a real non-global query allows that query's
        # own key; a block without one (all padding, or a global block, whose rows are replaced
        # below) has its outputs discarded, so it may read its whole own block.
        own = (slot >= bs) & (slot < 2 * bs)  # (W,)
        ok = ok | (own & inside & ~(ok & own).any(dim=-1, keepdim=True))
        allowed = ok[:, :, None, :]  # (B, nb, 1, W): one key set per block
        out = blocked_sdpa(qb, gather_windows(k, idx), gather_windows(v, idx), allowed, p)  # (B, nb, H, bs, Dh)
        out = from_blocks(out, n)  # (B, H, N, Dh)
        if not gb:
            return out

        # Global rows: full attention over the real keys (a padded global query sees itself).
        pos = torch.arange(n, device=dev)
        allowed_g = real[:, None, None, :] | (pos[None, :] == pos[:gt, None])[None, None]  # (B, 1, G, N)
        glob = sdpa(q[:, :, :gt], k, v, allowed_g, dropout_p=p)  # (B, H, G, Dh)
        return torch.cat([glob, out[:, :, gt:]], dim=2)

    def attention_pattern(self, n: int) -> torch.Tensor:
        """Bool ``(n, n)``: whether query ``i`` may attend key ``j`` (before padding), built densely
        from the definition. For tests and inspection only; the forward pass never builds it.
        """
        bs, gb = self.params["block_size"], self.params["n_global_blocks"]
        nb = math.ceil(n / bs)
        blk = torch.arange(n) // bs
        qi, kj = blk[:, None], blk[None, :]
        pat = ((qi - kj).abs() <= 1) | (qi < gb) | (kj < gb)
        rand = torch.zeros(nb, nb + 1, dtype=torch.bool)  # column nb collects the masked slots
        rand.scatter_(1, self.random_blocks[:nb].clamp(max=nb).cpu(), True)
        return pat | rand[:, :nb][qi, kj]
