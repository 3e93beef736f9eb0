"""Reformer (Kitaev et al.): LSH attention with shared query-key vectors.

Every token is hashed ``n_hashes`` times by angular LSH (random rotations, ``argmax([xR; -xR])``),
sorted by (bucket, position), cut into chunks of ``bucket_size`` and each chunk attends itself and
the chunk before it; the rounds are combined by their log-sum-exp. ``sorted_chunk_attention`` is
the shared core (the causal ``routing`` variant reuses it with k-means clusters as buckets).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from xsearch.attention._base import Attention, AttentionSpec, exporting, pad_to_multiple, positive_int, sdpa
from xsearch.attention._blocks import real_tokens
from xsearch.attention._decode import append_at, lengths_of
from xsearch.attention._registry import register
from xsearch.errors import XSearchError

# Score given to a query's own key: far below any real score, so a token attends itself only
# when no other key is available (Reformer / reference implementations use the same device).
SELF_SCORE = -5e4


def _flash_lse_available(t: torch.Tensor) -> bool:
    """Whether the fused CPU kernel that also returns the log-sum-exp can run on ``t`` (a CPU tensor; the
    kernel has no CUDA implementation)."""
    return t.device.type == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def sorted_chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    buckets: torch.Tensor,
    real: torch.Tensor,
    chunk: int,
    n_buckets: int,
    *,
    causal: bool,
    scale: float,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Bucketed attention: sort by (bucket, position), attend within the chunk and the one before.

    Every round ``r`` sorts the tokens by ``(buckets[..., r, :], position)``, cuts the sorted order into
    chunks of ``chunk`` and lets each chunk attend itself and the previous chunk (none before chunk 0).
    A query never attends its own key unless nothing else is allowed (shared QK: ``q·q̂`` would
    dominate). Rounds are combined with weights ``softmax_r(lse_r)`` (the log-sum-exp of each round's
    scores), the reference implementations' rule without the paper's duplicate correction.

    Non-causal: every real key in the 2-chunk window is allowed. Causal: a key is allowed only when it
    is in the same bucket, at or before the query in the sorted order and at most ``chunk`` places
    before it. Within a bucket the sorted order is the position order, so the allowed set is exactly
    "the ``chunk`` most recent earlier tokens of my bucket": a function of the tokens up to the query
    only, whatever later tokens hash to (they can only shift where the bucket starts in the sorted
    order). The window always covers those places, since a chunk starts at most ``chunk - 1`` places
    before its query.

    Several rounds need each round's log-sum-exp: in eager inference (no autograd, no dropout) the
    fused CPU kernel returns it; training and export take a plain ``baddbmm``/softmax path with the
    same masks (the tests check that both agree).

    Args:
        q: ``(B, H, Np, Dh)`` queries; k: ``(B, H, Np, Dh)`` keys; v: ``(B, H, Np, Dh)`` values, with
            ``Np`` a multiple of ``chunk``.
        buckets: ``(B, H, R, Np)`` int64 bucket of every token in each round, in ``[0, n_buckets)``;
            padded tokens must carry a bucket above every real one so they sort to the end and never
            move real tokens.
        real: ``(B, Np)`` bool, False for padding.
        chunk: chunk length of the sorted order.
        n_buckets: number of bucket ids, the padding bucket included.
        causal: decoder mode.
        scale: score scale.
        dropout_p: dropout on the attention weights.

    Returns:
        ``(B, H, Np, Dh)``.
    """
    b, h, n, d = q.shape
    r = buckets.shape[2]
    dev = q.device
    pos = torch.arange(n, device=dev)
    order = torch.argsort(buckets * n + pos, dim=-1)  # (B, H, R, Np): unique keys, so stable by position
    # Row indices into the (B*H*Np, Dh) tables: one index_select lays out a whole window. The slots
    # before chunk 0 repeat chunk 0 and are masked (causal: they lie before every bucket start).
    flat = order + (torch.arange(b * h, device=dev) * n).view(b, h, 1, 1)  # (B, H, R, Np)
    flat_c = flat.reshape(b, h, r, -1, chunk)  # (B, H, R, nc, c)
    flat_w = torch.cat([torch.cat([flat_c[..., :1, :], flat_c[..., :-1, :]], dim=-2), flat_c], dim=-1)
    nc = flat_c.shape[3]
    nb = b * h * r * nc
    qc = q.reshape(b * h * n, d).index_select(0, flat.reshape(-1)).view(nb, chunk, d)  # sorted queries
    kw = k.reshape(b * h * n, d).index_select(0, flat_w.reshape(-1)).view(nb, 2 * chunk, d)  # key windows
    vw = v.reshape(b * h * n, d).index_select(0, flat_w.reshape(-1)).view(nb, 2 * chunk, d)

    rows = torch.arange(chunk, device=dev)[:, None]  # query slot in its chunk
    cols = torch.arange(2 * chunk, device=dev)[None, :]  # key slot in the window (slot c + row: the own key)
    self_slot = cols == rows + chunk  # (c, 2c)
    if causal:
        # Allowed keys of the query at sorted index s in bucket β: sorted indices in
        # [max(start_β, s - chunk), s) — a range, so the mask is two comparisons per window slot.
        b_s = buckets.gather(3, order)  # (B, H, R, Np) sorted buckets
        counts = torch.zeros(b, h, r, n_buckets, dtype=torch.long, device=dev)
        counts = counts.scatter_add(3, b_s, torch.ones_like(b_s))  # tokens per bucket
        starts = torch.cumsum(counts, dim=3) - counts  # (B, H, R, n_buckets): first sorted index of each bucket
        start = starts.gather(3, b_s).reshape(b, h, r, nc, chunk)  # (B, H, R, nc, c)
        chunk_start = (torch.arange(nc, device=dev) * chunk).view(nc, 1)
        lo = torch.maximum(start - chunk_start + chunk, rows[:, 0])  # first allowed window slot
        lo = lo.unsqueeze(-1)  # (B, H, R, nc, c, 1)
        alone = lo == rows + chunk  # no earlier key of the bucket: the own key only
    else:
        real_w = real[:, None, :].expand(b, h, n).reshape(-1)[flat_w]  # (B, H, R, nc, 2c)
        first = (torch.arange(nc, device=dev) == 0).view(nc, 1)
        valid = (real_w & ~(first & (cols < chunk))).unsqueeze(-2)  # (B, H, R, nc, 1, 2c): real, in range

    if r == 1:
        # One round needs no log-sum-exp: the fused kernel, heads and chunks folded into its batch axis.
        if causal:
            hi = rows + chunk - 1 + alone.long()  # last allowed slot: before the own key, or the own key
            allowed = (cols >= lo) & (cols <= hi)
        else:
            others = valid & ~self_slot
            allowed = others | (self_slot & ~others.any(dim=-1, keepdim=True))
        out = sdpa(
            qc.unsqueeze(1),
            kw.unsqueeze(1),
            vw.unsqueeze(1),
            allowed.reshape(nb, 1, chunk, 2 * chunk),
            dropout_p=dropout_p,
            scale=scale,
        )  # (nb, 1, c, Dh)
        lse = None
    else:
        # Additive mask: 0 where allowed, SELF_SCORE on the own key (so it only counts when alone),
        # -inf elsewhere; one full-size pass.
        pattern = torch.zeros(self_slot.shape, dtype=q.dtype, device=dev).masked_fill(self_slot, SELF_SCORE)
        if causal:
            pattern = pattern.masked_fill(cols > rows + chunk, float("-inf"))
            bias = torch.where(cols >= lo, pattern, float("-inf"))
        else:
            bias = torch.where(self_slot, pattern, torch.where(valid, 0.0, float("-inf")).to(q.dtype))
        bias = bias.reshape(nb, chunk, 2 * chunk)
        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        if not grad and dropout_p == 0.0 and not exporting() and _flash_lse_available(q):
            # Inference: the fused kernel also returns each row's log-sum-exp (not differentiable,
            # not exportable, hence the plain path below for training and export).
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                qc.unsqueeze(1), kw.unsqueeze(1), vw.unsqueeze(1), 0.0, False, attn_mask=bias.unsqueeze(1), scale=scale
            )  # (nb, 1, c, Dh), (nb, 1, c)
        else:
            scores = torch.baddbmm(bias, qc, kw.transpose(1, 2), alpha=scale)  # (nb, c, 2c)
            # Stabilised by hand (an exported ReduceLogSumExp need not be): the row max is finite
            # since the own key is always there.
            top = scores.amax(dim=-1, keepdim=True)
            e = torch.exp(scores - top)
            total = e.sum(dim=-1, keepdim=True)
            lse = top + torch.log(total)
            p = e / total
            if dropout_p > 0.0:
                p = F.dropout(p, dropout_p)
            out = torch.bmm(p, vw)  # (nb, c, Dh)

    # Undo the sort (inverse permutation as flat row indices), then combine the rounds.
    inverse = torch.zeros_like(order).scatter(3, order, pos.expand(b, h, r, n))  # (B, H, R, Np)
    inv_flat = inverse + (torch.arange(b * h * r, device=dev) * n).view(b, h, r, 1)
    out = out.reshape(b * h * r * n, d).index_select(0, inv_flat.reshape(-1)).view(b, h, r, n, d)
    if lse is None:
        return out[:, :, 0]
    lse = lse.reshape(b, h, r, n).gather(3, inverse)
    w = torch.softmax(lse.float(), dim=2).to(out.dtype)  # (B, H, R, Np): weight of each round
    return (out * w.unsqueeze(-1)).sum(dim=2)  # (B, H, Np, Dh); a Mul and a ReduceSum (onnxruntime's Einsum is slow)


