"""Longformer (Beltagy et al.): sliding-window attention, optionally dilated, plus a few
global tokens with their own projections.

The band is computed block-wise (``_blocks.band_attention``): the sequence is cut into blocks of
about half the window, each query block attends its neighbouring blocks through the fused
kernel and a band mask keeps the exact window, so no N x N tensor is ever built.
``etc`` reuses ``band_attention`` for its local-local piece.
"""

from __future__ import annotations

import torch
from torch import nn

from xsearch.attention._base import Attention, AttentionSpec, pad_to_multiple, positive_int, sdpa, slice_linear
from xsearch.attention._blocks import band_attention
from xsearch.attention._decode import kv_ring, kv_ring_write, lengths_of
from xsearch.attention._registry import register
from xsearch.errors import XSearchError


def _to_residues(t: torch.Tensor, d: int) -> torch.Tensor:
    """``(B, H, N, Dh)`` -> ``(B*d, H, M, Dh)``, ``M = ceil(N/d)``: residue class ``r`` holds
    positions ``r, r+d, ...``; rows stay contiguous in the ``(B*d, M, H, Dh)`` layout."""
    b, h, _, dh = t.shape
    rows = pad_to_multiple(t.transpose(1, 2), d, dim=1)  # (B, Np, H, Dh)
    m = rows.shape[1] // d
    return rows.reshape(b, m, d, h, dh).transpose(1, 2).reshape(b * d, m, h, dh).transpose(1, 2)


