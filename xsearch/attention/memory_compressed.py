"""Memory-compressed attention (Liu et al., "Generating Wikipedia by Summarizing Long Sequences"):
keys and values are shortened by a strided convolution before softmax attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xsearch.attention._base import Attention, AttentionSpec, pad_to_multiple, positive_int, sdpa
from xsearch.attention._blocks import real_tokens
from xsearch.attention._decode import lengths_of, ring_from_prefix, ring_write
from xsearch.attention._registry import register

# Added to the score of a fully padded compressed group (causal path): exp() of it is exactly 0
# next to any real score, and it stays finite in fp16/bf16, so no row ever becomes NaN.
_NEG = -1.0e4


@register(
    AttentionSpec(
        name="memory_compressed",
        paper="Generating Wikipedia by Summarizing Long Sequences",
        family=("FP", "M"),
        complexity="O(N²/c)",
        causal=True,
        params={"compression": 3},
        small_params={"compression": 3},
    )
)
class MemoryCompressedAttention(Attention):
    """Memory-compressed attention: after ``k_proj`` / ``v_proj``, keys and values are each
    compressed by a ``Conv1d`` with kernel = stride = ``compression`` (c), so N keys become
    ``ceil(N / c)`` group summaries; every query attends the summaries through softmax.

    Choices:
        * The convolution acts on the full projected width (``H*Dh -> H*Dh``, mixing heads, as
          in the paper's figure where the convolution sits between the projection and the head
          split), one for keys (``k_conv``) and one for values (``v_conv``), without bias (the
          projections' biases already flow through). Both are initialised to mean pooling
          (``W[o, i, j] = δ_oi / c``), so at initialisation ``compression=1`` is exactly full
          attention and larger c is attention over mean-pooled groups; training moves away
          from that.
        * Padded positions (user padding and the internal padding up to a multiple of c) are
          zeroed after the projections and before the convolution; a group with no real token
          is masked as a key. The projection and the (linear) convolution are fused into one
          ``c*D -> H*Dh`` matmul on the G groups (weights ``conv ∘ proj`` formed per call), so
          compression costs no more than a plain key/value projection; the result is the same
          as projecting, zeroing and convolving.
        * Encoder: each query attends all groups. Decoder (``causal=True``): a group only
          exists once complete, so query t in group ``g = t // c`` attends the compressed
          groups ``< g`` (they all end before t) plus the raw keys of its own group at
          positions ``<= t`` (the allowed small local window), all in one softmax. The group
          part runs through the fused causal kernel with the query groups on the sequence axis
          and a sentinel key whose score is the query's local maximum; its weight gives the
          normaliser needed to merge the two parts exactly, in O(N) memory. Attention-weight
          dropout is applied in the encoder only (the merge needs undropped weights); the
          output dropout applies in both modes.
        * With ``compression=1`` and the initial (identity) convolutions both modes equal
          ``full`` attention with the same projection weights.

    Decoding state: the raw keys and values of the current group, ``key`` and ``value``
    ``(B, H, c, Dh)`` (a ring: slot i holds in-group offset i), and the summaries of the complete
    groups, ``ckey`` and ``cvalue`` ``(B, H, N, e)`` with ``e = ceil(Dh / c)``: group g's summary,
    zero-padded to ``c·e`` and cut in c chunks, fills slots ``g·c .. g·c + c - 1`` (slots of a
    group not yet complete hold zeros). So the buffers grow by one slot a token, as a state whose
    shape follows the step count must (rows of a batch complete their groups at different steps),
    yet hold ``N / c`` summaries: ``O(N·Dh/c)`` in all. A step attends the ``N / c`` summaries and
    at most c raw keys; where the step completes a group, its ring's convolution is stored.
    """

    projections_called_as_modules = False  # k/v weights are folded with the compression
    state_names = ("key", "value", "ckey", "cvalue")

    @property
    def chunk(self) -> int:
        """``e``: the width of one slot of ``ckey``/``cvalue``, a c-th of a summary (rounded up)."""
        return -(-self.head_dim // self.params["compression"])

    def prefill(self, x, mask=None):
        mask = self.check_decoding(x, mask)
        b, n, _ = x.shape
        c, e, d = self.params["compression"], self.chunk, self.head_dim
        y = self.forward(x, mask)
        length = lengths_of(x, mask)
        state = {"length": length}
        real = real_tokens(mask, b, n, c, x.device).to(x.dtype)  # (B, Np)
        xg = (pad_to_multiple(x, c, dim=1) * real[..., None]).view(b, -1, c * self.d_model)  # (B, G, c*D)
        g = xg.shape[1]
        done = (torch.arange(g, device=x.device) + 1) * c <= length[:, None]  # (B, G): complete groups
        for name, proj, conv in (("key", self.k_proj, self.k_conv), ("value", self.v_proj, self.v_conv)):
            raw = self.split_heads(proj(x))  # (B, H, N, Dh)
            state[name] = ring_from_prefix(raw, length, c, dim=2)  # (B, H, c, Dh)
            summary = self._compress(xg, real.view(b, g, c), proj, conv)  # (B, H, G, Dh)
            summary = F.pad(summary * done[:, None, :, None].to(x.dtype), (0, c * e - d))  # (B, H, G, c*e)
            state["c" + name] = summary.reshape(b, self.n_heads, g * c, e)[:, :, :n]  # (B, H, N, e)
        return y, state

    def step(self, x_t, state):
        length = self.check_step(x_t, state)  # the new token's position t, per row
        c, d = self.params["compression"], self.head_dim
        b, h = x_t.shape[0], self.n_heads
        q, k, v = self.project_qkv(x_t[:, None])  # (B, H, 1, Dh)
        offset = torch.remainder(length, c)  # (B,): t's offset in its group g = t // c
        start = length - offset  # (B,): the group's first position
        new = {"length": length + 1}
        for name, raw, conv in (("key", k, self.k_conv), ("value", v, self.v_conv)):
            ring = ring_write(state[name], raw[:, :, 0], length, dim=2)  # (B, H, c, Dh)
            # The group's summary conv(ring), kept only where the group is complete (offset c - 1):
            # a c·(H·Dh)² product every step, the price of a step without a branch.
            w = conv.weight.permute(0, 2, 1).reshape(h * d, c * h * d)  # (out, tap-major in)
            summary = F.linear(ring.permute(0, 2, 1, 3).reshape(b, c * h * d), w).view(b, h, d)
            new[name] = ring
            new["c" + name] = self._store(state["c" + name], summary, start, offset == c - 1)
        # One softmax over the complete groups before t's own (their summaries) and t's own group
        # up to t (its raw keys, ring slots <= offset).
        ck, cv = (self._summaries(new[name]) for name in ("ckey", "cvalue"))  # (B, H, G, Dh)
        groups = torch.arange(ck.shape[2], device=x_t.device)[None, :] * c < start[:, None]  # (B, G)
        local = torch.arange(c, device=x_t.device)[None, :] <= offset[:, None]  # (B, c)
        allowed = torch.cat([groups, local], dim=1)[:, None, None, :]  # (B, 1, 1, G + c)
        keys = torch.cat([ck, new["key"]], dim=2)  # (B, H, G + c, Dh)
        values = torch.cat([cv, new["value"]], dim=2)
        out = sdpa(q, keys, values, allowed)  # (B, H, 1, Dh)
        return self.finish(out, None)[:, 0], new

    def _store(self, buf: torch.Tensor, summary: torch.Tensor, start: torch.Tensor, done: torch.Tensor):
        """``buf`` ``(B, H, S, e)`` grown by one slot, with ``summary`` ``(B, H, Dh)`` cut into the
        slots ``start .. start + c - 1`` of the rows where ``done``."""
        c, e = self.params["compression"], self.chunk
        grown = torch.cat([buf, buf.new_zeros(*buf.shape[:2], 1, e)], dim=2)  # (B, H, S + 1, e)
        chunks = F.pad(summary, (0, c * e - self.head_dim)).view(*summary.shape[:2], c, e)  # (B, H, c, e)
        j = torch.arange(grown.shape[2], device=buf.device)[None, :] - start[:, None]  # (B, S + 1): chunk index
        here = (j >= 0) & (j < c) & done[:, None]
        idx = j.clamp(0, c - 1)[:, None, :, None].expand(*grown.shape)
        return torch.where(here[:, None, :, None], torch.gather(chunks, 2, idx), grown)

    def _summaries(self, buf: torch.Tensor) -> torch.Tensor:
        """``(B, H, S, e)`` chunks -> ``(B, H, ceil(S / c), Dh)`` group summaries (zero where incomplete)."""
        c = self.params["compression"]
        b, h, _, e = buf.shape
        return pad_to_multiple(buf, c, dim=2).reshape(b, h, -1, c * e)[..., : self.head_dim]

    def check_params(self, compression):
        positive_int("memory_compressed", "compression", compression)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        c, inner = self.params["compression"], self.n_heads * self.head_dim
        self.k_conv = nn.Conv1d(inner, inner, c, stride=c, bias=False)
        self.v_conv = nn.Conv1d(inner, inner, c, stride=c, bias=False)
        mean_pool = torch.eye(inner)[:, :, None].expand(inner, inner, c) / c  # (out, in, c)
        with torch.no_grad():
            self.k_conv.weight.copy_(mean_pool)
            self.v_conv.weight.copy_(mean_pool)

    def _compress(self, xg: torch.Tensor, real_g: torch.Tensor, proj: nn.Linear, conv: nn.Conv1d) -> torch.Tensor:
        """``conv(proj(x) · real)`` for grouped, zero-padded inputs, as one matmul.

        Args:
            xg: ``(B, G, c*D)`` inputs, zero at padded positions, grouped tap-major.
            real_g: ``(B, G, c)`` 1 at real positions.

        Returns:
            ``(B, H, G, Dh)``. The projection's bias only counts at real positions, exactly as if
            the projected keys/values had been zeroed there before the convolution; fusing the
            projection into the convolution runs one ``c*D -> H*Dh`` matmul on G rows instead of
            a projection on N rows followed by the convolution.
        """
        b, g, _ = xg.shape
        c = self.params["compression"]
        w = torch.einsum("oij,id->ojd", conv.weight, proj.weight).reshape(-1, c * self.d_model)  # (H*Dh, c*D)
        tap_bias = torch.einsum("oij,i->jo", conv.weight, proj.bias)  # (c, H*Dh)
        out = F.linear(xg, w) + real_g @ tap_bias  # (B, G, H*Dh)
        return out.view(b, g, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(self, x, mask=None):
        mask = self.check_input(x, mask)
        b, n, _ = x.shape
        c = self.params["compression"]
        real = real_tokens(mask, b, n, c, x.device).to(x.dtype)  # (B, Np): 0 at user and internal padding
        xm = pad_to_multiple(x, c, dim=1) * real[..., None]  # (B, Np, D)
        g = xm.shape[1] // c
        xg = xm.view(b, g, c * self.d_model)
        real_g = real.view(b, g, c)
        ck = self._compress(xg, real_g, self.k_proj, self.k_conv)  # (B, H, G, Dh)
        cv = self._compress(xg, real_g, self.v_proj, self.v_conv)
        valid = real_g.amax(-1) > 0.5  # (B, G): group holds a real token
        if not self.causal:
            q = self.split_heads(self.q_proj(x))  # (B, H, N, Dh)
            allowed = None
            if mask is not None:
                # A sequence with no real token sees every group (its outputs are zeroed anyway),
                # so no row is fully masked; real rows are unaffected.
                allowed = (valid | ~valid.any(-1, keepdim=True))[:, None, None, :]  # (B, 1, 1, G)
            out = sdpa(q, ck, cv, allowed, dropout_p=self.dropout_p if self.training else 0.0)
            return self.finish(out, mask)
        out = self._causal(xm, ck, cv, valid, real_g)  # (B, c, H, G, Dh)
        h, d = self.n_heads, self.head_dim
        out = out.permute(0, 3, 1, 2, 4).reshape(b, g * c, h, d)[:, :n].transpose(1, 2)  # (B, H, N, Dh)
        return self.finish(out, mask)

    def _causal(self, xm, ck, cv, valid, real_g) -> torch.Tensor:
        """Decoder path. Tensors are laid out ``(B, c, H, G, ·)``: position ``t = g*c + i`` sits
        at in-group offset ``i`` (axis 1) and group ``g`` (axis 3). Returns ``(B, c, H, G, Dh)``."""
        b, g, c = real_g.shape
        h, d = self.n_heads, self.head_dim

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, G*c, H*Dh) -> (B, c, H, G, Dh), a view
            return t.view(b, g, c, h, d).permute(0, 2, 3, 1, 4)

        q = heads(self.q_proj(xm)) * self.scale
        k = heads(self.k_proj(xm))
        v = heads(self.v_proj(xm))

        # Local part: raw keys of the query's own group at positions <= the query.
        scores = torch.einsum("bihgd,bjhgd->bihgj", q, k)  # (B, c, H, G, c): query offset i, key offset j
        tril = torch.ones(c, c, dtype=torch.bool, device=xm.device).tril()[None, :, None, None, :]  # (1, c, 1, 1, c)
        eye = torch.eye(c, dtype=torch.bool, device=xm.device)[None, :, None, None, :]
        allowed = ((real_g[:, None, None] > 0.5) & tril) | eye  # a padded query sees itself: no empty row
        scores = scores.masked_fill(~allowed, float("-inf"))
        m = scores.amax(-1, keepdim=True).detach()  # (B, c, H, G, 1): stabiliser, cancels exactly
        e = torch.exp(scores - m)
        z_loc = e.sum(-1, keepdim=True)  # >= 1
        n_loc = torch.einsum("bihgj,bjhgd->bihgd", e, v)  # (B, c, H, G, Dh)

        # Group part: the group index is the fused kernel's sequence axis (the in-group offset is
        # on the batch axis), so "groups < g" is its causal mask once the keys are shifted right
        # by one slot. Slot 0 is a sentinel whose score is the query's local maximum m and whose
        # value is a unit in an extra column: its weight a = e^m / (e^m + Σ e^s) turns the
        # normalised output back into sums that merge exactly with the local part.
        # Extra coordinates: q' = [q·scale, m, 1], key' = [ck, 0, penalty], sentinel = [0, 1, 0].
        pen = (~valid).to(ck.dtype)[:, None, :, None].expand(b, h, g, 1) * _NEG  # (B, H, G, 1)
        zero = ck.new_zeros(b, h, g, 1)
        sent = F.pad(ck.new_ones(b, h, 1, 1), (d, 1))  # (B, H, 1, Dh+2): [0.., 1, 0]
        keys = torch.cat([sent, torch.cat([ck, zero, pen], dim=-1)[:, :, :-1]], dim=2)  # slot j: group j-1
        vals = torch.cat([sent, torch.cat([cv, zero, zero], dim=-1)[:, :, :-1]], dim=2)  # (B, H, G, Dh+2)
        keys = keys[:, None].expand(b, c, h, g, d + 2).reshape(b * c, h, g, d + 2)
        vals = vals[:, None].expand(b, c, h, g, d + 2).reshape(b * c, h, g, d + 2)
        qa = torch.cat([q, m, torch.ones_like(m)], dim=-1).view(b * c, h, g, d + 2)
        o = sdpa(qa, keys, vals, causal=True, scale=1.0).view(b, c, h, g, d + 2)
        o_grp, a = o[..., :d], o[..., d : d + 1]
        # (Σ_grp e^{s-m} v + Σ_loc e^{s-m} v) / (Σ_grp e^{s-m} + Σ_loc e^{s-m}), both sides times a.
        return (o_grp + a * n_loc) / (1.0 - a + a * z_loc)

    def prune_head_params(self, keep, rows):
        for name in ("k_conv", "v_conv"):
            old = getattr(self, name)
            new = nn.Conv1d(len(rows), len(rows), old.kernel_size[0], stride=old.stride[0], bias=False)
            with torch.no_grad():
                new.weight.copy_(old.weight.detach()[rows][:, rows])
            setattr(self, name, new)