def sorted_chunk_step(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    buckets: torch.Tensor,
    bucket: torch.Tensor,
    length: torch.Tensor,
    chunk: int,
    *,
    scale: float,
) -> torch.Tensor:
    """One query row of causal ``sorted_chunk_attention``: the decoding step over cached keys.

    The query at position ``length`` of round ``r`` attends the ``chunk`` most recent earlier keys of its
    own bucket, and its own key with ``SELF_SCORE`` added (so it only counts when alone); rounds are
    combined by their log-sum-exp, as in the causal forward. O(S) per round, S the cached keys.

    Args:
        q: ``(B, H, Dh)`` the new query; keys, values: ``(B, H, S, Dh)`` with the new token's at slot
            ``length``; buckets: ``(B, H, R, S)`` long, the cached keys' buckets; bucket: ``(B, H, R)``
            the new token's; length: ``(B,)`` the tokens before the new one.

    Returns:
        ``(B, H, Dh)``.
    """
    slots = torch.arange(keys.shape[2], device=q.device)[None, :]  # (1, S)
    before = (slots < length[:, None])[:, None, None, :]  # (B, 1, 1, S)
    own = (slots == length[:, None])[:, None, None, :]
    same = (buckets == bucket.unsqueeze(-1)) & before  # (B, H, R, S): earlier keys of my bucket
    # Keep the last `chunk` of them: fewer than `chunk` keys of the bucket lie after this one.
    later = same.sum(dim=-1, keepdim=True) - torch.cumsum(same.long(), dim=-1)  # (B, H, R, S)
    recent = same & (later < chunk)
    bias = torch.where(recent, 0.0, torch.where(own, SELF_SCORE, float("-inf"))).to(q.dtype)
    scores = (keys @ q.unsqueeze(-1)).transpose(-2, -1) * scale + bias  # (B, H, R, S)
    top = scores.amax(dim=-1, keepdim=True)  # finite: the own key is always there
    e = torch.exp(scores - top)
    total = e.sum(dim=-1, keepdim=True)
    out = (e / total) @ values  # (B, H, R, Dh)
    if buckets.shape[2] == 1:
        return out[:, :, 0]
    w = torch.softmax((top + torch.log(total)).float(), dim=2).to(out.dtype)  # (B, H, R, 1)
    return (out * w).sum(dim=2)