def _real_to_residues(real: torch.Tensor, d: int) -> torch.Tensor:
    """Bool ``(B, N)`` -> ``(B*d, M)``; the padding to a multiple of ``d`` is False."""
    b = real.shape[0]
    real = pad_to_multiple(real, d, dim=1)
    return real.reshape(b, real.shape[1] // d, d).transpose(1, 2).reshape(b * d, -1)


def _from_residues(t: torch.Tensor, d: int, n: int) -> torch.Tensor:
    """Inverse of ``_to_residues``, cut back to ``n`` positions: ``(B*d, H, M, Dh)`` -> ``(B, H, N, Dh)``."""
    bd, h, m, dh = t.shape
    rows = t.transpose(1, 2).reshape(bd // d, d, m, h, dh).transpose(1, 2)  # (B, M, d, H, Dh)
    return rows.reshape(bd // d, m * d, h, dh)[:, :n].transpose(1, 2)


@register(
    AttentionSpec(
        name="longformer",
        paper="Longformer: The Long-Document Transformer",
        family=("FP", "M"),
        complexity="O(N·(w + g))",
        causal=True,
        params={"window": 512, "dilation": 1, "n_global": 1},
        small_params={"window": 8, "n_global": 2},
    )
)
class LongformerAttention(Attention):
    """Sliding-window attention with ``dilation`` and ``n_global`` global tokens.

    Window: ``window`` is the total span ``w`` of the paper. Without ``causal`` query ``i``
    attends keys ``j = i + dilation·m`` for ``|m| <= window // 2`` (``w/2`` on each side);
    with ``causal`` it attends ``j = i - dilation·m`` for ``0 <= m <= window``, the previous
    ``window`` (dilated) positions. Either way a query sees ``window + 1`` keys when
    ``window`` is even. Dilation splits the sequence into ``dilation`` interleaved residue
    classes and runs the plain window on each, so its cost does not grow with the dilation.
    The paper varies the dilation across heads and layers; here one value applies to every
    head of the layer.

    Global attention (encoder only): the first ``n_global`` positions (e.g. a CLS token) are
    global. They attend every real token and every token attends them, symmetric as in the
    paper. Following the reference implementation, the global rows use their own projections
    ``q_global``, ``k_global``, ``v_global`` (over all keys), while a local query reads the
    global keys through the local ``k_proj``/``v_proj`` in the same softmax as its window;
    global positions are removed from the windows so no key counts twice. Global tokens are
    positions, not content: with left padding they are padding and simply masked.

    With ``causal=True`` global attention is switched off (``n_global`` is forced to 0 and
    the global projections are not created): a global token would see the future.

    Decoding state: a ring buffer of the last ``window * dilation + 1`` keys and values (every
    position a later query can still reach), ``key`` and ``value`` ``(B, H, R, Dh)``, constant in
    the context length; a step gathers the ``window + 1`` keys of its dilated window from it. A causal
    layer has no global tokens, so there are no global keys to keep.
    """

    state_names = ("key", "value")

    def check_params(self, window, dilation, n_global):
        positive_int("longformer", "window", window)
        positive_int("longformer", "dilation", dilation)
        if n_global < 0:
            raise XSearchError(f"attention 'longformer': parameter 'n_global' must be >= 0, got {n_global}")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.causal:
            self.params["n_global"] = 0
        self.n_global = self.params["n_global"]
        if self.n_global:
            inner = self.n_heads * self.head_dim
            self.q_global = nn.Linear(self.d_model, inner)
            self.k_global = nn.Linear(self.d_model, inner)
            self.v_global = nn.Linear(self.d_model, inner)

    @property
    def ring_size(self) -> int:
        """Slots of the decoding ring: the span from the farthest key a query sees to itself."""
        return self.params["window"] * self.params["dilation"] + 1

    def prefill(self, x, mask=None):
        mask = self.check_decoding(x, mask)  # causal: no global tokens, forward is the window alone
        q, k, v = self.project_qkv(x)  # (B, H, N, Dh)
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask
        y = self.finish(self._window(q, k, v, real, None, None, None, self.dropout_p if self.training else 0.0), mask)
        length = lengths_of(x, mask)
        ring = self.ring_size
        state = kv_ring(k, v, length, ring)
        return y, {"length": length, **state}

    def step(self, x_t, state):
        length = self.check_step(x_t, state)
        w, dil = self.params["window"], self.params["dilation"]
        q, k, v = self.project_qkv(x_t[:, None])  # (B, H, 1, Dh)
        key, value = kv_ring_write(state, k, v, length)  # (B, H, R, Dh)
        b, h, r, dh = key.shape
        pos = length[:, None] - dil * torch.arange(w + 1, device=length.device)[None, :]  # (B, w+1): the window
        idx = torch.remainder(pos, r)[:, None, :, None].expand(b, h, w + 1, dh)  # their ring slots
        kw, vw = torch.gather(key, 2, idx), torch.gather(value, 2, idx)  # (B, H, w+1, Dh)
        out = sdpa(q, kw, vw, (pos >= 0)[:, None, None, :])  # (B, H, 1, Dh)
        return self.finish(out, None)[:, 0], {"length": length + 1, "key": key, "value": value}

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = self.check_input(x, mask)
        b, n, _ = x.shape
        p = self.dropout_p if self.training else 0.0
        q, k, v = self.project_qkv(x)  # (B, H, N, Dh) each
        real = torch.ones(b, n, dtype=torch.bool, device=x.device) if mask is None else mask  # (B, N)
        g = self.n_global
        pos = torch.arange(n, device=x.device)
        if not g:
            out = self._window(q, k, v, real, None, None, None, p)
            return self.finish(out, mask)

        in_window = real & (pos >= g)[None, :]  # global keys are read through the extra columns only
        # (B, H, G, Dh) with G = min(n_global, N): what every local query reads from the globals
        local = self._window(q, k, v, in_window, k[:, :, :g], v[:, :, :g], real[:, :g], p)
        qg = self.split_heads(self.q_global(x[:, :g]))  # (B, H, G, Dh)
        kg = self.split_heads(self.k_global(x))  # (B, H, N, Dh)
        vg = self.split_heads(self.v_global(x))
        # A padded global query may see itself, so its row is never fully masked.
        allowed = real[:, None, None, :] | (pos[None, :] == pos[:g, None])[None, None]  # (B, 1, G, N)
        glob = sdpa(qg, kg, vg, allowed, dropout_p=p)  # (B, H, G, Dh)
        out = torch.cat([glob, local[:, :, g:]], dim=2)  # (B, H, N, Dh)
        return self.finish(out, mask)

    def _window(self, q, k, v, real, extra_k, extra_v, extra_real, dropout_p) -> torch.Tensor:
        """The (dilated) band plus the extra global columns, ``(B, H, N, Dh)``."""
        w, dil = self.params["window"], self.params["dilation"]
        back, ahead = (w, 0) if self.causal else (w // 2, w // 2)
        if dil == 1:
            return band_attention(
                q, k, v, real, back=back, ahead=ahead, extra_k=extra_k, extra_v=extra_v, extra_real=extra_real,
                dropout_p=dropout_p,
            )  # fmt: skip
        n = q.shape[2]
        # Residue classes of the positions mod `dilation` become extra batch entries: (B*d, H, M, Dh).
        qr, kr, vr = (_to_residues(t, dil) for t in (q, k, v))
        rr = _real_to_residues(real, dil)  # (B*d, M)
        if extra_k is not None:
            extra_k, extra_v, extra_real = (t.repeat_interleave(dil, dim=0) for t in (extra_k, extra_v, extra_real))
        out = band_attention(
            qr, kr, vr, rr, back=back, ahead=ahead, extra_k=extra_k, extra_v=extra_v, extra_real=extra_real,
            dropout_p=dropout_p,
        )  # fmt: skip
        return _from_residues(out, dil, n)

    def attention_pattern(self, n: int) -> torch.Tensor:
        """Bool ``(n, n)``: whether query ``i`` may attend key ``j`` (before padding), built densely.

        For tests and inspection only; the forward pass never builds it.
        """
        w, dil, g = self.params["window"], self.params["dilation"], self.n_global
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        rel = i - j
        band = ((rel >= 0) & (rel <= w * dil)) if self.causal else (rel.abs() <= (w // 2) * dil)
        band &= rel.remainder(dil) == 0
        return band | (i < g) | (j < g)

    def prune_head_params(self, keep, rows):
        if getattr(self, "q_global", None) is not None:
            self.q_global = slice_linear(self.q_global, out_idx=rows)
            self.k_global = slice_linear(self.k_global, out_idx=rows)
            self.v_global = slice_linear(self.v_global, out_idx=rows)
