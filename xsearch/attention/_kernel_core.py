"""Kernelized (linear) attention shared by ``linear`` and ``performer``.

``out_i = phi(q_i) · Σ_j phi(k_j) v_jᵀ / (phi(q_i) · Σ_j phi(k_j))`` over all keys, or over
``j <= i`` in causal mode. Causal mode runs chunk-wise: exact quadratic attention inside a
chunk plus an exclusive prefix sum of the per-chunk states, so memory stays O(N).
"""

from __future__ import annotations

import torch

from xsearch.attention._base import pad_to_multiple

DEFAULT_CHUNK = 128
KERNEL_EPS = 1e-6


def kernel_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    chunk: int = DEFAULT_CHUNK,
    eps: float = KERNEL_EPS,
) -> torch.Tensor:
    """Linear attention with non-negative features.

    Args:
        phi_q: ``(B, H, N, M)`` query features; phi_k: ``(B, H, N, M)`` key features, zero at
            padded keys; v: ``(B, H, N, Dh)``.
        causal: attend only to keys at or before the query.
        chunk: chunk length of the causal computation.
        eps: added to the normaliser so an all-zero row gives 0, not NaN.

    Returns:
        ``(B, H, N, Dh)``.
    """
    if not causal:
        kv = torch.matmul(phi_k.transpose(-1, -2), v)  # (B, H, M, Dh)
        z = phi_k.sum(dim=2, keepdim=True)  # (B, H, 1, M)
        num = torch.matmul(phi_q, kv)  # (B, H, N, Dh)
        return num / ((phi_q * z).sum(-1, keepdim=True) + eps)

    b, h, n, m = phi_q.shape
    d = v.shape[-1]
    qc = pad_to_multiple(phi_q, chunk, dim=2)
    nc = qc.shape[2] // chunk
    qc = qc.reshape(b, h, nc, chunk, m)  # (B, H, C, c, M)
    kc = pad_to_multiple(phi_k, chunk, dim=2).reshape(b, h, nc, chunk, m)
    vc = pad_to_multiple(v, chunk, dim=2).reshape(b, h, nc, chunk, d)
    # Exclusive prefix of the chunk states: what every chunk sees from the chunks before it.
    kv = torch.einsum("bhcnm,bhcnd->bhcmd", kc, vc)  # (B, H, C, M, Dh)
    z = kc.sum(dim=3)  # (B, H, C, M)
    kv_prev = torch.cumsum(kv, dim=2) - kv
    z_prev = torch.cumsum(z, dim=2) - z
    # Exact causal attention inside each chunk.
    tril = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).tril()
    scores = torch.einsum("bhcim,bhcjm->bhcij", qc, kc) * tril  # (B, H, C, c, c)
    num = torch.einsum("bhcij,bhcjd->bhcid", scores, vc) + torch.einsum("bhcim,bhcmd->bhcid", qc, kv_prev)
    den = scores.sum(-1) + torch.einsum("bhcim,bhcm->bhci", qc, z_prev)
    out = num / (den.unsqueeze(-1) + eps)
    return out.reshape(b, h, nc * chunk, d)[:, :, :n]