@register(
    AttentionSpec(
        name="reformer",
        paper="Reformer: The Efficient Transformer",
        family=("LP",),
        complexity="O(r·N·(b + log N))",
        causal=True,
        params={"bucket_size": 64, "n_hashes": 2, "redraw": True},
        small_params={"bucket_size": 8, "n_hashes": 2},
    )
)
class ReformerAttention(Attention):
    """LSH attention with shared QK (Kitaev et al., 2020).

    Shared QK: the paper maps each token to queries and keys with ONE linear layer and uses
    unit-normalised queries as keys. Here ``k_proj`` is that same layer: its weight and bias are tied
    to ``q_proj``'s (the same ``nn.Parameter`` objects, so both names receive the gradient and a
    saved model stores the tensor once); forward computes ``qk = q_proj(x)`` once, queries are ``qk``
    and keys ``qk / |qk|``. Tools that rewrite projections by name (adapters, pruning) must treat
    ``q_proj``/``k_proj`` of this variant as one layer.

    Hashing: per head and round, random rotations ``R`` (``Dh x n_buckets/2``, a buffer drawn from
    torch's global generator) give ``bucket = argmax([qk R; -qk R])``. ``n_buckets`` is fixed by
    ``max_len`` (``≈ max_len / bucket_size``, even; 1 when ``bucket_size >= max_len``) so a token's
    bucket never depends on the sequence length. With ``redraw=True`` (the paper's fresh hashes per
    step) training forwards redraw the rotations; eval never does, so eval is deterministic.

    Chunks of ``bucket_size`` sorted tokens attend their own and the previous chunk (no wrap-around);
    a token attends itself only when no other key is allowed; rounds are combined by log-sum-exp.
    Causal mode keeps only same-bucket keys at most ``bucket_size`` places back in the bucket (see
    ``sorted_chunk_attention``), which makes outputs independent of later tokens.
    Padded tokens hash to an extra last bucket so they never move real tokens in the sorted order.

    Decoding state: ``key`` (the unit-normalised shared QK vectors, float32) and ``value``
    ``(B, H, N, Dh)``, and each key's buckets ``bucket`` long ``(B, H, n_hashes, N)``, all growing by one
    slot a token; a step attends the new query over the cached keys of its bucket (``sorted_chunk_step``).
    """

    state_names = ("key", "value", "bucket")

    def check_params(self, bucket_size, n_hashes, redraw):
        positive_int("reformer", "bucket_size", bucket_size)
        positive_int("reformer", "n_hashes", n_hashes)
        if self.max_len is None:
            raise XSearchError("attention 'reformer' needs max_len (its number of buckets is max_len / bucket_size)")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Shared QK: k_proj IS q_proj (tied parameters).
        self.k_proj.weight = self.q_proj.weight
        self.k_proj.bias = self.q_proj.bias
        bs = self.params["bucket_size"]
        self.n_buckets = 1 if bs >= self.max_len else 2 * math.ceil(self.max_len / (2 * bs))
        self.register_buffer("rotations", self._draw_rotations())

    def _draw_rotations(self) -> torch.Tensor:
        half = max(self.n_buckets // 2, 1)
        return torch.randn(self.n_heads, self.params["n_hashes"], self.head_dim, half)  # (H, R, Dh, nb/2)

    def redraw_rotations(self) -> None:
        """Draw fresh random rotations (in place, so the buffer keeps its identity)."""
        self.rotations.copy_(self._draw_rotations().to(self.rotations))

    def hash(self, qk: torch.Tensor) -> torch.Tensor:
        """Bucket of every token in every round: ``(B, H, N, Dh)`` -> int64 ``(B, H, R, N)``."""
        b, h, n, _ = qk.shape
        if self.n_buckets == 1:
            return torch.zeros(b, h, self.params["n_hashes"], n, dtype=torch.long, device=qk.device)
        # In float32 even for low-precision models: rounding would flip near-tied buckets.
        rot = qk.float().unsqueeze(2) @ self.rotations.float()  # (B, H, R, N, nb/2); a MatMul when exported
        # argmax over [rot, -rot] without building it: the largest entry or the most negative one.
        hi, i_hi = rot.max(dim=-1)
        lo, i_lo = rot.min(dim=-1)
        return torch.where(hi >= -lo, i_hi, i_lo + rot.shape[-1])

    def forward(self, x, mask=None):
        return self._forward(x, self.check_input(x, mask))[0]

    def _forward(self, x, mask):
        """forward on a checked mask; also returns the keys, values and buckets ``(B, H, [R,] Np, .)``."""
        b, n, _ = x.shape
        bs = self.params["bucket_size"]
        if self.training and self.params["redraw"]:
            self.redraw_rotations()
        qk = pad_to_multiple(self.split_heads(self.q_proj(x)), bs, dim=2)  # (B, H, Np, Dh); k_proj is q_proj
        v = pad_to_multiple(self.split_heads(self.v_proj(x)), bs, dim=2)
        real = real_tokens(mask, b, n, bs, x.device) > 0.5  # (B, Np)
        with torch.no_grad():
            buckets = self.hash(qk)
            buckets = torch.where(real[:, None, None, :], buckets, self.n_buckets)  # padding: an extra last bucket
        # The attention core runs in float32: its large negative mask scores and the log-sum-exp
        # merge of the rounds overflow or lose the bucket structure in float16.
        dtype = qk.dtype
        qk, v = qk.float(), v.float()
        keys = F.normalize(qk, dim=-1)
        out = sorted_chunk_attention(
            qk,
            keys,
            v,
            buckets,
            real,
            bs,
            self.n_buckets + 1,
            causal=self.causal,
            scale=self.scale,
            dropout_p=self.dropout_p if self.training else 0.0,
        ).to(dtype)
        return self.finish(out[:, :, :n], mask), keys, v, buckets

    def prefill(self, x, mask=None):
        mask = self.check_decoding(x, mask)
        n = x.shape[1]
        y, keys, v, buckets = self._forward(x, mask)
        keys, v = keys[:, :, :n], v[:, :, :n].to(x.dtype)  # (B, H, N, Dh)
        if mask is not None:  # padded slots hold zeros, never read
            real = mask[:, None, :, None]
            keys, v = keys * real.to(keys.dtype), v * real.to(v.dtype)
        state = {"key": keys, "value": v, "bucket": buckets[..., :n]}
        return y, {"length": lengths_of(x, mask), **state}

    def step(self, x_t, state):
        length = self.check_step(x_t, state)
        qk = self.split_heads(self.q_proj(x_t[:, None]))  # (B, H, 1, Dh)
        v = self.split_heads(self.v_proj(x_t[:, None]))
        with torch.no_grad():
            bucket = self.hash(qk)[..., 0]  # (B, H, R)
        qk = qk.float()
        key = append_at(state["key"], F.normalize(qk, dim=-1)[:, :, 0], length, dim=2)  # (B, H, S + 1, Dh)
        value = append_at(state["value"], v[:, :, 0], length, dim=2)
        buckets = append_at(state["bucket"], bucket, length, dim=3)  # (B, H, R, S + 1)
        bs = self.params["bucket_size"]
        out = sorted_chunk_step(qk[:, :, 0], key, value.float(), buckets, bucket, length, bs, scale=self.scale)
        y = self.finish(out.to(x_t.dtype)[:, :, None], None)[:, 0]
        return y, {"length": length + 1, "key": key, "value": value, "bucket": buckets}

    def prune_head_params(self, keep, rows):
        self.rotations = self.rotations[keep].clone()
