"""Memory-compressed attention (Liu et al., "Generating Wikipedia by Summarizing Long Sequences"):
keys and values are shortened by a strided convolution before softmax attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xsearch.attention._base import Attention, AttentionSpec, pad_to_multiple, positive_int, sdpa
from xsearch.attention._blocks import real_tokens
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
    """

    projections_called_as_modules = False  # k/v weights are folded with the compression

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
