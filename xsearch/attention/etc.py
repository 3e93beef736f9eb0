"""ETC (Ainslie et al.): global-local attention between a long input and a small set of global
tokens; here the global tokens are a learned memory and only the long (local) tokens are returned.
"""

from __future__ import annotations

import torch
from torch import nn

from xsearch.attention._base import Attention, AttentionSpec, positive_int, sdpa
from xsearch.attention._blocks import band_attention
from xsearch.attention._registry import register
from xsearch.errors import XSearchError


@register(
    AttentionSpec(
        name="etc",
        paper="ETC: Encoding Long and Structured Inputs in Transformers",
        family=("FP", "M"),
        complexity="O(N·(r + g))",
        causal=False,
        params={"n_global": 32, "radius": 128},
        small_params={"n_global": 4, "radius": 4},
    )
)
class ETCAttention(Attention):
    """Global-local attention with ``n_global`` learned global tokens and local radius ``radius``.

    The four pieces of the paper: global-to-global and global-to-long attention are full
    (the global tokens read each other and every real long token); long-to-global is full
    and long-to-long is restricted to ``|i - j| <= radius``. Each side normalises its two
    pieces in one softmax, as in the paper.

    ETC runs a global and a long stream side by side, the global outputs of one layer being
    what the long tokens read in the next. This module returns only the long tokens and its
    global tokens are per-layer learned embeddings (``global_tokens``, the memory), so the two
    sides run in sequence inside the layer: first the global tokens attend (g2g + g2l) and are
    updated residually, ``g' = g + out_proj(attn)``; then the long tokens attend their radius
    (l2l) and the updated global tokens (l2g). Without this the long tokens would read a
    constant memory and g2g/g2l would have no effect. The same ``q_proj``/``k_proj``/``v_proj``
    serve all four pieces (ETC's ``share_qkv_projections`` setting). ETC's relative position
    labels are not implemented; the model's position encoding provides positions.
    """

    def check_params(self, n_global, radius):
        positive_int("etc", "n_global", n_global)
        if radius < 0:
            raise XSearchError(f"attention 'etc': parameter 'radius' must be >= 0, got {radius}")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.global_tokens = nn.Parameter(torch.randn(self.params["n_global"], self.d_model))  # (G, D)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = self.check_input(x, mask)
        b, n, _ = x.shape
        real = torch.ones(b, n, dtype=torch.bool, device=x.device) if mask is None else mask  # (B, N)
        q, k, v = self.project_qkv(x)  # (B, H, N, Dh) each
        gk, gv = self.global_states(k, v, real)  # (B, H, G, Dh)
        out = self.local_side(q, k, v, gk, gv, real)  # (B, H, N, Dh)
        return self.finish(out, mask)

    def global_states(self, k: torch.Tensor, v: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """g2g + g2l: the global tokens attend each other and the real long tokens.

        Returns:
            Keys and values ``(B, H, G, Dh)`` of the updated global tokens.
        """
        b = k.shape[0]
        g = self.global_tokens.shape[0]
        mem = self.global_tokens.unsqueeze(0).expand(b, -1, -1)  # (B, G, D)
        qg = self.split_heads(self.q_proj(mem))  # (B, H, G, Dh)
        kg = self.split_heads(self.k_proj(mem))
        vg = self.split_heads(self.v_proj(mem))
        keys = torch.cat([kg, k], dim=2)  # (B, H, G+N, Dh)
        vals = torch.cat([vg, v], dim=2)
        # The global keys are always real, so no row is fully masked.
        allowed = torch.cat([real.new_ones(b, g), real], dim=1)[:, None, None, :]  # (B, 1, 1, G+N)
        og = sdpa(qg, keys, vals, allowed, dropout_p=self.dropout_p if self.training else 0.0)  # (B, H, G, Dh)
        upd = mem + self.out_proj(self.merge_heads(og))  # (B, G, D)
        return self.split_heads(self.k_proj(upd)), self.split_heads(self.v_proj(upd))

    def local_side(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        gk: torch.Tensor,
        gv: torch.Tensor,
        real: torch.Tensor,
    ) -> torch.Tensor:
        """l2l (radius) + l2g in one softmax, ``(B, H, N, Dh)``."""
        r = self.params["radius"]
        b, g = gk.shape[0], gk.shape[2]
        return band_attention(
            q, k, v, real, back=r, ahead=r, extra_k=gk, extra_v=gv, extra_real=real.new_ones(b, g),
            dropout_p=self.dropout_p if self.training else 0.0,
        )  # fmt: skip
