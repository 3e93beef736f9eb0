"""Helpers for block-sparse patterns: cutting sequences into blocks and windows of blocks.

The fused CPU attention kernel only runs on 4-D inputs with a mask that broadcasts over
heads, so blocked attention is laid out as ``(B*nb, H, block, Dh)`` with a mask of shape
``(B*nb, 1, block|1, W)``; a 5-D call falls back to the slow unfused path (about 4x slower).
"""

from __future__ import annotations

import torch

from xsearch.attention._base import pad_to_multiple


def to_blocks(t: torch.Tensor, block: int) -> torch.Tensor:
    """``(B, H, N, Dh)`` -> ``(B, nb, H, block, Dh)``, padding N up to a multiple of ``block``."""
    b, h, _, d = t.shape
    t = pad_to_multiple(t.transpose(1, 2), block, dim=1)  # (B, Np, H, Dh)
    nb = t.shape[1] // block
    return t.reshape(b, nb, block, h, d).transpose(2, 3)


def from_blocks(t: torch.Tensor, n: int) -> torch.Tensor:
    """``(B, nb, H, block, Dh)`` -> ``(B, H, N, Dh)``, dropping the internal padding."""
    b, nb, h, block, d = t.shape
    return t.transpose(2, 3).reshape(b, nb * block, h, d)[:, :n].transpose(1, 2)


def block_windows(blocks: torch.Tensor, lookback: int, lookahead: int = 0) -> torch.Tensor:
    """Concatenate each block with its ``lookback`` predecessors and ``lookahead`` successors.

    Args:
        blocks: ``(B, nb, ..., block, X)``; the block axis is dim 1, the in-block axis dim -2.

    Returns:
        ``(B, nb, ..., (lookback+1+lookahead)*block, X)``; slots outside the sequence are zero.
    """
    if lookback == 0 and lookahead == 0:
        return blocks
    nb = blocks.shape[1]
    zeros = blocks.new_zeros(blocks.shape[0], 1, *blocks.shape[2:])
    padded = torch.cat([zeros] * lookback + [blocks] + [zeros] * lookahead, dim=1)
    return torch.cat([padded[:, i : i + nb] for i in range(lookback + 1 + lookahead)], dim=-2)


def window_positions(nb: int, block: int, lookback: int, lookahead: int = 0, device=None) -> torch.Tensor:
    """Sequence position of every window slot, ``(nb, W)``; out-of-range slots fall outside [0, nb*block)."""
    starts = torch.arange(nb, device=device) * block
    offsets = torch.arange(-lookback * block, (1 + lookahead) * block, device=device)
    return starts[:, None] + offsets[None, :]


def real_tokens(mask: torch.Tensor | None, b: int, n: int, block: int, device) -> torch.Tensor:
    """Float ``(B, Np)``: 1 for real tokens, 0 for user padding and the internal padding to ``block``."""
    real = torch.ones(b, n, device=device) if mask is None else mask.float()
    return pad_to_multiple(real, block, dim=1)


def blocked_sdpa(qb, kw, vw, allowed, dropout_p: float = 0.0) -> torch.Tensor:
    """Attention of query blocks over key windows through the fused 4-D kernel.

    Args:
        qb: ``(B, nb, H, block, Dh)``; kw, vw: ``(B, nb, H, W, Dh)``;
        allowed: bool ``(B, nb, block|1, W)``, True = may attend.

    Returns:
        ``(B, nb, H, block, Dh)``.
    """
    b, nb, h, bs, d = qb.shape
    w = kw.shape[-2]
    out = torch.nn.functional.scaled_dot_product_attention(
        qb.reshape(b * nb, h, bs, d),
        kw.reshape(b * nb, h, w, d),
        vw.reshape(b * nb, h, w, d),
        attn_mask=allowed.reshape(b * nb, 1, allowed.shape[2], w),
        dropout_p=dropout_p,
    )
    return out.reshape(b, nb, h, bs, d)
