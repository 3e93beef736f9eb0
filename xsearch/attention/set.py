"""Set Transformer (Lee et al.): the induced set attention block (ISAB), attention through a
small set of learned inducing points.
"""

from __future__ import annotations

import torch
from torch import nn

from xsearch.attention._base import Attention, AttentionSpec, positive_int, sdpa, slice_linear
from xsearch.attention._registry import register


@register(
    AttentionSpec(
        name="set",
        paper="Set Transformer: A Framework for Attention-based Permutation-Invariant Neural Networks",
        family=("M",),
        complexity="O(N·m)",
        causal=False,
        params={"n_inducing": 32},
        small_params={"n_inducing": 8},
    )
)
class SetAttention(Attention):
    """ISAB with ``m = n_inducing`` learned inducing points ``I`` (the memory):
    ``H = MAB(I, X)``, then ``out = MAB(X, H)``, both multi-head with ``n_heads`` heads, where
    ``MAB(A, B) = LN(S + rFF(S))`` with ``S = LN(A + Multihead(A, B, B))``.

    How the projections map onto the two MABs: every projection applied to the N input
    tokens is a base projection, in the role the tokens play in ordinary attention, so the
    O(N) work stays in ``q_proj``/``k_proj``/``v_proj``/``out_proj`` where pruning, adapters and
    quantization look for it:

    * MAB 1 (``I`` attends ``X``): queries ``ind_q_proj(I)``, keys ``k_proj(X)``, values
      ``v_proj(X)``, output ``ind_out_proj``; then its residual/LayerNorm (``ind_norm1``), the
      row-wise feed-forward ``relu(ind_ff(·))`` with residual and ``ind_norm2``, as in the
      paper (rFF is one Linear + ReLU, as in the authors' reference code).
    * MAB 2 (``X`` attends ``H``): queries ``q_proj(X)``, keys ``h_k_proj(H)`` (no bias: a key
      bias shifts every score of a row equally and cancels in the softmax), values
      ``h_v_proj(H)``, output ``out_proj``. Its residual, LayerNorm and rFF are those of the
      surrounding pre-LN Transformer block, so the module returns the multi-head output only.

    Padded positions are masked as keys of MAB 1 (they never reach ``H``); MAB 2 has only the m
    inducing keys, so it needs no mask. Without positional encodings the layer is
    permutation-equivariant. Cost O(N·m·d); encoder only (``H`` summarises the whole set).
    """

    def check_params(self, n_inducing):
        positive_int("set", "n_inducing", n_inducing)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        d, inner = self.d_model, self.n_heads * self.head_dim
        self.inducing = nn.Parameter(torch.empty(self.params["n_inducing"], d))  # (m, D)
        nn.init.xavier_uniform_(self.inducing)
        self.ind_q_proj = nn.Linear(d, inner)
        self.ind_out_proj = nn.Linear(inner, d)
        self.ind_norm1 = nn.LayerNorm(d)
        self.ind_ff = nn.Linear(d, d)
        self.ind_norm2 = nn.LayerNorm(d)
        self.h_k_proj = nn.Linear(d, inner, bias=False)
        self.h_v_proj = nn.Linear(d, inner)

    def forward(self, x, mask=None):
        mask = self.check_input(x, mask)
        b = x.shape[0]
        p = self.dropout_p if self.training else 0.0
        m = self.inducing.shape[0]

        # MAB 1: the inducing points attend the real tokens.
        k = self.split_heads(self.k_proj(x))  # (B, H, N, Dh)
        v = self.split_heads(self.v_proj(x))
        iq = self.ind_q_proj(self.inducing).view(m, self.n_heads, self.head_dim).transpose(0, 1)  # (H, m, Dh)
        iq = iq.unsqueeze(0).expand(b, -1, -1, -1)  # (B, H, m, Dh)
        allowed = None
        if mask is not None:
            # A sequence with no real token lets its inducing points see everything (its outputs
            # are zeroed anyway), so no row is fully masked; real sequences are unaffected.
            allowed = (mask | ~mask.any(-1, keepdim=True))[:, None, None, :]  # (B, 1, 1, N)
        a = sdpa(iq, k, v, allowed, dropout_p=p)  # (B, H, m, Dh)
        s = self.ind_norm1(self.inducing + self.ind_out_proj(self.merge_heads(a)))  # (B, m, D)
        hid = self.ind_norm2(s + torch.relu(self.ind_ff(s)))  # (B, m, D)

        # MAB 2: the tokens attend the inducing summary.
        q = self.split_heads(self.q_proj(x))  # (B, H, N, Dh)
        hk = self.split_heads(self.h_k_proj(hid))  # (B, H, m, Dh)
        hv = self.split_heads(self.h_v_proj(hid))
        out = sdpa(q, hk, hv, dropout_p=p)  # (B, H, N, Dh)
        return self.finish(out, mask)

    def prune_head_params(self, keep, rows):
        self.ind_q_proj = slice_linear(self.ind_q_proj, out_idx=rows)
        self.ind_out_proj = slice_linear(self.ind_out_proj, in_idx=rows)
        self.h_k_proj = slice_linear(self.h_k_proj, out_idx=rows)
        self.h_v_proj = slice_linear(self.h_v_proj, out_idx=rows)
