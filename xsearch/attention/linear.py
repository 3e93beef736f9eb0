"""Linear Transformer (Katharopoulos et al.): softmax replaced by the kernel elu(x) + 1."""

from __future__ import annotations

import torch.nn.functional as F

from xsearch.attention._base import Attention, AttentionSpec, positive_int
from xsearch.attention._kernel_core import kernel_attention
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
    """

    def check_params(self, chunk_size):
        positive_int("linear", "chunk_size", chunk_size)

    def attend(self, q, k, v, mask):
        phi_q = F.elu(q) + 1.0  # (B, H, N, Dh)
        phi_k = F.elu(k) + 1.0
        if mask is not None:
            phi_k = phi_k * mask[:, None, :, None].to(phi_k.dtype)  # padded keys contribute nothing
        return kernel_attention(phi_q, phi_k, v, causal=self.causal, chunk=self.params["chunk_size"])
