"""Synthesizer (Tay et al.): attention weights synthesised without token-token dot products."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xsearch.attention._base import (
    Attention,
    AttentionSpec,
    exporting,
    positive_int,
    sdpa,
    slice_linear,
    slice_param,
)
from xsearch.attention._decode import append_at, lengths_of, slot_mask
from xsearch.attention._registry import register
from xsearch.errors import XSearchError

MODES = ("dense", "random", "factorized")

# Added to the score of a padded key: exp() of it is exactly 0 next to any real score, and it
# stays finite in fp16/bf16 (a row of only padded keys stays finite; such rows are zeroed).
_NEG = -1.0e4


@register(
    AttentionSpec(
        name="synthesizer",
        paper="Synthesizer: Rethinking Self-Attention in Transformer Models",
        family=("LR", "LP"),
        complexity="O(N²)",
        causal=True,
        params={"mode": "dense", "mix": 0.5, "k": 32},
        quadratic=True,
        small_params={"k": 4},
    )
)
class SynthesizerAttention(Attention):
    """Synthetic attention logits ``S`` (``N x N`` per head), mixed with dot-product logits:
    ``softmax(mix · QKᵀ/√Dh + (1 - mix) · S) V`` with ``V = v_proj(X)``.

    ``mode``:
        * ``"dense"``: each token predicts its own row of ``max_len`` logits,
          ``S_i = W2 · relu(W1 x_i + b1) + b2`` per head (``dense_in``: ``D -> H*Dh``, so the
          hidden width per head is ``Dh``; ``dense_out``/``dense_bias``: ``Dh -> max_len``),
          sliced to the first N columns.
        * ``"random"``: a learned ``max_len x max_len`` logit matrix per head (``random``),
          sliced to ``N x N``; independent of the input. Note its size: ``H·max_len²``
          parameters (268M at max_len 8192, 4 heads), so use it with short ``max_len``.
        * ``"factorized"``: the paper's factorized *random* Synthesizer,
          ``S = R1 R2ᵀ`` with ``R1, R2`` of shape ``max_len x k`` per head (``factor_q``,
          ``factor_k``); ``k`` is used by this mode only. The factorized dense variant is not
          implemented.

    ``mix`` is a fixed float in ``[0, 1]``, the weight of dot-product attention in the logit
    mixture (the paper's "mixture of synthesizers", with fixed instead of learned weights so it
    can be searched): 0 = pure synthetic (``q_proj``/``k_proj`` are then unused and get no
    gradient), 1 = plain softmax attention (the synthetic parameters are then unused). The
    default 0.5 uses every parameter.

    Dense and factorized logits are dot products between a per-query vector (``[h_i, 1]`` or
    ``R1_i``) and a per-key vector built from parameters (``[W2_j, b2_j]`` or ``R2_j``), so they
    are appended as extra coordinates to q and k and the whole mixture runs in the fused
    attention kernel without any ``N x N`` tensor. Random mode passes ``S`` as a float mask of
    shape ``(H, 1, N, N)`` with heads moved to the batch axis (the fused kernel wants a mask
    that broadcasts over its second axis). Padded keys are zeroed and get a ``-1e4`` score
    through one more coordinate (``O(N)`` instead of an ``N x N`` mask); causal masking is the
    kernel's causal mask (dense, factorized) or part of the float mask (random).

    Decoding state: the KV cache, ``key`` and ``value`` ``(B, H, N, Dh)``, growing by one slot a
    token (``key`` is ``(B, H, N, 0)`` when ``mix = 0``: no dot-product term). The synthetic logits
    of the new query at position t are its row of ``S`` over the N keys so far, read from the
    parameters (``random[:, t]``, ``factor_q[:, t]`` with ``factor_k``) or, in dense mode, predicted
    from the new token: O(N) per step.
    """

    state_names = ("key", "value")

    def check_params(self, mode, mix, k):
        if mode not in MODES:
            raise XSearchError(f"attention 'synthesizer': parameter 'mode' must be one of {MODES}, got {mode!r}")
        if not 0.0 <= mix <= 1.0:
            raise XSearchError(f"attention 'synthesizer': parameter 'mix' must be in [0, 1], got {mix!r}")
        positive_int("synthesizer", "k", k)
        if self.max_len is None:
            raise XSearchError("attention 'synthesizer' needs max_len (its synthetic logits are max_len wide)")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        h, dh, n = self.n_heads, self.head_dim, self.max_len
        mode, k = self.params["mode"], self.params["k"]
        if mode == "dense":
            self.dense_in = nn.Linear(self.d_model, h * dh)  # W1, b1
            self.dense_out = nn.Parameter(torch.randn(h, dh, n) * math.sqrt(2.0 / dh))  # W2 per head
            self.dense_bias = nn.Parameter(torch.zeros(h, n))  # b2 per head
        elif mode == "random":
            self.random = nn.Parameter(torch.randn(h, n, n))  # (H, max_len, max_len)
        else:
            std = k**-0.25  # R1 R2ᵀ entries then have unit variance, like the random mode's
            self.factor_q = nn.Parameter(torch.randn(h, n, k) * std)  # R1
            self.factor_k = nn.Parameter(torch.randn(h, n, k) * std)  # R2

    def forward(self, x, mask=None):
        mask = self.check_input(x, mask)
        b, n, _ = x.shape
        h, dh = self.n_heads, self.head_dim
        mode, mix = self.params["mode"], self.params["mix"]
        syn = 1.0 - mix
        v = self.split_heads(self.v_proj(x))  # (B, H, N, Dh)
        keep = None if mask is None else mask[:, None, :, None].to(x.dtype)  # (B, 1, N, 1)

        # Each entry of qs pairs with the entry of ks at the same index; scores = Σ qs·ks.
        qs: list[torch.Tensor] = []
        ks: list[torch.Tensor] = []
        if mix > 0.0:
            k = self.split_heads(self.k_proj(x))  # (B, H, N, Dh)
            qs.append(self.split_heads(self.q_proj(x)) * (mix * self.scale))
            ks.append(k if keep is None else k * keep)  # padded keys carry no content
        logit_mask = None
        if syn > 0.0:
            if mode == "dense":
                hid = self.split_heads(torch.relu(self.dense_in(x)))  # (B, H, N, Dh)
                qs += [hid * syn, x.new_full((b, h, n, 1), syn)]
                w2 = self.dense_out[:, :, :n].transpose(1, 2)  # (H, N, Dh)
                ks += [w2.expand(b, h, n, dh), self.dense_bias[:, :n, None].expand(b, h, n, 1)]
            elif mode == "factorized":
                kk = self.params["k"]
                qs.append((self.factor_q[:, :n] * syn).expand(b, h, n, kk))  # (B, H, N, k)
                ks.append(self.factor_k[:, :n].expand(b, h, n, kk))
            else:
                logit_mask = self.random[:, :n, :n] * syn  # (H, N, N)
                if self.causal:
                    future = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
                    logit_mask = logit_mask.masked_fill(future, float("-inf"))
        if mask is not None:
            qs.append(x.new_ones(b, h, n, 1))
            ks.append(((~mask).to(x.dtype) * _NEG)[:, None, :, None].expand(b, h, n, 1))
        if not qs:  # mix=0, random mode, no padding: scores come from the logit mask alone
            qs.append(x.new_zeros(b, h, n, 1))
            ks.append(x.new_zeros(b, h, n, 1))

        qa, ka = torch.cat(qs, dim=-1), torch.cat(ks, dim=-1)  # (B, H, N, W)
        # The fused CPU kernel wants equal q/k and v widths (a mismatch falls back to a path
        # several times slower), so everything is zero-padded to a common multiple of 8.
        width = -(-max(qa.shape[-1], dh) // 8) * 8
        qa = F.pad(qa, (0, width - qa.shape[-1]))
        ka = F.pad(ka, (0, width - ka.shape[-1]))
        # torch's fused kernel wants v as wide as q and k (else it falls back to the slow math
        # path); an exported graph multiplies by v as it is, at half the cost of a padded one.
        va = v if exporting() else F.pad(v, (0, width - dh))
        p = self.dropout_p if self.training else 0.0
        if logit_mask is None:
            out = sdpa(qa, ka, va, causal=self.causal, dropout_p=p, scale=1.0)  # (B, H, N, W)
        else:
            # Heads on the batch axis: the (H, 1, N, N) mask then broadcasts over the batch.
            t = (qa.transpose(0, 1), ka.transpose(0, 1), va.transpose(0, 1))  # (H, B, N, W)
            out = sdpa(*t, logit_mask[:, None], dropout_p=p, scale=1.0).transpose(0, 1)
        return self.finish(out[..., :dh], mask)

    def prefill(self, x, mask=None):
        mask = self.check_decoding(x, mask)
        k = self.split_heads(self.k_proj(x))  # (B, H, N, Dh)
        v = self.split_heads(self.v_proj(x))
        if self.params["mix"] == 0.0:
            k = k[..., :0]  # no dot-product term: nothing of the keys is ever read
        if mask is not None:  # padded slots hold zeros, never read
            real = mask[:, None, :, None].to(k.dtype)
            k, v = k * real, v * real
        return self.forward(x, mask), {"length": lengths_of(x, mask), "key": k, "value": v}

    def step(self, x_t, state):
        length = self.check_step(x_t, state)  # the new token's position t, per row
        mix = self.params["mix"]
        syn = 1.0 - mix
        x1 = x_t[:, None]  # (B, 1, D)
        k = self.split_heads(self.k_proj(x1))[:, :, 0]  # (B, H, Dh)
        if mix == 0.0:
            k = k[..., :0]
        key = append_at(state["key"], k, length, dim=2)  # (B, H, S + 1, Dh)
        value = append_at(state["value"], self.split_heads(self.v_proj(x1))[:, :, 0], length, dim=2)
        s1 = key.shape[2]
        scores = key.new_zeros(key.shape[0], self.n_heads, 1, s1)  # (B, H, 1, S + 1)
        if mix > 0.0:
            q = self.split_heads(self.q_proj(x1))  # (B, H, 1, Dh)
            scores = scores + torch.matmul(q * (mix * self.scale), key.transpose(-2, -1))
        if syn > 0.0:
            scores = scores + syn * self._synthetic_row(x1, length, s1)
        scores = scores.masked_fill(~slot_mask(length + 1, s1)[:, None, None, :], float("-inf"))
        out = torch.matmul(scores.softmax(dim=-1), value)  # (B, H, 1, Dh)
        return self.finish(out, None)[:, 0], {"length": length + 1, "key": key, "value": value}

    def _synthetic_row(self, x1: torch.Tensor, t: torch.Tensor, s1: int) -> torch.Tensor:
        """Row ``t[i]`` of the synthetic logits ``S`` over its first ``s1`` keys: ``(B, H, 1, s1)``."""
        mode = self.params["mode"]
        if mode == "dense":
            hid = self.split_heads(torch.relu(self.dense_in(x1)))  # (B, H, 1, Dh)
            return torch.matmul(hid, self.dense_out[:, :, :s1]) + self.dense_bias[None, :, None, :s1]
        if mode == "factorized":
            fq = self.factor_q.index_select(1, t).transpose(0, 1)[:, :, None]  # (B, H, 1, k)
            return torch.matmul(fq, self.factor_k[:, :s1].transpose(-2, -1))  # (H, k, s1) broadcast
        return self.random.index_select(1, t)[:, :, :s1].transpose(0, 1)[:, :, None]  # (B, H, 1, s1)

    def prune_head_params(self, keep, rows):
        if getattr(self, "dense_in", None) is not None:
            self.dense_in = slice_linear(self.dense_in, out_idx=rows)
        for name in ("dense_out", "dense_bias", "random", "factor_q", "factor_k"):
            if isinstance(getattr(self, name, None), nn.Parameter):
                setattr(self, name, slice_param(getattr(self, name), keep))
