"""Sparse Sinkhorn Attention (Tay et al.): blocks attend themselves and a block "sorted" to them by a
learned soft permutation, normalised with Sinkhorn iterations.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from xsearch.attention._base import Attention, AttentionSpec, pad_to_multiple, positive_int
from xsearch.attention._blocks import blocked_sdpa, from_blocks, real_tokens, to_blocks
from xsearch.attention._registry import register
from xsearch.errors import XSearchError


def sinkhorn(logits: torch.Tensor, allowed: torch.Tensor, n_iters: int, causal: bool) -> torch.Tensor:
    """Sinkhorn balancing in log space over the last two axes (rows: query blocks, columns: key blocks).

    Each of the ``n_iters`` steps normalises the rows, then the columns. Encoder: a column is normalised
    over all rows (a doubly-stochastic limit). Decoder: the column normalisation of row ``i`` only sums
    rows ``<= i`` (a cumulative log-sum-exp), so by induction row ``i`` never depends on later blocks;
    full column sums would leak later blocks into earlier rows.

    Args:
        logits: ``(..., nb, nb)`` block-to-block scores (already divided by the temperature).
        allowed: bool, broadcastable to ``logits``; rows without any allowed entry come out all-zero.

    Returns:
        ``(..., nb, nb)`` non-negative mixing weights, zero where not allowed.
    """
    neg = torch.finfo(logits.dtype).min / 2  # finite: an all-masked row normalises to a harmless 0
    logr = torch.where(allowed, logits, neg)
    for _ in range(n_iters):
        logr = torch.where(allowed, logr - torch.logsumexp(logr, dim=-1, keepdim=True), neg)
        col = torch.logcumsumexp(logr, dim=-2) if causal else torch.logsumexp(logr, dim=-2, keepdim=True)
        logr = torch.where(allowed, logr - col, neg)
    return torch.exp(logr) * allowed


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
    """

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
        mask = self.check_input(x, mask)
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
        s = sinkhorn(logits, allowed, self.params["n_iters"], self.causal)  # (B, H, nb, nb)

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
        return self.finish(from_blocks(out, n), mask)

    def prune_head_params(self, keep, rows):
        w = self.sort_net.weight.detach().view(self.n_heads, self.max_blocks, -1)[keep]
        self.sort_net = nn.Linear(w.shape[-1], len(keep) * self.max_blocks, bias=False)
        with torch.no_grad():
            self.sort_net.weight.copy_(w.reshape(-1, w.shape[-1]))
