"""Full softmax attention (Vaswani et al.): the O(N²) baseline every variant is measured against."""

from __future__ import annotations

import torch

from xsearch.attention._base import Attention, AttentionSpec, sdpa
from xsearch.attention._decode import attend_one, lengths_of
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
    """Softmax attention through ``F.scaled_dot_product_attention`` (fused on CPU and CUDA).

    Decoding state: the KV cache, ``key`` and ``value`` ``(B, H, N, Dh)``, and ``prompt_length`` ``(B,)``.
    A step appends its key and value at the end for every row (one concatenation, the copy of
    optimum's decoder-with-past); a row whose prompt was shorter than the batch's has unused slots
    between its prompt and its generated tokens, which ``prompt_length`` masks.
    """

    state_names = ("key", "value", "prompt_length")
    kv_cache = True

    def prefill(self, x, mask=None):
        mask = self.check_decoding(x, mask)
        q, k, v = self.project_qkv(x)  # (B, H, N, Dh)
        y = self.finish(self.attend(q, k, v, mask), mask)
        length = lengths_of(x, mask)
        if mask is not None:  # padded slots hold zeros, never read
            real = mask[:, None, :, None].to(k.dtype)
            k, v = k * real, v * real
        return y, {"length": length, "key": k, "value": v, "prompt_length": length}

    def step(self, x_t, state):
        length = self.check_step(x_t, state)
        prompt = state["prompt_length"]
        q, k, v = self.project_qkv(x_t[:, None])  # (B, H, 1, Dh)
        key = torch.cat([state["key"], k], dim=2)  # (B, H, S + 1, Dh)
        value = torch.cat([state["value"], v], dim=2)
        width = key.shape[2]
        after = length - prompt + 1  # tokens after the prompt, this one included (the same for every row)
        slot = torch.arange(width, device=key.device)[None, :]
        seen = (slot < prompt[:, None]) | (slot >= width - after[:, None])  # (B, S + 1)
        out = attend_one(q, key, value, seen, self.scale)  # (B, H, 1, Dh)
        new = {"length": length + 1, "key": key, "value": value, "prompt_length": prompt}
        return self.finish(out, None)[:, 0], new

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
