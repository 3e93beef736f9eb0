"""Sparse Sinkhorn Attention (Tay et al.): blocks attend themselves and a block "sorted" to them by a
learned soft permutation, normalised with Sinkhorn iterations.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from xsearch.attention._base import Attention, AttentionSpec, pad_to_multiple, positive_int, sdpa
from xsearch.attention._blocks import blocked_sdpa, from_blocks, real_tokens, to_blocks
from xsearch.attention._decode import append_at, lengths_of, slot_mask
from xsearch.attention._registry import register
from xsearch.errors import XSearchError


def sinkhorn(
    logits: torch.Tensor, allowed: torch.Tensor, n_iters: int, causal: bool, cols: list | None = None
) -> torch.Tensor:
    """Sinkhorn balancing in log space over the last two axes (rows: query blocks, columns: key blocks).

    Each of the ``n_iters`` steps normalises the rows, then the columns. Encoder: a column is normalised
    over all rows (a doubly-stochastic limit). Decoder: the column normalisation of row ``i`` only sums
    rows ``<= i`` (a cumulative log-sum-exp), so by induction row ``i`` never depends on later blocks;
    full column sums would leak later blocks into earlier rows.

    Args:
        logits: ``(..., nb, nb)`` block-to-block scores (already divided by the temperature).
        allowed: bool, broadcastable to ``logits``; rows without any allowed entry come out all-zero.
        cols: a list that, when given, receives each step's column log-sum-exp ``(..., nb, nb)`` (causal:
            row ``i`` sums rows ``<= i``), what a decoding step continues from (``sinkhorn_row``).

    Returns:
        ``(..., nb, nb)`` non-negative mixing weights, zero where not allowed.
    """
    neg = torch.finfo(logits.dtype).min / 2  # finite: an all-masked row normalises to a harmless 0
    logr = torch.where(allowed, logits, neg)
    for _ in range(n_iters):
        logr = torch.where(allowed, logr - torch.logsumexp(logr, dim=-1, keepdim=True), neg)
        col = torch.logcumsumexp(logr, dim=-2) if causal else torch.logsumexp(logr, dim=-2, keepdim=True)
        if cols is not None:
            cols.append(col)
        logr = torch.where(allowed, logr - col, neg)
    return torch.exp(logr) * allowed


def sinkhorn_row(
    logits: torch.Tensor, allowed: torch.Tensor, col_lse: torch.Tensor, n_iters: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The next row of causal ``sinkhorn``, from the rows before it summed up in ``col_lse``.

    Args:
        logits: ``(..., M)`` the new row's scores; allowed: bool, broadcastable to ``logits``;
            col_lse: ``(..., n_iters, M)`` each step's column log-sum-exp over the earlier rows (rows
            "before row 0" hold ``finfo.min / 2``, a masked entry).

    Returns:
        The row's mixing weights ``(..., M)`` and ``col_lse`` with the row included.
    """
    neg = torch.finfo(logits.dtype).min / 2
    logr = torch.where(allowed, logits, neg)
    cols = []
    for t in range(n_iters):
        logr = torch.where(allowed, logr - torch.logsumexp(logr, dim=-1, keepdim=True), neg)
        col = torch.logaddexp(col_lse[..., t, :], logr)  # logcumsumexp's next entry
        cols.append(col)
        logr = torch.where(allowed, logr - col, neg)
    return torch.exp(logr) * allowed, torch.stack(cols, dim=-2)


