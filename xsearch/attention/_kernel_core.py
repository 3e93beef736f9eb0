"""Kernelized (linear) attention shared by ``linear`` and ``performer``.

``out_i = phi(q_i) · Σ_j phi(k_j) v_jᵀ / (phi(q_i) · Σ_j phi(k_j))`` over all keys, or over
``j <= i`` in causal mode. Causal mode runs chunk-wise: exact quadratic attention inside a
chunk plus an exclusive prefix sum of the per-chunk states, so memory stays O(N).
"""

from __future__ import annotations

import torch

from xsearch.attention._base import pad_to_multiple

DEFAULT_CHUNK = 128
# A floor of the normaliser, not a term added to it: an added 1e-6 biased every output with a
# small normaliser, as large logits give (Performer, one key, |x| ~ 5: errors of 3e-3).
KERNEL_EPS = 1e-30
NEG = -1e30  # a finite "minus infinity" for log-scales: NEG - NEG = 0, never NaN
EXP_MIN = -87.0  # exp(-87) = 1.6e-38, just above the smallest normal float32


def kernel_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    chunk: int = DEFAULT_CHUNK,
    eps: float = KERNEL_EPS,
    key_logscale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Linear attention with non-negative features.

    Args:
        phi_q: ``(B, H, N, M)`` query features; phi_k: ``(B, H, N, M)`` key features, zero at
            padded keys; v: ``(B, H, N, Dh)``.
        causal: attend only to keys at or before the query.
        chunk: chunk length of the causal computation.
        eps: floor of the normaliser, so an all-zero row gives 0, not NaN.
        key_logscale: ``(B, H, N)`` or None. Key j's features are then ``exp(key_logscale_j) *
            phi_k_j``: features stabilised per key (by their own max) are combined relative to
            the max log-scale over the keys a query sees, as if stabilised by that max, so a
            causal output depends on earlier keys only, numerically too. Padded keys take
            ``NEG`` here (and zero features) so that they never raise the max.

    Returns:
        ``(B, H, N, Dh)``.
    """
    if not causal:
        if key_logscale is not None:
            s = key_logscale.unsqueeze(-1)  # (B, H, N, 1)
            phi_k = phi_k * (s - s.amax(dim=2, keepdim=True)).exp()
        kv = torch.matmul(phi_k.transpose(-1, -2), v)  # (B, H, M, Dh)
        z = phi_k.sum(dim=2, keepdim=True)  # (B, H, 1, M)
        num = torch.matmul(phi_q, kv)  # (B, H, N, Dh)
        return num / (phi_q * z).sum(-1, keepdim=True).clamp_min(eps)

    b, h, n, m = phi_q.shape
    d = v.shape[-1]
    qc = pad_to_multiple(phi_q, chunk, dim=2)
    nc = qc.shape[2] // chunk
    qc = qc.reshape(b, h, nc, chunk, m)  # (B, H, C, c, M)
    kc = pad_to_multiple(phi_k, chunk, dim=2).reshape(b, h, nc, chunk, m)
    vc = pad_to_multiple(v, chunk, dim=2).reshape(b, h, nc, chunk, d)
    pos = torch.arange(chunk, device=v.device)
    tril = pos[:, None] >= pos[None, :]  # (c, c): key j at or before query i
    scores = torch.einsum("bhcim,bhcjm->bhcij", qc, kc)  # (B, H, C, c, c)
    if key_logscale is None:
        scores = scores * tril
        kv = torch.einsum("bhcnm,bhcnd->bhcmd", kc, vc)  # (B, H, C, M, Dh)
        z = kc.sum(dim=3)  # (B, H, C, M)
        # Exclusive prefix of the chunk states, shifted rather than cumsum - kv (no cancellation).
        kv_prev = torch.cat([torch.zeros_like(kv[:, :, :1]), torch.cumsum(kv, dim=2)[:, :, :-1]], dim=2)
        z_prev = torch.cat([torch.zeros_like(z[:, :, :1]), torch.cumsum(z, dim=2)[:, :, :-1]], dim=2)
        inter_num = torch.einsum("bhcim,bhcmd->bhcid", qc, kv_prev)  # (B, H, C, c, Dh)
        inter_den = torch.einsum("bhcim,bhcm->bhci", qc, z_prev)  # (B, H, C, c)
    else:
        # Query i combines keys relative to M_i = max_{j <= i} s_j (the encoder's stabiliser on the
        # prefix). No cummax (not in the ONNX export): a running max inside the chunk by doubling
        # shifts (a fixed count, the chunk being static), a masked max over the chunks before.
        # Masked exponents are NEG or clamped before exp: no exp overflows, nothing is inf * 0.
        s = pad_to_multiple(key_logscale, chunk, dim=2, value=NEG).reshape(b, h, nc, chunk)  # (B, H, C, c)
        chunk_max = s.amax(dim=-1)  # (B, H, C)
        cpos = torch.arange(nc, device=v.device)
        before = cpos[:, None] > cpos[None, :]  # (C, C): chunk C' strictly before chunk C
        prev_max = chunk_max.unsqueeze(-2).masked_fill(~before, NEG).amax(dim=-1)  # (B, H, C): R_C
        run_max = s
        shift = 1
        while shift < chunk:
            shifted = torch.cat([torch.full_like(run_max[..., :shift], NEG), run_max[..., :-shift]], dim=-1)
            run_max = torch.maximum(run_max, shifted)
            shift *= 2
        run_max = torch.maximum(run_max, prev_max.unsqueeze(-1))  # (B, H, C, c): M_i
        # exp(s_j - M_i) <= 1 for j <= i inside the chunk; clamped, since exp of an exponent below
        # EXP_MIN (a weight under 2e-38: nothing) runs ~50x slower on CPU, and masked after exp.
        weight = (s.unsqueeze(-2) - run_max.unsqueeze(-1)).clamp_(EXP_MIN, 0.0).exp_()  # (B, H, C, c, c)
        scores = scores.mul_(weight.masked_fill_(~tril, 0.0))
        # Chunk states relative to their own max, carried to chunk C relative to R_C.
        wk = (s - chunk_max.unsqueeze(-1)).exp()  # (B, H, C, c)
        kv = torch.einsum("bhcnm,bhcnd->bhcmd", kc, vc * wk.unsqueeze(-1))  # (B, H, C, M, Dh)
        z = torch.einsum("bhcnm,bhcn->bhcm", kc, wk)  # (B, H, C, M)
        carry = (chunk_max.unsqueeze(-2) - prev_max.unsqueeze(-1)).masked_fill(~before, NEG).exp()  # (B, H, C, C)
        kv_prev = torch.einsum("bhce,bhemd->bhcmd", carry, kv)
        z_prev = torch.einsum("bhce,bhem->bhcm", carry, z)
        rescale = (prev_max.unsqueeze(-1) - run_max).exp()  # (B, H, C, c): exp(R_C - M_i) <= 1
        inter_num = torch.einsum("bhcim,bhcmd->bhcid", qc, kv_prev) * rescale.unsqueeze(-1)
        inter_den = torch.einsum("bhcim,bhcm->bhci", qc, z_prev) * rescale
    # Exact causal attention inside each chunk plus what it sees from the chunks before it.
    num = torch.einsum("bhcij,bhcjd->bhcid", scores, vc) + inter_num
    den = scores.sum(-1) + inter_den
    out = num / den.clamp_min(eps).unsqueeze(-1)
    return out.reshape(b, h, nc * chunk, d)[:, :, :n]
