"""Performer (Choromanski et al.): FAVOR+ with positive orthogonal random features."""

from __future__ import annotations

import math

import torch

from xsearch.attention._base import Attention, AttentionSpec, exporting, positive_int
from xsearch.attention._decode import lengths_of
from xsearch.attention._kernel_core import KERNEL_EPS, NEG, kernel_attention
from xsearch.attention._registry import register
from xsearch.errors import XSearchError


def orthogonal_features(m: int, d: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``(m, d)`` random projection: stacked orthogonal blocks, rows scaled by chi(d) norms.

    Rows within each d x d block are exactly orthogonal (QR of a Gaussian matrix); the
    norms follow those of Gaussian vectors so each row is marginally N(0, I_d).
    """
    blocks = []
    for _ in range(math.ceil(m / d)):
        g = torch.randn(d, d, generator=generator)
        qmat, _ = torch.linalg.qr(g)
        blocks.append(qmat.T)
    w = torch.cat(blocks, dim=0)[:m]
    norms = torch.randn(m, d, generator=generator).norm(dim=1, keepdim=True)
    return w * norms


ENCODER_CHUNK = 1024  # tokens per step of the eager encoder (keeps feature maps in cache)


@register(
    AttentionSpec(
        name="performer",
        paper="Rethinking Attention with Performers",
        family=("KR",),
        complexity="O(N·m·d)",
        causal=True,
        params={"nb_features": 256, "redraw": 0, "chunk_size": 128},
        small_params={"nb_features": 32, "chunk_size": 16},
    )
)
class PerformerAttention(Attention):
    """FAVOR+: ``phi(x) = exp(w·x - |x|²/2) / sqrt(m)`` with ``x = q / d^(1/4)``, an unbiased
    estimate of the softmax kernel. The projection is a buffer drawn from torch's (seeded)
    global generator at construction and, in training, every ``redraw`` steps (0 = never);
    eval mode is deterministic.

    Stabilisers: each query row subtracts its own max (it cancels in the ratio). Keys subtract
    the max over real keys in the encoder. In causal mode that max would make early outputs
    depend numerically on later keys, so each key subtracts its own max s_j and
    ``kernel_attention`` combines the keys query i sees relative to ``max_{j <= i} s_j``: the
    encoder's stabiliser on the prefix, so a decoder output equals the encoder's on its prefix.
    (A data-independent bound such as ``|w|²/2`` made the features so small that the normaliser
    lost its precision.)

    Decoding state: ``kv = Σ w_j phi(k_j) v_jᵀ`` ``(B, H, M, Dh)``, ``z = Σ w_j phi(k_j)`` ``(B, H, M)``
    and ``max`` ``(B, H)``, the largest key log-scale so far, with ``w_j = exp(s_j - max)``: the
    causal computation's stabiliser carried as an online-softmax rescaling, constant in N.
    """

    state_names = ("kv", "z", "max")

    def prefill(self, x, mask=None):
        mask = self.check_decoding(x, mask)
        q, k, v = self.project_qkv(x)
        phi_q = self._features(q, True, mask)
        phi_k, s = self._causal_key_features(k, mask)  # (B, H, N, M), (B, H, N)
        out = kernel_attention(phi_q, phi_k, v, causal=True, chunk=self.params["chunk_size"], key_logscale=s)
        top = s.amax(dim=-1)  # (B, H)
        w = (s - top[..., None]).exp()[..., None]  # (B, H, N, 1); 0 at padded keys
        kv = torch.matmul((phi_k * w).transpose(-1, -2), v)  # (B, H, M, Dh)
        state = {"length": lengths_of(x, mask), "kv": kv, "z": (phi_k * w).sum(2), "max": top}
        return self.finish(out, mask), state

    def step(self, x_t, state):
        length = self.check_step(x_t, state)
        q, k, v = self.project_qkv(x_t[:, None])  # (B, H, 1, Dh)
        phi_q = self._features(q, True, None)[:, :, 0]  # (B, H, M)
        phi_k, s = self._causal_key_features(k, None)  # (B, H, 1, M), (B, H, 1)
        top = torch.maximum(state["max"], s[..., 0])  # (B, H)
        decay = (state["max"] - top).exp()[..., None]  # (B, H, 1)
        w = (s[..., 0] - top).exp()[..., None]
        kv = state["kv"] * decay[..., None] + torch.matmul(phi_k.transpose(-1, -2), v) * w[..., None]
        z = state["z"] * decay + phi_k[:, :, 0] * w  # (B, H, M)
        num = torch.matmul(phi_q[:, :, None], kv)  # (B, H, 1, Dh)
        den = (phi_q * z).sum(-1).clamp_min(KERNEL_EPS)  # (B, H)
        out = num / den[..., None, None]
        return self.finish(out, None)[:, 0], {"length": length + 1, "kv": kv, "z": z, "max": top}

    def check_params(self, nb_features, redraw, chunk_size):
        positive_int("performer", "nb_features", nb_features)
        positive_int("performer", "chunk_size", chunk_size)
        if redraw < 0:
            raise XSearchError(f"attention 'performer': parameter 'redraw' must be >= 0, got {redraw}")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        m = self.params["nb_features"]
        self.register_buffer("projection", orthogonal_features(m, self.head_dim))
        self.register_buffer("steps_since_redraw", torch.zeros((), dtype=torch.long))

    def redraw_features(self) -> None:
        """Draw a fresh projection (in place, so the buffer keeps its identity)."""
        w = orthogonal_features(self.params["nb_features"], self.head_dim)
        self.projection.copy_(w.to(self.projection))

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """``w·y - |y|²/2`` with ``y = x / d^(1/4)``: the exponent of the positive features."""
        c = self.head_dim**-0.25
        logits = torch.matmul(x, self.projection.T * c)  # (B, H, N, M)
        return logits.sub_((x * x).sum(-1, keepdim=True) * (0.5 * c * c))

    def _features(self, x: torch.Tensor, is_query: bool, mask: torch.Tensor | None) -> torch.Tensor:
        # exp(w·y - |y|²/2 - stab); the paper's 1/sqrt(m) factor cancels in the ratio of
        # kernel_attention, so it is left out. In-place passes: at N = 8192 the passes over the
        # (B, H, N, M) tensor, not the matmuls, dominate the cost.
        logits = self._logits(x)
        if is_query:
            stab = logits.amax(dim=-1, keepdim=True).detach()
        else:
            if mask is not None:  # padded keys get exp(-1e30 - stab) = 0: no later pass to zero them
                logits = logits.masked_fill(~mask[:, None, :, None], -1e30)
            stab = logits.amax(dim=(-2, -1), keepdim=True).detach()
        return logits.sub_(stab).exp_()

    def _causal_key_features(self, k: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Key features stabilised each by its own max, and those maxima as log-scales.

        Returns:
            ``(B, H, N, M)`` features (zero at padded keys) and ``(B, H, N)`` log-scales (``NEG``
            at padded keys, so they never raise a running max).
        """
        logits = self._logits(k)
        stab = logits.amax(dim=-1, keepdim=True).detach()  # (B, H, N, 1)
        phi_k = logits.sub_(stab).exp_()
        if mask is not None:
            real = mask[:, None, :, None]
            phi_k = phi_k * real.to(phi_k.dtype)
            stab = stab.masked_fill(~real, NEG)
        return phi_k, stab.squeeze(-1)

    def _encoder_chunked(self, q, k, v, mask, chunk: int = ENCODER_CHUNK) -> torch.Tensor:
        """The encoder computed ``chunk`` tokens at a time (eager mode): the same result as
        ``kernel_attention`` on full feature maps, without ever holding an ``(N, M)`` map.

        Keys are stabilised by a running max, the accumulated state rescaled whenever it grows
        (as in online softmax), so the effective stabiliser is still the max over all real keys.
        """
        n = v.shape[2]
        kv = z = run_max = None
        for s in range(0, n, chunk):
            logits = self._logits(k[:, :, s : s + chunk])  # (B, H, c, M)
            real = None if mask is None else mask[:, None, s : s + chunk, None]
            if real is not None:
                logits = logits.masked_fill_(~real, -1e30)
            new_max = logits.amax(dim=(-2, -1), keepdim=True).detach()
            if run_max is not None:
                new_max = torch.maximum(run_max, new_max)
            phi_k = logits.sub_(new_max).exp_()
            if real is not None:
                phi_k = phi_k * real.to(phi_k.dtype)
            part_kv = torch.matmul(phi_k.transpose(-1, -2), v[:, :, s : s + chunk])  # (B, H, M, Dh)
            part_z = phi_k.sum(dim=2, keepdim=True)  # (B, H, 1, M)
            if kv is None:
                kv, z = part_kv, part_z
            else:
                decay = torch.exp(run_max - new_max)
                kv, z = kv * decay + part_kv, z * decay + part_z
            run_max = new_max
        outs = []
        for s in range(0, n, chunk):
            phi_q = self._features(q[:, :, s : s + chunk], True, None)  # (B, H, c, M)
            o = torch.matmul(phi_q, kv) / (phi_q * z).sum(-1, keepdim=True).clamp_min(KERNEL_EPS)  # (B, H, c, Dh)
            outs.append(o.transpose(1, 2))
        # Assembled as (B, N, H, Dh) so merge_heads needs no copy.
        return torch.cat(outs, dim=1).transpose(1, 2)

    def attend(self, q, k, v, mask):
        redraw = self.params["redraw"]
        if self.training and redraw > 0:
            if int(self.steps_since_redraw) >= redraw:
                self.redraw_features()
                self.steps_since_redraw.zero_()
            self.steps_since_redraw += 1
        if not self.causal and not exporting():  # a loop over chunks of a symbolic length cannot be traced
            return self._encoder_chunked(q, k, v, mask)
        phi_q = self._features(q, True, mask)
        if self.causal:
            phi_k, s = self._causal_key_features(k, mask)
            return kernel_attention(phi_q, phi_k, v, causal=True, chunk=self.params["chunk_size"], key_logscale=s)
        phi_k = self._features(k, False, mask)  # zero at padded keys already
        return kernel_attention(phi_q, phi_k, v, causal=False)
