"""Linformer (Wang et al.): keys and values projected along the length to rank ``k``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xsearch.attention._base import Attention, AttentionSpec, positive_int, sdpa
from xsearch.attention._registry import register
from xsearch.errors import XSearchError


@register(
    AttentionSpec(
        name="linformer",
        paper="Linformer: Self-Attention with Linear Complexity",
        family=("LR",),
        complexity="O(N·k)",
        causal=False,
        params={"k": 256, "share_kv": False},
        small_params={"k": 16},
    )
)
class LinformerAttention(Attention):
    """Keys and values are compressed along the sequence by ``E`` and ``F`` (``k x max_len``,
    sliced to the first N columns), shared across heads (the paper's headwise sharing).

    The length projection is applied to the input before ``k_proj``/``v_proj``
    (``E (X Wᵀ + 1 bᵀ) = (E X) Wᵀ + (E 1) bᵀ``, exact), so the two projections run on k rows
    instead of N. Padded positions are zeroed first, so a padded sequence gives the same
    result as the same sequence unpadded. ``share_kv=True`` uses one matrix for both.
    """

    projections_called_as_modules = False  # k/v weights are folded with the compression

    def check_params(self, k, share_kv):
        positive_int("linformer", "k", k)
        if self.max_len is None:
            raise XSearchError("attention 'linformer' needs max_len (its projections are k x max_len)")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        k, n = self.params["k"], self.max_len
        self.E = nn.Parameter(torch.randn(k, n) / math.sqrt(k))
        self.F = None if self.params["share_kv"] else nn.Parameter(torch.randn(k, n) / math.sqrt(k))

    def forward(self, x, mask=None):
        mask = self.check_input(x, mask)
        b, n, _ = x.shape
        q = self.split_heads(self.q_proj(x))  # (B, H, N, Dh)
        ones = x.new_ones(b, n, 1) if mask is None else mask[..., None].to(x.dtype)
        xm = x * ones
        keys = self._compress(self.E[:, :n], xm, ones, self.k_proj)  # (B, H, k, Dh)
        f = self.E if self.F is None else self.F
        values = self._compress(f[:, :n], xm, ones, self.v_proj)
        out = sdpa(q, keys, values, dropout_p=self.dropout_p if self.training else 0.0)
        return self.finish(out, mask)

    def _compress(self, proj, xm, ones, linear: nn.Linear) -> torch.Tensor:
        xc = torch.matmul(proj, xm)  # (B, k, D)
        s = torch.matmul(proj, ones)  # (B, k, 1): E applied to the bias column
        t = F.linear(xc, linear.weight) + s * linear.bias  # (B, k, H*Dh)
        b, kk, _ = t.shape
        return t.view(b, kk, self.n_heads, self.head_dim).transpose(1, 2)
