"""Compressive Transformer (Rae et al.): Transformer-XL plus a compressed memory of older states."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from xsearch.attention._base import AttentionSpec, pad_to_multiple, positive_int
from xsearch.attention._decode import lengths_of, ring_from_prefix, ring_positions, ring_write
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

    Decoding state, constant in the context length N: ``xl``'s ring of keys and values of the
    last ``mem_len + segment_len`` positions, ``key`` and ``value`` ``(B, H, M + L, Dh)``; the
    inputs of the group being compressed, ``group`` ``(B, c, D)`` (slot ``p mod c``); and a ring
    of the keys and values of the latest ``cmem_len + (mem_len + segment_len) / c`` compressed
    slots, ``ckey`` and ``cvalue`` ``(B, H, Rc, Dh)``: a slot is compressed (and projected) at the
    step that completes its group, while the memory and the segment still hold its positions,
    and becomes visible once a segment's memory starts after it. With ``cmem_len = 0`` the last
    three are empty.
    """

    state_names = ("key", "value", "group", "ckey", "cvalue")

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

    # -- decoding ------------------------------------------------------------------------------
    @property
    def cring_size(self) -> int:
        """Compressed slots of the decoding state: those a query sees, and the newer ones that
        are complete but still inside the memory or the segment (at most ``(M + L) / c``)."""
        cmem, c = self.params["cmem_len"], self.params["compression"]
        if cmem == 0:
            return 0
        return cmem + (self.params["mem_len"] + self.params["segment_len"]) // c

    @property
    def n_distances(self) -> int:
        return self.params["cmem_len"] + self.ring_size

    def prefill(self, x, mask=None):
        mask = self.check_decoding(x, mask)
        y, k, v, extra = self._run(x, mask)
        length = lengths_of(x, mask)
        state = {"length": length, **self._ring_state(k, v, length)}
        if extra is None:  # no compressed memory (cmem_len = 0): empty tensors
            b, h, dh = x.shape[0], self.n_heads, self.head_dim
            empty = x.new_zeros(b, h, 0, dh)
            return y, {**state, "group": x.new_zeros(b, 0, self.d_model), "ckey": empty, "cvalue": empty}
        c, ring = self.params["compression"], self.cring_size
        ck, cv, _, _ = extra  # (B, T, H, Dh): group t summarises positions [tc, (t+1)c)
        done = torch.div(length, c, rounding_mode="floor")  # complete groups (a partial one is still open)
        state["group"] = ring_from_prefix(x, length, c, dim=1)  # (B, c, D): the open group's inputs so far
        state["ckey"] = ring_from_prefix(ck.transpose(1, 2), done, ring, dim=2)  # (B, H, Rc, Dh)
        state["cvalue"] = ring_from_prefix(cv.transpose(1, 2), done, ring, dim=2)
        return y, state

    def step(self, x_t, state):
        length = self.check_step(x_t, state)
        q, key, value, dist, seen = self._ring_step(x_t, state, length)
        new = {"length": length + 1, "key": key, "value": value}
        if self.params["cmem_len"] == 0:
            out = self._attend_one(q, key, value, dist, seen)
            new.update(group=state["group"], ckey=state["ckey"], cvalue=state["cvalue"])
            return self.finish(out, None)[:, 0], new
        group, ckey, cvalue, cdist, cseen = self._compress_step(x_t, state, length)
        out = self._attend_one(
            q, torch.cat([ckey, key], dim=2), torch.cat([cvalue, value], dim=2),
            torch.cat([cdist, dist], dim=1), torch.cat([cseen, seen], dim=1),
        )  # fmt: skip
        new.update(group=group, ckey=ckey, cvalue=cvalue)
        return self.finish(out, None)[:, 0], new

    def _compress_step(self, x_t: torch.Tensor, state, length: torch.Tensor):
        """Add the new token (position ``length``) to its group; where that completes the group,
        compress it and write its key and value into the compressed ring.

        Returns:
            the updated ``group``, ``ckey`` and ``cvalue``, and for each compressed slot its
            distance to the query ``long (B, Rc)`` and whether the query sees it, bool ``(B, Rc)``.
        """
        cmem, c = self.params["cmem_len"], self.params["compression"]
        seg, mem = self.params["segment_len"], self.params["mem_len"]
        b, d = x_t.shape
        group = ring_write(state["group"], x_t, length, dim=1)  # (B, c, D), slot j = position tc + j
        # Compressed every step and kept only where the group is complete (no data-dependent branch).
        if self.compress is not None:
            w = self.compress.weight.permute(0, 2, 1).reshape(d, c * d)  # as in older_memory
            cm = F.linear(group.reshape(b, c * d), w, self.compress.bias)  # (B, D)
        else:  # a complete group has c real states
            cm = group.sum(1) / c
        kc = self.k_proj(cm).view(b, self.n_heads, self.head_dim)  # (B, H, Dh)
        vc = self.v_proj(cm).view(b, self.n_heads, self.head_dim)
        n_done = torch.div(length + 1, c, rounding_mode="floor")  # complete groups after this token
        complete = (torch.remainder(length + 1, c) == 0)[:, None, None, None]
        ckey = torch.where(complete, ring_write(state["ckey"], kc, n_done - 1, dim=2), state["ckey"])
        cvalue = torch.where(complete, ring_write(state["cvalue"], vc, n_done - 1, dim=2), state["cvalue"])
        held = ring_positions(n_done - 1, ckey.shape[2])  # (B, Rc): the group each slot holds
        # The query's segment sees groups [t0 - C, t0), t0 = (segment start - M) / c; window slot
        # j = g - t0 + C sits at distance C + M + i - j = M + i + t0 - g (i: index in the segment).
        i = torch.remainder(length, seg)
        t0 = torch.div(length - i - mem, c, rounding_mode="floor")
        seen = (held >= (t0 - cmem)[:, None]) & (held < t0[:, None]) & (held >= 0)
        dist = (mem + i + t0)[:, None] - held
        return group, ckey, cvalue, dist, seen
