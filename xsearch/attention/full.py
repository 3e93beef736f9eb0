"""Full softmax attention (Vaswani et al.): the O(N²) baseline every variant is measured against."""

from __future__ import annotations

import torch

from xsearch.attention._base import Attention, AttentionSpec, sdpa
from xsearch.attention._registry import register


@register(
    AttentionSpec(
        name="full",
        paper="Attention Is All You Need",
        family=(),
        complexity="O(N²)",
        causal=True,
        params={},
        quadratic=True,
    )
)
class FullAttention(Attention):
    """Softmax attention through ``F.scaled_dot_product_attention`` (fused on CPU and CUDA)."""

    def attend(self, q, k, v, mask):
        # q, k, v: (B, H, N, Dh)
        p = self.dropout_p if self.training else 0.0
        if mask is None:
            return sdpa(q, k, v, causal=self.causal, dropout_p=p)
        if not self.causal:
            # Padded keys as an additive bias over keys only, (B, 1, 1, N): an exported graph adds
            # it to the scores, where a bool mask costs a full-size select, its expansion and a NaN
            # guard over (B, H, N, N). Finite (and within fp16's range), so a padded query whose
            # keys are all padding (an empty row) reads harmless values, never NaN; real rows see
            # exp(-1e4 - max) = 0 for every padded key, exactly as with a bool mask.
            bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, -1e4)
            return sdpa(q, k, v, bias[:, None, None, :], dropout_p=p)
        n = q.shape[2]
        allowed = mask[:, None, None, :]  # (B, 1, 1, N)
        eye = torch.eye(n, dtype=torch.bool, device=q.device)
        allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        # A padded query may see itself, so no row is fully masked; real rows are unaffected.
        allowed = allowed | eye
        return sdpa(q, k, v, allowed, dropout_p=p)
