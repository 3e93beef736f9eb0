"""Routing Transformer (Roy et al.): content-based sparse attention routed by online k-means."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from xsearch.attention._base import Attention, AttentionSpec, pad_to_multiple, positive_int, sdpa
from xsearch.attention._blocks import real_tokens
from xsearch.attention._decode import append_at, lengths_of
from xsearch.attention._registry import register
from xsearch.attention.reformer import sorted_chunk_attention, sorted_chunk_step
from xsearch.errors import XSearchError


@register(
    AttentionSpec(
        name="routing",
        paper="Efficient Content-Based Sparse Attention with Routing Transformers",
        family=("LP",),
        complexity="O(N·(k + N/k))",
        causal=True,
        params={"n_clusters": 64, "decay": 0.99},
        small_params={"n_clusters": 4},
    )
)
class RoutingAttention(Attention):
    """Routing attention: queries and keys are routed to ``n_clusters`` k-means centroids and attend
    within their cluster.

    Centroids: one set per head, ``(H, n_clusters, Dh)`` unit vectors in a buffer (no gradient),
    drawn from torch's global generator at construction and, in training only, moved by an
    exponential moving average (``decay``) towards the normalised mean of the real queries and keys
    assigned to them (argmax similarity), then renormalised: spherical online k-means as in the paper
    (Algorithm 1) and its reference implementation. Eval never changes them. Routing compares
    unit-normalised vectors (the paper's scale-free LayerNorm plays this part); the attention scores use
    the raw projections, so one cluster holding every token is exactly full attention.

    Encoder (the paper's balanced routing): with ``w = ceil(N / n_clusters)``, every cluster takes the
    ``w`` queries and, separately, the ``w`` keys most similar to its centroid (top-k over the real tokens;
    padding ranks last and is masked as a key); each cluster's queries attend its keys through the fused
    kernel. A query chosen by several clusters gets the mean of its outputs, one chosen by none gets 0
    (as in the paper, where routing heads are mixed with local heads).

    Decoder: top-k over the whole sequence would let later tokens push earlier ones out of a cluster,
    so each token goes to its own nearest centroid (a function of that token alone) and attends the
    ``w = ceil(max_len / n_clusters)`` most recent earlier tokens of its cluster (sorted by cluster and
    position, chunked, see ``sorted_chunk_attention``). A query and a key must share one assignment
    for this, so the decoder uses the paper's shared-QK option: ``k_proj`` is tied to ``q_proj``
    (same parameters), keys are the unit-normalised queries and a token attends itself only when its
    cluster holds no earlier token.

    Decoding state: ``key`` (the unit-normalised shared QK vectors) and ``value`` ``(B, H, N, Dh)``, and
    each key's nearest centroid ``cluster`` long ``(B, H, N)``, growing by one slot a token; a step attends
    the new query over the cached keys of its cluster (``sorted_chunk_step``).
    """

    state_names = ("key", "value", "cluster")

    def check_params(self, n_clusters, decay):
        positive_int("routing", "n_clusters", n_clusters)
        if not 0.0 <= decay < 1.0:
            raise XSearchError(f"attention 'routing': parameter 'decay' must be in [0, 1), got {decay!r}")
        if self.causal and self.max_len is None:
            raise XSearchError("attention 'routing' needs max_len when causal (its window is max_len / n_clusters)")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        k = self.params["n_clusters"]
        if self.causal:
            # Shared QK: k_proj IS q_proj (tied parameters).
            self.k_proj.weight = self.q_proj.weight
            self.k_proj.bias = self.q_proj.bias
            self.window = math.ceil(self.max_len / k)
        self.register_buffer("centroids", F.normalize(torch.randn(self.n_heads, k, self.head_dim), dim=-1))

    @torch.no_grad()
    def update_centroids(self, xs: list[torch.Tensor], assign: list[torch.Tensor], real: torch.Tensor) -> None:
        """One online k-means step: EMA of each centroid towards the mean of its assigned real vectors.

        Args:
            xs: unit vectors ``(B, H, Np, Dh)``; assign: their clusters ``(B, H, Np)``; real: ``(B, Np)`` bool.
        """
        mu = self.centroids.float()
        k = mu.shape[1]
        sums = torch.zeros_like(mu)
        counts = mu.new_zeros(mu.shape[:2])
        for x, a in zip(xs, assign):
            x = x.float()
            onehot = F.one_hot(a, k).float() * real[:, None, :, None].float()  # (B, H, Np, k)
            sums += torch.einsum("bhnc,bhnd->hcd", onehot, x)
            counts += onehot.sum(dim=(0, 2))
        decay = self.params["decay"]
        moved = F.normalize(decay * mu + (1.0 - decay) * F.normalize(sums, dim=-1), dim=-1)
        self.centroids.copy_(torch.where(counts[..., None] > 0, moved, mu))

    def _similarity(self, xn: torch.Tensor) -> torch.Tensor:
        # In float32 even for low-precision models: rounding would flip near-tied assignments.
        return xn.float() @ self.centroids.float().transpose(1, 2)  # (B, H, Np, k); a MatMul when exported

    def forward(self, x, mask=None):
        mask = self.check_input(x, mask)
        if self.causal:
            return self._causal(x, mask)[0]
        b, n, _ = x.shape
        q = self.split_heads(self.q_proj(x))  # (B, H, N, Dh)
        v = self.split_heads(self.v_proj(x))
        p = self.dropout_p if self.training else 0.0
        kc = self.params["n_clusters"]
        k = self.split_heads(self.k_proj(x))
        qp, kp, vp = (pad_to_multiple(t, kc, dim=2) for t in (q, k, v))  # (B, H, Np, Dh)
        real = real_tokens(mask, b, n, kc, x.device) > 0.5  # (B, Np)
        h, np_, d = self.n_heads, qp.shape[2], self.head_dim
        w = np_ // kc  # tokens per cluster
        with torch.no_grad():
            qn, kn = F.normalize(qp, dim=-1), F.normalize(kp, dim=-1)
            sim_q, sim_k = self._similarity(qn), self._similarity(kn)  # (B, H, Np, k)
            if self.training:
                self.update_centroids([qn, kn], [sim_q.argmax(-1), sim_k.argmax(-1)], real)
            pad = ~real[:, None, :, None]
            sim_q = sim_q.masked_fill(pad, float("-inf")).transpose(2, 3)  # (B, H, k, Np); padding ranks last
            sim_k = sim_k.masked_fill(pad, float("-inf")).transpose(2, 3)
            q_idx = sim_q.topk(w, dim=-1).indices.reshape(b, h, kc * w)  # each cluster's w queries
            k_idx = sim_k.topk(w, dim=-1).indices.reshape(b, h, kc * w)  # and w keys

        # Flat row indices into (B*H*Np, Dh): gathers and the scatter-add run on rows (a Gather and
        # one scatter when exported) instead of on index tensors expanded over Dh.
        base = (torch.arange(b * h, device=x.device) * np_).view(b, h, 1)
        q_rows, k_rows = (q_idx + base).reshape(-1), (k_idx + base).reshape(-1)  # (B*H*k*w,)

        def pick(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:  # -> (B*H*k, 1, w, Dh)
            return t.reshape(b * h * np_, d).index_select(0, rows).reshape(b * h * kc, 1, w, d)

        key_real = real[:, None, :].expand(b, h, np_).reshape(-1).index_select(0, k_rows).reshape(b * h * kc, 1, 1, w)
        # A cluster without any real key only serves padded queries (no real token in the row): let
        # them see every key so no softmax row is fully masked.
        allowed = key_real | ~key_real.any(dim=-1, keepdim=True)
        out = sdpa(pick(qp, q_rows), pick(kp, k_rows), pick(vp, k_rows), allowed, dropout_p=p)  # (B*H*k, 1, w, Dh)
        total = qp.new_zeros(b * h * np_, d).index_add(0, q_rows, out.reshape(-1, d)).view(b, h, np_, d)
        hits = qp.new_zeros(b * h * np_).index_add(0, q_rows, torch.ones_like(q_rows, dtype=qp.dtype)).view(b, h, np_)
        out = total / hits.clamp(min=1.0).unsqueeze(-1)  # mean over the clusters that chose the query
        return self.finish(out[:, :, :n], mask)

    def _causal(self, x, mask):
        """The decoder's forward on a checked mask; also returns the keys, values ``(B, H, Np, Dh)`` and
        clusters ``(B, H, Np)``."""
        b, n, _ = x.shape
        q = self.split_heads(self.q_proj(x))  # (B, H, N, Dh)
        v = self.split_heads(self.v_proj(x))
        p = self.dropout_p if self.training else 0.0
        kc, w = self.params["n_clusters"], self.window
        qp, vp = pad_to_multiple(q, w, dim=2), pad_to_multiple(v, w, dim=2)  # (B, H, Np, Dh)
        real = real_tokens(mask, b, n, w, x.device) > 0.5  # (B, Np)
        qn = F.normalize(qp, dim=-1)  # shared QK: the keys
        with torch.no_grad():
            assign = self._similarity(qn).argmax(dim=-1)  # (B, H, Np): nearest centroid
            if self.training:
                self.update_centroids([qn], [assign], real)
            buckets = torch.where(real[:, None, :], assign, kc).unsqueeze(2)  # padding: cluster kc
        out = sorted_chunk_attention(qp, qn, vp, buckets, real, w, kc + 1, causal=True, scale=self.scale, dropout_p=p)
        return self.finish(out[:, :, :n], mask), qn, vp, assign

    def prefill(self, x, mask=None):
        mask = self.check_decoding(x, mask)
        n = x.shape[1]
        y, keys, v, cluster = self._causal(x, mask)
        keys, v = keys[:, :, :n], v[:, :, :n]  # (B, H, N, Dh)
        if mask is not None:  # padded slots hold zeros, never read
            real = mask[:, None, :, None].to(v.dtype)
            keys, v = keys * real, v * real
        return y, {"length": lengths_of(x, mask), "key": keys, "value": v, "cluster": cluster[:, :, :n]}

    def step(self, x_t, state):
        length = self.check_step(x_t, state)
        q = self.split_heads(self.q_proj(x_t[:, None]))[:, :, 0]  # (B, H, Dh)
        v = self.split_heads(self.v_proj(x_t[:, None]))[:, :, 0]
        qn = F.normalize(q, dim=-1)
        with torch.no_grad():
            assign = self._similarity(qn[:, :, None])[:, :, 0].argmax(dim=-1)  # (B, H)
        key = append_at(state["key"], qn, length, dim=2)  # (B, H, S + 1, Dh)
        value = append_at(state["value"], v, length, dim=2)
        cluster = append_at(state["cluster"], assign, length, dim=2)  # (B, H, S + 1)
        out = sorted_chunk_step(q, key, value, cluster[:, :, None], assign[:, :, None], length, self.window,
                                scale=self.scale)  # fmt: skip
        y = self.finish(out[:, :, None], None)[:, 0]
        return y, {"length": length + 1, "key": key, "value": value, "cluster": cluster}

    def prune_head_params(self, keep, rows):
        self.centroids = self.centroids[keep].clone()
