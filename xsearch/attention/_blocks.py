"""Helpers for block-sparse patterns: cutting sequences into blocks and windows of blocks.

The fused CPU attention kernel only runs on 4-D inputs with a mask that broadcasts over
heads, so blocked attention is laid out as ``(B*nb, H, block, Dh)`` with a mask of shape
``(B*nb, 1, block|1, W)``; a 5-D call falls back to the slow unfused path (about 4x slower).
"""

from __future__ import annotations

import torch

from xsearch.attention._base import exporting, pad_to_multiple, sdpa


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
    if exporting() and dropout_p == 0.0:
        # An exported graph multiplies the 5-D blocks as they are (MatMul broadcasts over the
        # leading axes), without the copies the 4-D layout of the fused kernel costs.
        return sdpa(qb, kw, vw, allowed[:, :, None])
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


MIN_BLOCK = 16  # smaller blocks cost more in per-block overhead than they save in masked keys


def gather_windows(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The key windows ``t[:, :, idx[s]]`` of every query block ``s``, gathered with one copy.

    Args:
        t: ``(B, H, L, Dh)``, best a transposed view of a ``(B, L, H, Dh)`` tensor (as
            ``split_heads`` returns), whose rows are then copied whole.
        idx: long ``(nb, W)``, positions in ``[0, L)``.

    Returns:
        ``(B, nb, H, W, Dh)``: a view of a contiguous ``(B, nb, W, H, Dh)`` tensor, which the
        fused kernel reads as it is (the head stride of ``split_heads`` outputs).
    """
    b, h, _, d = t.shape
    nb, w = idx.shape
    rows = t.transpose(1, 2).index_select(1, idx.reshape(-1))  # (B, nb*W, H, Dh)
    return rows.reshape(b, nb, w, h, d).transpose(2, 3)


def band_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    real: torch.Tensor,
    *,
    back: int,
    ahead: int,
    extra_k: torch.Tensor | None = None,
    extra_v: torch.Tensor | None = None,
    extra_real: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    min_block: int = MIN_BLOCK,
) -> torch.Tensor:
    """Banded softmax attention, optionally with extra keys every query sees, in O(N·(back+ahead)).

    Query ``i`` attends key ``j`` when ``i - back <= j <= i + ahead`` and ``real[j]``, plus
    every extra key ``e`` with ``extra_real[e]``; all of them are normalised together in one
    softmax. Every query may also attend its own position, so no row is fully masked (a
    padded query sees itself; a real query already does unless ``real`` excludes it, in which
    case the caller discards that row).

    Blocks of ``bs = max(ceil((back + ahead) / 2), min_block)`` queries attend ``ceil(back/bs)``
    previous and ``ceil(ahead/bs)`` next blocks (1 and 1 for a symmetric band, 2 and 0 for a
    causal one: 3 blocks, about ``1.5 (back + ahead)`` keys for ``back + ahead + 1`` used) and the extra
    keys, gathered into one window per block and run through the fused 4-D kernel by
    ``blocked_sdpa``. The band mask depends only on the slot within the block and the
    window, so it is built once as ``(bs, W)``.

    Args:
        q, k, v: ``(B, H, N, Dh)``.
        real: bool ``(B, N)``: keys that may be attended inside the band.
        back, ahead: band half-widths (``>= 0``), in positions.
        extra_k, extra_v: ``(B, H, E, Dh)`` keys/values appended to every query's window.
        extra_real: bool ``(B, E)``: which extra keys may be attended.
        dropout_p: attention dropout.
        min_block: smallest block length.

    Returns:
        ``(B, H, N, Dh)``.
    """
    b, h, n, d = q.shape
    dev = q.device
    bs = max(-(-(back + ahead) // 2), min_block)
    lb, la = -(-back // bs), -(-ahead // bs)
    qb = to_blocks(q, bs)  # (B, nb, H, bs, Dh)
    nb = qb.shape[1]
    offsets = torch.arange((lb + 1 + la) * bs, device=dev) - lb * bs  # (W,): key position - block start
    pos = torch.arange(nb, device=dev)[:, None] * bs + offsets[None, :]  # (nb, W)
    inside = (pos >= 0) & (pos < n)
    idx = torch.where(inside, pos, torch.zeros_like(pos))  # masked slots read position 0
    rel = torch.arange(bs, device=dev)[:, None] - offsets[None, :]  # (bs, W): i - j
    band = (rel <= back) & (rel >= -ahead)
    own = rel == 0
    if extra_k is not None and extra_v is not None and extra_real is not None:
        # The extra keys sit after the sequence: positions n .. n+E-1.
        e = extra_k.shape[2]
        idx = torch.cat([idx, (torch.arange(e, device=dev) + n)[None, :].expand(nb, e)], dim=1)  # (nb, W+E)
        inside = torch.cat([inside, inside.new_ones(nb, e)], dim=1)
        band = torch.cat([band, band.new_ones(bs, e)], dim=1)  # (bs, W+E)
        own = torch.cat([own, own.new_zeros(bs, e)], dim=1)
        k = torch.cat([k.transpose(1, 2), extra_k.transpose(1, 2)], dim=1).transpose(1, 2)  # (B, H, N+E, Dh)
        v = torch.cat([v.transpose(1, 2), extra_v.transpose(1, 2)], dim=1).transpose(1, 2)
        real = torch.cat([real, extra_real], dim=1)  # (B, N+E)
    realw = real.index_select(1, idx.reshape(-1)).reshape(b, nb, -1) & inside  # (B, nb, W')
    allowed = (realw[:, :, None, :] & band) | own  # (B, nb, bs, W')
    out = blocked_sdpa(qb, gather_windows(k, idx), gather_windows(v, idx), allowed, dropout_p)  # (B, nb, H, bs, Dh)
    return from_blocks(out, n)
