"""Transformer-XL (Dai et al.): segment-level recurrence with relative positional encoding.

The sequence is cut into segments of ``segment_len``; every segment attends itself plus a
memory of the ``mem_len`` layer-input states that precede it, with the gradient stopped at
the memory. Because the memory of a segment is a function of earlier inputs only, all
segments are computed at once (no Python loop with carried state).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from xsearch.attention._base import (
    Attention,
    AttentionSpec,
    pad_to_multiple,
    positive_int,
    sdpa,
    slice_linear,
    slice_param,
)
from xsearch.attention._blocks import real_tokens
from xsearch.attention._decode import kv_ring_write, lengths_of, ring_from_prefix, ring_positions
from xsearch.attention._registry import register
from xsearch.errors import XSearchError


def sinusoid(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Transformer-XL's sinusoidal embedding ``[sin(p·ω), cos(p·ω)]``, ``ω_f = 10000^(-2f/dim)``.

    Args:
        positions: ``(P,)`` (relative) positions, any sign.
        dim: embedding width (even).

    Returns:
        ``(P, dim)``.
    """
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim))
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (P, dim/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def _valid_index(idx: torch.Tensor, offset: int | torch.SymInt) -> torch.Tensor:
    """Shift non-negative indices by ``offset``; keep negative ones (slots before the sequence) at -1."""
    return torch.where(idx >= 0, idx + offset, torch.full_like(idx, -1))


@register(
    AttentionSpec(
        name="xl",
        paper="Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context",
        family=("RC",),
        complexity="O(N·(L+M))",
        causal=True,
        params={"segment_len": 128, "mem_len": 128},
        small_params={"segment_len": 8, "mem_len": 8},
    )
)
class XLAttention(Attention):
    """Segment-level recurrence: segment ``s`` (positions ``[sL, sL+L)``) attends the ``mem_len``
    states ``[sL-M, sL)`` before it (the layer inputs of earlier segments, ``.detach()``-ed and
    projected with ``k_proj``/``v_proj``, as in the paper) and itself (causally in decoder mode,
    bidirectionally otherwise).

    Scores use the paper's relative positional encoding,
    ``(q_i + u)·k_j + (q_i + v)·r_{i-j}``, scaled by ``1/sqrt(head_dim)``, where
    ``r_d = r_proj(R_d)``, ``R_d`` the sinusoidal embedding (width ``d_model``, rounded up
    to even) of the distance ``d = i - j``, and ``u``, ``v`` (``u_bias``, ``v_bias``) learned
    per head. ``r_proj`` has no bias: a bias would add a per-query constant that the softmax
    cancels (and it would never get a gradient). The positional term is passed to the fused
    kernel as an additive per-head mask, so nothing N x N is formed: per segment the keys are
    ``mem_len + segment_len``.

    Since the memory is a fixed window of earlier inputs, all segments are computed in one
    pass; the result equals the paper's segment-by-segment recurrence for one layer (the
    memory of layer ``l`` is the input of layer ``l`` over earlier segments). Under
    ``torch.no_grad``/inference mode the detached and live projections are identical, so the
    keys are projected once. Subclasses may prepend further (older) memory slots through
    ``older_memory``; relative distances then count one position per slot.

    Decoding state: a ring buffer of the keys and values of the last ``mem_len + segment_len``
    positions, ``key`` and ``value`` ``(B, H, M + L, Dh)``, constant in the context length N (a
    query sees its segment so far and the ``mem_len`` positions before the segment). A step
    scores the new query against the ring with the relative term for each slot's distance.
    """

    state_names = ("key", "value")

    def check_params(self, segment_len: int, mem_len: int, **_: Any) -> None:
        name = self.spec.name
        positive_int(name, "segment_len", segment_len)
        if mem_len < 0:
            raise XSearchError(f"attention {name!r}: parameter 'mem_len' must be >= 0, got {mem_len}")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        inner = self.n_heads * self.head_dim
        self.pos_dim = 2 * ((self.d_model + 1) // 2)
        self.r_proj = nn.Linear(self.pos_dim, inner, bias=False)
        self.u_bias = nn.Parameter(torch.randn(self.n_heads, self.head_dim) * 0.02)
        self.v_bias = nn.Parameter(torch.randn(self.n_heads, self.head_dim) * 0.02)

    def older_memory(
        self, x: torch.Tensor, real: torch.Tensor, n_segments: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Extra memory slots placed before the ``mem_len`` memory of every segment.

        Args:
            x: ``(B, N, D)`` layer input; real: ``(B, Np)`` float real-token flags (padded to
                a whole number of segments); n_segments: S.

        Returns:
            None, or a source of slots: keys and values ``(B, T, H, Dh)``, their real flags
            ``(B, T)``, and ``(S, P)`` indices of each segment's slots in it (-1 = none).
        """
        return None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self._run(x, self.check_input(x, mask))[0]

    def _run(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """The forward pass; also returns the keys and values ``(B, Np, H, Dh)`` and the
        ``older_memory`` source (or None), which ``prefill`` keeps in its state."""
        b, n, _ = x.shape
        seg, mem = self.params["segment_len"], self.params["mem_len"]
        h, dh = self.n_heads, self.head_dim
        dev = x.device
        # Heads stay in the (B, N, H, Dh) layout: windows are gathered along N without copies
        # of head-major tensors, and the kernel takes the transposed views as they are.
        q = pad_to_multiple(self.q_proj(x).view(b, n, h, dh), seg, dim=1)  # (B, Np, H, Dh)
        k = pad_to_multiple(self.k_proj(x).view(b, n, h, dh), seg, dim=1)
        v = pad_to_multiple(self.v_proj(x).view(b, n, h, dh), seg, dim=1)
        real = real_tokens(mask, b, n, seg, dev)  # (B, Np)
        s = real.shape[1] // seg
        seg_start = torch.arange(s, device=dev)[:, None] * seg  # (S, 1)
        cur_idx = seg_start + torch.arange(seg, device=dev)  # (S, L): the segment itself

        # Sources of key slots (keys, values, real flags, per-segment indices), in window order.
        sources = []
        extra = self.older_memory(x, real, s)
        if extra is not None:
            sources.append(extra)
        if mem > 0:
            # Memory of segment s: positions [sL - M, sL); negative ones are masked.
            mem_idx = seg_start - mem + torch.arange(mem, device=dev)  # (S, M)
            if torch.is_grad_enabled() and x.requires_grad:
                # The memory is stop-gradient (SG(h) in the paper): project a detached copy.
                xd = x.detach()
                k_old = pad_to_multiple(self.k_proj(xd).view(b, n, h, dh), seg, dim=1)
                v_old = pad_to_multiple(self.v_proj(xd).view(b, n, h, dh), seg, dim=1)
                sources += [(k_old, v_old, real, mem_idx), (k, v, real, cur_idx)]
            else:  # no gradient: the detached projection is the same tensor
                sources.append((k, v, real, torch.cat([mem_idx, cur_idx], dim=1)))
        else:
            sources.append((k, v, real, cur_idx))
        if len(sources) == 1:
            k_src, v_src, real_src, idx = sources[0]
        else:
            idxs, total = [], 0
            for src in sources:
                idxs.append(_valid_index(src[3], total))
                total = total + src[0].shape[1]
            k_src = torch.cat([src[0] for src in sources], dim=1)  # (B, T, H, Dh)
            v_src = torch.cat([src[1] for src in sources], dim=1)
            real_src = torch.cat([src[2] for src in sources], dim=1)  # (B, T)
            idx = torch.cat(idxs, dim=1)  # (S, W)
        w = idx.shape[1]
        safe = idx.clamp(min=0)
        kw = k_src[:, safe].reshape(b * s, w, h, dh).transpose(1, 2)  # (B*S, H, W, Dh)
        vw = v_src[:, safe].reshape(b * s, w, h, dh).transpose(1, 2)
        rw = real_src[:, safe] * (idx >= 0).to(real_src.dtype)  # (B, S, W)

        # Positions inside the window: keys 0..W-1, queries W-L..W-1 (the segment itself).
        kpos = torch.arange(w, device=dev)
        qpos = kpos[w - seg :]
        allowed = (rw > 0.5)[:, :, None, :]  # (B, S, 1, W)
        if self.causal:
            allowed = allowed & (kpos[None, :] <= qpos[:, None])  # (B, S, L, W)
        # A padded query may see itself, so no row is fully masked (real rows unchanged).
        allowed = (allowed | (kpos[None, :] == qpos[:, None])).reshape(b * s, 1, seg, w)

        # Relative term (q_i + v)·r_{i-j}: scores against a table of decreasing distances
        # (W-1 down to dmin), then the paper's "relative shift" (a flat view with one element
        # less per row) turns row i's table entries into the W distances i - j. In causal mode
        # the table stops at -1 and entries for j > i read the next row's values; they are masked.
        dmin = -1 if self.causal else -(seg - 1)
        dists = torch.arange(w - 1, dmin - 1, -1, device=dev)  # (R,), R = W - dmin >= W + 1
        nr = w - dmin
        r = self.r_proj(sinusoid(dists, self.pos_dim).to(x.dtype)) * self.scale  # (R, H*Dh)
        r = r.view(nr, h, dh).permute(1, 2, 0)  # (H, Dh, R)
        qv = (q + self.v_bias).reshape(b * s * seg, h, dh).transpose(0, 1)  # (H, B*Np, Dh)
        bd = torch.bmm(qv, r).view(h, b * s, seg * nr)  # (H, B*S, L*R)
        bd = bd[:, :, seg - 1 : seg - 1 + seg * (nr - 1)].reshape(h, b * s, seg, nr - 1)[..., :w]  # (H, B*S, L, W)
        # The masked table is the kernel's additive mask. Not masked in place: an exported graph
        # writes an in-place change to a view back into its base (slice_scatter: transposes and a
        # scatter over the whole table), which made onnxruntime 3x slower than torch.
        bias = bd.transpose(0, 1).masked_fill(~allowed, float("-inf"))  # (B*S, H, L, W)

        qu = (q + self.u_bias).reshape(b * s, seg, h, dh).transpose(1, 2)  # (B*S, H, L, Dh)
        out = sdpa(
            qu, kw, vw, bias, dropout_p=self.dropout_p if self.training else 0.0, scale=self.scale
        )  # (B*S, H, L, Dh)
        out = out.transpose(1, 2).reshape(b, s * seg, h, dh)[:, :n].transpose(1, 2)  # (B, H, N, Dh)
        return self.finish(out, mask), k, v, extra

    # -- decoding ------------------------------------------------------------------------------
    @property
    def ring_size(self) -> int:
        """Slots of the decoding ring: the memory and a whole segment."""
        return self.params["mem_len"] + self.params["segment_len"]

    @property
    def n_distances(self) -> int:
        """Relative distances a decoding query can meet: 0 .. n_distances - 1 (the window width)."""
        return self.ring_size

    def prefill(self, x, mask=None):
        mask = self.check_decoding(x, mask)
        y, k, v, _ = self._run(x, mask)
        length = lengths_of(x, mask)
        return y, {"length": length, **self._ring_state(k, v, length)}

    def step(self, x_t, state):
        length = self.check_step(x_t, state)
        q, key, value, dist, seen = self._ring_step(x_t, state, length)
        out = self._attend_one(q, key, value, dist, seen)  # (B, H, 1, Dh)
        return self.finish(out, None)[:, 0], {"length": length + 1, "key": key, "value": value}

    def _ring_state(self, k: torch.Tensor, v: torch.Tensor, length: torch.Tensor) -> dict[str, torch.Tensor]:
        """The key/value ring after the prompt, from ``_run``'s ``(B, Np, H, Dh)`` keys and values."""
        ring = self.ring_size
        return {
            "key": ring_from_prefix(k.transpose(1, 2), length, ring, dim=2),  # (B, H, R, Dh)
            "value": ring_from_prefix(v.transpose(1, 2), length, ring, dim=2),
        }

    def _ring_step(self, x_t: torch.Tensor, state, length: torch.Tensor):
        """Project the new token (position ``length``) and write it into the ring.

        Returns:
            ``q: (B, H, 1, Dh)``, the updated ``key`` and ``value`` ``(B, H, R, Dh)``, each slot's
            distance to the query ``long (B, R)`` and whether the query sees it, bool ``(B, R)``.
        """
        seg, mem = self.params["segment_len"], self.params["mem_len"]
        q, k, v = self.project_qkv(x_t[:, None])  # (B, H, 1, Dh)
        key, value = kv_ring_write(state, k, v, length)  # (B, H, R, Dh)
        pos = ring_positions(length, key.shape[2])  # (B, R): the position each slot holds
        first = length - torch.remainder(length, seg) - mem  # the segment's start less the memory
        seen = (pos >= first[:, None]) & (pos >= 0)
        return q, key, value, length[:, None] - pos, seen

    def _attend_one(self, q, key, value, dist, seen) -> torch.Tensor:
        """One query ``(B, H, 1, Dh)`` over slots ``(B, H, S, Dh)`` at distances ``long (B, S)``
        (seen where ``seen``, bool ``(B, S)``), with the scores of ``forward``; returns ``(B, H, 1, Dh)``."""
        h, dh = self.n_heads, self.head_dim
        nd = self.n_distances
        # (q + v)·r_d = ((q + v) W_r)·R_d: fold r_proj into the query (O(D²)) instead of projecting
        # the table of every distance (O(W·D²)) each step.
        w_r = self.r_proj.weight.view(h, dh, self.pos_dim)  # (H, Dh, P)
        qr = torch.einsum("bhd,hdp->bhp", (q[:, :, 0] + self.v_bias) * self.scale, w_r)  # (B, H, P)
        table = sinusoid(torch.arange(nd, device=q.device), self.pos_dim).to(q.dtype)  # (nd, P)
        bd = torch.matmul(qr, table.t())  # (B, H, nd): the term for every distance
        idx = dist.clamp(0, nd - 1)[:, None, :].expand(-1, h, -1)  # (B, H, S)
        bias = torch.gather(bd, 2, idx).masked_fill(~seen[:, None, :], float("-inf"))  # (B, H, S)
        qu = q + self.u_bias[:, None, :]  # (B, H, 1, Dh)
        return sdpa(qu, key, value, bias[:, :, None, :], scale=self.scale)

    def prune_head_params(self, keep, rows):
        self.r_proj = slice_linear(self.r_proj, out_idx=rows)
        self.u_bias = slice_param(self.u_bias, keep)
        self.v_bias = slice_param(self.v_bias, keep)
