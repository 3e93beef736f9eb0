"""Compressive Transformer (Rae et al.): Transformer-XL plus a compressed memory of older states."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from xsearch.attention._base import AttentionSpec, pad_to_multiple, positive_int
from xsearch.attention._registry import register
from xsearch.attention.xl import XLAttention
from xsearch.errors import XSearchError

COMPRESS_FNS = ("conv", "mean")


@register(
    AttentionSpec(
        name="compressive",
        paper="Compressive Transformers for Long-Range Sequence Modelling",
        family=("RC",),
        complexity="O(N·(L+M+C))",
        causal=True,
        params={"segment_len": 128, "mem_len": 64, "cmem_len": 64, "compression": 4, "compress_fn": "conv"},
        small_params={"segment_len": 8, "mem_len": 8, "cmem_len": 4, "compression": 2},
    )
)
class CompressiveAttention(XLAttention):
    """``xl`` whose segments also attend ``cmem_len`` compressed memories of the states older
    than their ``mem_len`` memory.

    The layer-input states are compressed by ``compression`` (c) with a strided
    ``Conv1d(d_model, d_model, kernel=c, stride=c)`` (``compress_fn="conv"``, the paper's best)
    or by the mean over the real states of each group (``"mean"``), on a grid aligned with
    the segments, so slot ``t`` summarises positions ``[tc, (t+1)c)``; this is what the paper's
    FIFO produces when every segment evicts its ``segment_len`` oldest memories. Segment ``s``
    sees the ``cmem_len`` slots right before its memory, ``[sL - M - cC, sL - M)``: all in its
    past. Compressed slots are projected with ``k_proj``/``v_proj`` and, as in common reference
    implementations, count as one position each in the relative distances
    (window = ``[cmem; mem; segment]``).

    Gradients: the states are detached (as the memory is), but the conv weights are not, so
    the compression is trained by the task loss through the attention output. The paper
    instead trains it with an auxiliary attention-reconstruction loss, which does not fit a
    ``(B, N, D) -> (B, N, D)`` module. Padded positions are zeroed before compressing and
    excluded from the mean; a slot with no real state is masked.
    ``segment_len`` and ``mem_len`` must be multiples of ``compression``. The defaults give
    the same key window as ``xl``'s (256 slots per segment) while reaching 64 + 4·64 = 320
    positions back instead of 128.
    """

    def check_params(
        self, segment_len: int, mem_len: int, cmem_len: int = 0, compression: int = 1, compress_fn: str = "conv"
    ) -> None:
        super().check_params(segment_len, mem_len)
        name = self.spec.name
        positive_int(name, "compression", compression)
        if cmem_len < 0:
            raise XSearchError(f"attention {name!r}: parameter 'cmem_len' must be >= 0, got {cmem_len}")
        if compress_fn not in COMPRESS_FNS:
            raise XSearchError(f"attention {name!r}: parameter 'compress_fn' must be one of {COMPRESS_FNS}")
        if segment_len % compression:
            raise XSearchError(
                f"attention {name!r}: parameter 'segment_len' ({segment_len}) must be a multiple of "
                f"'compression' ({compression})"
            )
        if mem_len % compression:
            raise XSearchError(
                f"attention {name!r}: parameter 'mem_len' ({mem_len}) must be a multiple of "
                f"'compression' ({compression})"
            )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        c = self.params["compression"]
        use_conv = self.params["compress_fn"] == "conv" and self.params["cmem_len"] > 0
        self.compress = nn.Conv1d(self.d_model, self.d_model, c, stride=c) if use_conv else None

    def older_memory(
        self, x: torch.Tensor, real: torch.Tensor, n_segments: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        cmem, c = self.params["cmem_len"], self.params["compression"]
        seg, mem = self.params["segment_len"], self.params["mem_len"]
        if cmem == 0:
            return None
        b, n, d = x.shape
        # Zero padded states so they never reach a slot; pad to whole segments (a multiple of c).
        xs = pad_to_multiple(x.detach() * real[:, :n, None].to(x.dtype), seg, dim=1)  # (B, Np, D)
        count = real.reshape(b, -1, c).sum(-1)  # (B, T): real states per group
        if self.compress is not None:
            # Conv1d with kernel == stride is a linear map of each group of c states, applied as
            # one matmul on (B, T, c*D) (faster than the convolution kernel, same result).
            w = self.compress.weight.permute(0, 2, 1).reshape(d, c * d)  # (D, c*D), input index = j*D + i
            cm = F.linear(xs.reshape(b, -1, c * d), w, self.compress.bias)  # (B, T, D)
        else:
            cm = xs.reshape(b, -1, c, d).sum(2) / count.clamp(min=1.0)[..., None].to(x.dtype)
        t = cm.shape[1]
        k = self.k_proj(cm).view(b, t, self.n_heads, self.head_dim)  # (B, T, H, Dh)
        v = self.v_proj(cm).view(b, t, self.n_heads, self.head_dim)
        # Slots of segment s: the cmem_len groups ending where its memory starts, (sL - M) / c.
        dev = x.device
        idx = torch.arange(n_segments, device=dev)[:, None] * (seg // c) - mem // c - cmem
        idx = idx + torch.arange(cmem, device=dev)  # (S, C)
        return k, v, (count > 0).to(real.dtype), idx
