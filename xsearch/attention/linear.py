"""Linear Transformer (Katharopoulos et al.): softmax replaced by the kernel elu(x) + 1."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xsearch.attention._base import Attention, AttentionSpec, positive_int
from xsearch.attention._decode import lengths_of
from xsearch.attention._kernel_core import KERNEL_EPS, kernel_attention
from xsearch.attention._registry import register


@register(
    AttentionSpec(
        name="linear",
        paper="Transformers are RNNs: Fast Autoregressive Transformers with Linear Attention",
        family=("KR",),
        complexity="O(N·d²)",
        causal=True,
        params={"chunk_size": 128},
        small_params={"chunk_size": 16},
    )
)
class LinearAttention(Attention):
    """``phi(x) = elu(x) + 1``; causal mode through chunk-wise prefix sums (O(N) memory).

    ``chunk_size`` only trades speed for memory in causal mode; results do not depend on it.

    Decoding state (the RNN of Katharopoulos et al.): ``kv = Σ phi(k_j) v_jᵀ`` ``(B, H, Dh, Dh)`` and
    ``z = Σ phi(k_j)`` ``(B, H, Dh)``, constant in the context length.
    """

    state_names = ("kv", "z")

    def _features(self, q, k, mask):
        phi_q = F.elu(q) + 1.0  # (B, H, N, Dh)
        phi_k = F.elu(k) + 1.0
        if mask is not None:
            phi_k = phi_k * mask[:, None, :, None].to(phi_k.dtype)  # padded keys contribute nothing
        return phi_q, phi_k

    def prefill(self, x, mask=None):
        mask = self.check_decoding(x, mask)
        q, k, v = self.project_qkv(x)
        phi_q, phi_k = self._features(q, k, mask)
        out = kernel_attention(phi_q, phi_k, v, causal=True, chunk=self.params["chunk_size"])
        state = {"length": lengths_of(x, mask), "kv": torch.matmul(phi_k.transpose(-1, -2), v), "z": phi_k.sum(2)}
        return self.finish(out, mask), state

    def step(self, x_t, state):
        length = self.check_step(x_t, state)
        q, k, v = self.project_qkv(x_t[:, None])  # (B, H, 1, Dh)
        phi_q, phi_k = self._features(q, k, None)
        kv = state["kv"] + torch.matmul(phi_k.transpose(-1, -2), v)  # (B, H, Dh, Dh)
        z = state["z"] + phi_k[:, :, 0]  # (B, H, Dh)
        num = torch.matmul(phi_q, kv)  # (B, H, 1, Dh)
        den = (phi_q[:, :, 0] * z).sum(-1).clamp_min(KERNEL_EPS)  # (B, H)
        out = num / den[..., None, None]
        return self.finish(out, None)[:, 0], {"length": length + 1, "kv": kv, "z": z}

    def check_params(self, chunk_size):
        positive_int("linear", "chunk_size", chunk_size)

    def attend(self, q, k, v, mask):
        phi_q, phi_k = self._features(q, k, mask)
        return kernel_attention(phi_q, phi_k, v, causal=self.causal, chunk=self.params["chunk_size"])