@register(
    AttentionSpec(
        name="sinkhorn",
        paper="Sparse Sinkhorn Attention",
        family=("LP",),
        complexity="O(N·b + N²/b)",
        causal=True,
        params={"block_size": 128, "n_iters": 5, "temperature": 0.75},
        small_params={"block_size": 8},
    )
)
class SinkhornAttention(Attention):
    """Sparse Sinkhorn attention: blocks of ``block_size``; each query block attends its own block and
    one "sorted" block, a soft permutation of the key/value blocks.

    SortNet (the paper's ``P(ψ(X))``): each block is summarised by the mean of its real input vectors
    and a linear layer ``sort_net`` (``d_model -> n_heads * max_blocks``, no bias: Sinkhorn cancels
    per-column constants) scores it against every block slot, per head; scores beyond the current
    number of blocks are sliced off (as Linformer slices its projections), so ``max_len`` is needed.
    The ``n_iters`` Sinkhorn steps at ``temperature`` (log space, a fixed count, no Gumbel noise so
    eval is deterministic) give the mixing matrix ``S`` and the sorted block ``i`` is ``Σ_j S_ij K_j``
    token by token (same for values). Padded tokens are left out of the mixture (each mixed token is
    the ``S``-weighted mean of the real tokens at that slot of the allowed blocks) and blocks without a
    real token take no part in the balancing, so padding never reaches a real output.

    Decoder: block ``i`` is summarised by the mean of all tokens BEFORE it (cumulative, exclusive), may
    only be matched with blocks ``j < i`` (block 0 has no sorted block), the balancing is causal (see
    ``sinkhorn``) and its own block is masked causally; nothing at or after a query's block start but
    the query's own prefix of its block reaches it.

    Decoding state: the KV cache ``key`` and ``value`` ``(B, H, N, Dh)``, growing by one slot a token
    (a step mixes its sorted block from every earlier block, with weights that change at each block);
    and, constant in N, the sum of the inputs seen ``x_sum`` ``(B, D)``, the current block's Sinkhorn row
    ``sort_row`` ``(B, H, M)`` and each Sinkhorn step's column log-sum-exp over the blocks so far
    ``col_lse`` ``(B, H, n_iters, M)`` (``M = ceil(max_len / block_size)``), from which the row of a new
    block follows (``sinkhorn_row``) when its first token arrives.
    """

    state_names = ("key", "value", "x_sum", "sort_row", "col_lse")

    def check_params(self, block_size, n_iters, temperature):
        positive_int("sinkhorn", "block_size", block_size)
        positive_int("sinkhorn", "n_iters", n_iters)
        if not temperature > 0.0:
            raise XSearchError(f"attention 'sinkhorn': parameter 'temperature' must be > 0, got {temperature!r}")
        if self.max_len is None:
            raise XSearchError("attention 'sinkhorn' needs max_len (its SortNet scores max_len / block_size blocks)")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_blocks = math.ceil(self.max_len / self.params["block_size"])
        self.sort_net = nn.Linear(self.d_model, self.n_heads * self.max_blocks, bias=False)

    def block_logits(self, x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """SortNet scores ``(B, H, nb, nb)`` from ``x: (B, N, D)`` and ``real: (B, Np)`` (float)."""
        b, _, dm = x.shape
        bs = self.params["block_size"]
        realb = real.reshape(b, -1, bs)  # (B, nb, bs)
        nb = realb.shape[1]
        xb = pad_to_multiple(x, bs, dim=1).reshape(b, nb, bs, dm)
        sums = (realb.to(x.dtype).unsqueeze(-2) @ xb).squeeze(-2)  # (B, nb, D): padding excluded
        counts = realb.sum(dim=-1)  # (B, nb)
        if self.causal:  # only blocks before: exclusive cumulative sums
            sums = torch.cumsum(sums, dim=1) - sums
            counts = torch.cumsum(counts, dim=1) - counts
        summary = sums / counts.clamp(min=1.0).unsqueeze(-1).to(x.dtype)
        scores = self.sort_net(summary).reshape(b, nb, self.n_heads, self.max_blocks)[..., :nb]
        return scores.permute(0, 2, 1, 3)  # (B, H, nb, nb)

    def forward(self, x, mask=None):
        return self._forward(x, self.check_input(x, mask))[0]

    def _forward(self, x, mask, cols: list | None = None):
        """forward on a checked mask; also returns ``(q, k, v)`` ``(B, H, N, Dh)`` and ``S`` ``(B, H, nb, nb)``;
        ``cols`` receives the Sinkhorn steps' column log-sum-exps (see ``sinkhorn``)."""
        b, n, _ = x.shape
        bs = self.params["block_size"]
        q, k, v = self.project_qkv(x)  # (B, H, N, Dh) each
        real = real_tokens(mask, b, n, bs, x.device)  # (B, Np) float
        qb, kb, vb = to_blocks(q, bs), to_blocks(k, bs), to_blocks(v, bs)  # (B, nb, H, bs, Dh)
        nb = qb.shape[1]
        realb = real.reshape(b, nb, bs).to(q.dtype)  # (B, nb, bs)

        block_real = realb.sum(-1) > 0  # (B, nb)
        allowed = block_real[:, None, :, None] & block_real[:, None, None, :]  # (B, 1, nb, nb)
        if self.causal:
            idx = torch.arange(nb, device=x.device)
            allowed = allowed & (idx[None, :] < idx[:, None])  # only earlier blocks
        logits = self.block_logits(x, real) / self.params["temperature"]
        s = sinkhorn(logits, allowed, self.params["n_iters"], self.causal, cols)  # (B, H, nb, nb)

        # Sorted blocks: per slot, the S-weighted mean of the real tokens of the allowed blocks.
        # Written as MatMuls (onnxruntime's Einsum is slow): keys and values of a block are one
        # row of bs*2Dh numbers, mixed across blocks by S in one product.
        h, dh = self.n_heads, self.head_dim
        w = realb[:, :, None, :, None]  # (B, nb, 1, bs, 1)
        den = (s @ realb[:, None]).transpose(1, 2).unsqueeze(-1)  # (B, nb, H, bs, 1)
        den = den.clamp(min=torch.finfo(q.dtype).tiny)
        kv_rows = (torch.cat([kb, vb], dim=-1) * w).transpose(1, 2).reshape(b, h, nb, bs * 2 * dh)
        mixed = (s @ kv_rows).view(b, h, nb, bs, 2 * dh).transpose(1, 2) / den  # (B, nb, H, bs, 2Dh)
        ks, vs = mixed[..., :dh], mixed[..., dh:]  # (B, nb, H, bs, Dh) each
        sorted_real = (allowed[:, 0].to(q.dtype) @ realb) > 0  # (B, nb, bs)

        own = realb[:, :, None, :] > 0.5  # (B, nb, 1, bs)
        eye = torch.eye(bs, dtype=torch.bool, device=x.device)
        if self.causal:
            own = own & torch.ones(bs, bs, dtype=torch.bool, device=x.device).tril()  # (B, nb, bs, bs)
        # A padded query may see itself, so no row is fully masked (real rows already do).
        own = own | eye
        rows = own.shape[2]
        attn_mask = torch.cat([own, sorted_real[:, :, None, :].expand(b, nb, rows, bs)], dim=-1)  # (B, nb, ., 2bs)
        kw = torch.cat([kb, ks], dim=-2)  # (B, nb, H, 2bs, Dh)
        vw = torch.cat([vb, vs], dim=-2)
        out = blocked_sdpa(qb, kw, vw, attn_mask, self.dropout_p if self.training else 0.0)
        return self.finish(from_blocks(out, n), mask), (q, k, v), s

    def prefill(self, x, mask=None):
        mask = self.check_decoding(x, mask)
        cols = []
        y, (_, k, v), s = self._forward(x, mask, cols)
        length = lengths_of(x, mask)
        if mask is not None:  # padded slots hold zeros, never read
            real = mask[:, None, :, None].to(k.dtype)
            k, v, x = k * real, v * real, x * mask[..., None].to(x.dtype)
        # The Sinkhorn row of the last token's block, and the column sums up to that block.
        b, h, nb, _ = s.shape
        last = torch.div((length - 1).clamp(min=0), self.params["block_size"], rounding_mode="floor")  # (B,)
        extra = self.max_blocks - nb  # the columns of blocks not reached yet: masked
        row = s.gather(2, last.view(b, 1, 1, 1).expand(b, h, 1, nb))[:, :, 0]  # (B, H, nb)
        row = torch.cat([row, row.new_zeros(b, h, extra)], dim=-1)  # (B, H, M)
        cols = torch.stack(cols, dim=2)  # (B, H, T, nb, nb)
        col = cols.gather(3, last.view(b, 1, 1, 1, 1).expand(b, h, cols.shape[2], 1, nb))[:, :, :, 0]  # (B, H, T, nb)
        col = torch.cat([col, col.new_full((b, h, cols.shape[2], extra), torch.finfo(col.dtype).min / 2)], dim=-1)
        state = {"key": k, "value": v, "x_sum": x.sum(dim=1), "sort_row": row, "col_lse": col}
        return y, {"length": length, **state}

    def step(self, x_t, state):
        length = self.check_step(x_t, state)
        bs = self.params["block_size"]
        b, h, dh, m = x_t.shape[0], self.n_heads, self.head_dim, self.max_blocks
        q, k, v = self.project_qkv(x_t[:, None])  # (B, H, 1, Dh)
        key = append_at(state["key"], k[:, :, 0], length, dim=2)  # (B, H, S, Dh), S = old width + 1
        value = append_at(state["value"], v[:, :, 0], length, dim=2)
        slot = torch.remainder(length, bs)  # the new token's place in its block
        block = torch.div(length, bs, rounding_mode="floor")

        # A new block's Sinkhorn row (SortNet on the mean of every earlier token, earlier blocks only),
        # kept for the block's later tokens: it depends on nothing at or after the block's start.
        summary = state["x_sum"] / length.clamp(min=1)[:, None].to(x_t.dtype)  # (B, D)
        logits = self.sort_net(summary).view(b, h, m) / self.params["temperature"]
        earlier = (torch.arange(m, device=x_t.device)[None, :] < block[:, None])[:, None]  # (B, 1, M)
        row, col = sinkhorn_row(logits, earlier, state["col_lse"], self.params["n_iters"])
        new = (slot == 0)[:, None, None]
        row = torch.where(new, row, state["sort_row"])  # (B, H, M)
        col = torch.where(new[..., None], col, state["col_lse"])  # (B, H, T, M)

        # The sorted block: per slot, the row-weighted mean of the earlier blocks' keys and values, summed
        # token by token into its slot (index_add: the cache's width is no multiple of the block).
        pos = torch.arange(key.shape[2], device=x_t.device)  # (S,)
        weights = row.index_select(2, torch.div(pos, bs, rounding_mode="floor").clamp(max=m - 1))  # (B, H, S)
        weights = weights * slot_mask(length + 1, key.shape[2])[:, None].to(k.dtype)  # unused slots: 0
        in_slot = torch.remainder(pos, bs)
        kv = torch.cat([key, value], dim=-1) * weights[..., None]  # (B, H, S, 2Dh)
        mixed = kv.new_zeros(b, h, bs, 2 * dh).index_add(2, in_slot, kv)  # (B, H, bs, 2Dh)
        den = weights.new_zeros(b, h, bs).index_add(2, in_slot, weights)  # (B, H, bs)
        mixed = mixed / den.clamp(min=torch.finfo(k.dtype).tiny)[..., None]

        # The own block up to the new token, gathered from the cache (slots past it are masked).
        first = length - slot
        own = (first[:, None] + torch.arange(bs, device=x_t.device)[None, :]).clamp(max=key.shape[2] - 1)  # (B, bs)
        idx = own[:, None, :, None].expand(b, h, bs, dh)
        kw = torch.cat([key.gather(2, idx), mixed[..., :dh]], dim=2)  # (B, H, 2bs, Dh)
        vw = torch.cat([value.gather(2, idx), mixed[..., dh:]], dim=2)
        in_block = torch.arange(bs, device=x_t.device)[None, :] <= slot[:, None]  # (B, bs)
        has_sorted = (block > 0)[:, None].expand(b, bs)  # block 0 has no sorted block
        allowed = torch.cat([in_block, has_sorted], dim=1)[:, None, None, :]  # (B, 1, 1, 2bs)
        out = sdpa(q, kw, vw, allowed)  # (B, H, 1, Dh)
        state = {"key": key, "value": value, "x_sum": state["x_sum"] + x_t, "sort_row": row, "col_lse": col}
        return self.finish(out, None)[:, 0], {"length": length + 1, **state}

    def prune_head_params(self, keep, rows):
        w = self.sort_net.weight.detach().view(self.n_heads, self.max_blocks, -1)[keep]
        self.sort_net = nn.Linear(w.shape[-1], len(keep) * self.max_blocks, bias=False)
        with torch.no_grad():
            self.sort_net.weight.copy_(w.reshape(-1, w.shape[-1]))
