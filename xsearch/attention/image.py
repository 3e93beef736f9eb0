"""Image Transformer (Parmar et al.), local 2-D attention: the sequence is laid out as a grid
in raster order and each rectangular query block attends a memory block around it.
"""

from __future__ import annotations

import torch

from xsearch.attention._base import Attention, AttentionSpec, positive_int, sdpa
from xsearch.attention._blocks import real_tokens
from xsearch.attention._decode import kv_ring, kv_ring_write, lengths_of
from xsearch.attention._registry import register
from xsearch.errors import XSearchError


@register(
    AttentionSpec(
        name="image",
        paper="Image Transformer",
        family=("FP",),
        complexity="O(N·(bh+2m)(bw+2m))",
        causal=True,
        params={"width": 64, "block_h": 8, "block_w": 16, "memory": 8},
        small_params={"width": 8, "block_h": 2, "block_w": 4, "memory": 1},
    )
)
class ImageAttention(Attention):
    """Local 2-D attention on a grid of ``width`` columns filled in raster order.

    The grid is cut into query blocks of ``block_h`` x ``block_w``; each attends its memory
    block: the query block extended by ``memory`` rows/columns on every side (encoder) or, as
    in the paper's decoder, ``memory`` rows above and ``memory`` columns left and right only,
    with keys after the query in raster order masked (including later positions of its own
    block). The grid is padded inside (to whole rows, to whole blocks and by the memory
    flange); that padding is masked, and every query may see itself so no row is fully
    masked. Queries of a block share one key window, so attention runs as one fused 4-D call;
    query and memory blocks are gathered from the projections by sequence position.

    The paper generates an image block by block (blocks in raster order, raster order inside
    a block); here the token order is the image raster order, so the decoder mask follows it:
    of the memory block, a query sees the rows above its own in full, its own row up to
    itself, and nothing of the rows below it (left flange included).

    Decoding state: a ring buffer of the last ``(block_h + memory - 1) · width + min(block_w + memory,
    width)`` keys and values, ``key`` and ``value`` ``(B, H, R, Dh)``: the farthest back a query's
    memory block reaches (its top-left cell), constant in the context length. A step gathers the
    new query's memory block, ``(block_h + memory) x (block_w + 2·memory)`` cells, from the ring
    and attends those.
    """

    state_names = ("key", "value")

    @property
    def ring_size(self) -> int:
        """Slots of the decoding ring: from a query back to the top-left cell of its memory block."""
        width, bh, bw, m = (self.params[k] for k in ("width", "block_h", "block_w", "memory"))
        return (bh + m - 1) * width + min(bw + m, width)

    def prefill(self, x, mask=None):
        mask = self.check_decoding(x, mask)
        length = lengths_of(x, mask)
        k = self.split_heads(self.k_proj(x))  # (B, H, N, Dh)
        v = self.split_heads(self.v_proj(x))
        ring = self.ring_size
        state = kv_ring(k, v, length, ring)
        return self.forward(x, mask), {"length": length, **state}

    def step(self, x_t, state):
        length = self.check_step(x_t, state)  # the new token's position t, per row
        width, bh, bw, m = (self.params[k] for k in ("width", "block_h", "block_w", "memory"))
        dev = x_t.device
        q, k, v = self.project_qkv(x_t[:, None])  # (B, H, 1, Dh)
        key, value = kv_ring_write(state, k, v, length)  # (B, H, R, Dh)
        # The query's cell and its block's top-left cell (r0, c0); its memory block's cells.
        col = torch.remainder(length, width)
        row = torch.div(length - col, width, rounding_mode="floor")
        r0, c0 = row - torch.remainder(row, bh), col - torch.remainder(col, bw)  # (B,)
        krow = r0[:, None, None] + torch.arange(-m, bh, device=dev)[None, :, None]  # (B, bh + m, 1)
        kcol = c0[:, None, None] + torch.arange(-m, bw + m, device=dev)[None, None, :]  # (B, 1, bw + 2m)
        pos = (krow * width + kcol).flatten(1)  # (B, K)
        # In the grid and not after the query in raster order (the rows below are outside the block).
        seen = ((kcol >= 0) & (kcol < width) & (krow >= 0)).flatten(1) & (pos <= length[:, None])
        slot = torch.remainder(pos.clamp(min=0), key.shape[2])  # (B, K): where the ring holds each cell
        idx = slot[:, None, :, None].expand(-1, self.n_heads, -1, self.head_dim)
        kb, vb = torch.gather(key, 2, idx), torch.gather(value, 2, idx)  # (B, H, K, Dh)
        out = sdpa(q, kb, vb, seen[:, None, None, :])  # (B, H, 1, Dh)
        return self.finish(out, None)[:, 0], {"length": length + 1, "key": key, "value": value}

    def check_params(self, width: int, block_h: int, block_w: int, memory: int) -> None:
        positive_int("image", "width", width)
        positive_int("image", "block_h", block_h)
        positive_int("image", "block_w", block_w)
        if memory < 0:
            raise XSearchError(f"attention 'image': parameter 'memory' must be >= 0, got {memory}")

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = self.check_input(x, mask)
        width, bh, bw, m = (self.params[k] for k in ("width", "block_h", "block_w", "memory"))
        top, bottom = m, (0 if self.causal else m)
        b, n, _ = x.shape
        h, d = self.n_heads, self.head_dim
        dev = x.device
        # Grid: R rows of `width`, padded to whole blocks (Rp x Wp). Everything is gathered
        # straight from the (B, N, H*Dh) projections by sequence position (one copy each).
        rows = (n + width - 1) // width
        nbh, nbw = (rows + bh - 1) // bh, (width + bw - 1) // bw
        wp = nbw * bw
        nb, qn, kn = nbh * nbw, bh * bw, (bh + top + bottom) * (bw + 2 * m)

        def cells(row: torch.Tensor, col: torch.Tensor):
            """Sequence position (0 where outside it), validity, and grid-cell id (raster order
            of the padded grid, -1 outside it) of grid cells."""
            inside = (row >= 0) & (row < nbh * bh) & (col >= 0) & (col < wp)
            pos = row * width + col
            valid = (col < width) & (pos < n) & inside
            return torch.where(valid, pos, 0), valid, torch.where(inside, row * wp + col, -1)

        # Query blocks (nbh, nbw, bh, bw) and memory blocks (nbh, nbw, Wh, Ww), flattened per block.
        r0 = torch.arange(nbh, device=dev)[:, None, None, None] * bh
        c0 = torch.arange(nbw, device=dev)[None, :, None, None] * bw
        qrow = r0 + torch.arange(bh, device=dev)[:, None]
        qcol = c0 + torch.arange(bw, device=dev)
        q_pos, _, q_id = cells(qrow.expand(nbh, nbw, bh, bw), qcol.expand(nbh, nbw, bh, bw))
        krow = r0 + torch.arange(-top, bh + bottom, device=dev)[:, None]
        kcol = c0 + torch.arange(-m, bw + m, device=dev)
        shape = (nbh, nbw, bh + top + bottom, bw + 2 * m)
        k_pos, k_valid, k_id = cells(krow.expand(shape), kcol.expand(shape))
        q_pos, q_id = q_pos.reshape(nb, qn), q_id.reshape(nb, qn)
        k_pos, k_valid, k_id = k_pos.reshape(nb, kn), k_valid.reshape(nb, kn), k_id.reshape(nb, kn)

        real = real_tokens(mask, b, n, 1, dev) > 0.5  # (B, N)
        allowed = (real.index_select(1, k_pos.reshape(-1)).view(b, nb, kn) & k_valid)[:, :, None, :]  # (B, nb, 1, K)
        if self.causal:
            allowed = allowed & (k_id[:, None, :] <= q_id[:, :, None])  # (B, nb, Q, K)
        # A padded query may see itself, so no row is fully masked (real rows unchanged).
        allowed = allowed | (k_id[:, None, :] == q_id[:, :, None])

        def gather(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:  # (B, N, H*Dh) -> (B*nb, H, X, Dh)
            # index_select of flat positions: one Gather when exported (advanced indexing with a
            # 2-D index adds transposes around a GatherND).
            return t.index_select(1, idx.reshape(-1)).reshape(b * nb, idx.shape[1], h, d).transpose(1, 2)

        out = sdpa(
            gather(self.q_proj(x), q_pos),
            gather(self.k_proj(x), k_pos),
            gather(self.v_proj(x), k_pos),
            allowed.reshape(b * nb, 1, -1, kn),
            dropout_p=self.dropout_p if self.training else 0.0,
        )  # (B*nb, H, Q, Dh)
        # Back to sequence order: position p sits in block (r // bh, c // bw) at (r % bh, c % bw).
        p = torch.arange(n, device=dev)
        r, c = p // width, p % width
        slot = ((r // bh) * nbw + c // bw) * qn + (r % bh) * bw + c % bw  # (N,)
        out = out.transpose(1, 2).reshape(b, nb * qn, h, d).index_select(1, slot)  # (B, N, H, Dh)
        return self.finish(out.transpose(1, 2), mask)
