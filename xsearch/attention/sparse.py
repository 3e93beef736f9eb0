"""Sparse Transformer (Child et al.), the fixed factorized pattern: every query attends its own
block and a set of strided summary positions that carry information across blocks.
"""

from __future__ import annotations

import torch

from xsearch.attention._base import Attention, AttentionSpec, pad_to_multiple, positive_int, sdpa
from xsearch.attention._blocks import blocked_sdpa, from_blocks, real_tokens, to_blocks
from xsearch.attention._decode import kv_ring, kv_ring_write, lengths_of, ring_positions
from xsearch.attention._registry import register


@register(
    AttentionSpec(
        name="sparse",
        paper="Generating Long Sequences with Sparse Transformers",
        family=("FP",),
        complexity="O(N·(b + N/s))",
        causal=True,
        params={"block_size": 128, "stride": 128},
        small_params={"block_size": 8, "stride": 4},
    )
)
class SparseAttention(Attention):
    """Fixed pattern: query i attends (1) every key of its block of ``block_size`` (earlier
    ones only in causal mode) and (2) the summary positions ``j ≡ stride-1 (mod stride)``
    outside its block (in causal mode: before its block). With ``stride == block_size`` this
    is the paper's fixed pattern with one summary cell per block; both heads of the
    factorisation are merged into one attention so each query normalises over the union.

    Decoding state: a ring buffer of the last ``block_size`` keys and values (the query's own block),
    ``key`` and ``value`` ``(B, H, block_size, Dh)``, and the summary keys and values,
    ``summary_key`` and ``summary_value`` ``(B, H, C, Dh)``, slot ``s`` holding position
    ``s·stride + stride - 1``. With ``max_len`` set, ``C = max(max_len // stride, 1)`` slots are
    allocated at once and the state keeps its shapes (O(block_size + max_len/stride), constant in
    the context length N); without it the summaries start at the prompt's ``N // stride`` and gain
    one slot a step (a step adds at most one summary), so they grow as N. A step attends the
    ``block_size + C`` slots, masked to its own block and the summaries before it.
    """

    state_names = ("key", "value", "summary_key", "summary_value")

    def check_params(self, block_size, stride):
        positive_int("sparse", "block_size", block_size)
        positive_int("sparse", "stride", stride)

    def _summaries(self, t: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """The summary slots of a prompt's ``t: (B, H, N, Dh)``: ``(B, H, C, Dh)``, zeros past each row's length."""
        st = self.params["stride"]
        if self.max_len is None:
            out = t[:, :, st - 1 :: st]  # (B, H, N // st, Dh)
            spos = torch.arange(out.shape[2], device=t.device) * st + (st - 1)
            held = spos[None, :] < length[:, None]  # (B, C)
        else:
            spos = torch.arange(max(self.max_len // st, 1), device=t.device) * st + (st - 1)  # (C,)
            held = spos[None, :] < length[:, None]  # (B, C)
            # Per-row indices within the row's tokens (so within N whatever N is): unheld slots read its last.
            idx = torch.minimum(spos[None, :], (length - 1).clamp(min=0)[:, None])  # (B, C)
            b, h, _, d = t.shape
            out = torch.gather(t, 2, idx[:, None, :, None].expand(b, h, idx.shape[1], d))
        return out * held[:, None, :, None].to(out.dtype)

    def _write_summary(self, buf: torch.Tensor, new: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """``buf: (B, H, C, Dh)`` with ``new: (B, H, Dh)`` (position ``length``) written at slot
        ``length // stride`` where that position is a summary; one slot grown first without ``max_len``."""
        st = self.params["stride"]
        if self.max_len is None:
            b, h, _, d = buf.shape
            buf = torch.cat([buf, buf.new_zeros(b, h, 1, d)], dim=2)  # (a prompt may have left it empty)
        slot = torch.div(length, st, rounding_mode="floor")
        is_summary = torch.remainder(length, st) == st - 1  # (B,)
        here = (torch.arange(buf.shape[2], device=buf.device)[None, :] == slot[:, None]) & is_summary[:, None]
        return torch.where(here[:, None, :, None], new.unsqueeze(2), buf)

    def prefill(self, x, mask=None):
        mask = self.check_decoding(x, mask)
        q, k, v = self.project_qkv(x)  # (B, H, N, Dh)
        y = self.finish(self.attend(q, k, v, mask), mask)
        length = lengths_of(x, mask)
        bs = self.params["block_size"]
        state = {
            **kv_ring(k, v, length, bs),
            "summary_key": self._summaries(k, length),
            "summary_value": self._summaries(v, length),
        }
        return y, {"length": length, **state}

    def step(self, x_t, state):
        length = self.check_step(x_t, state)
        bs, st = self.params["block_size"], self.params["stride"]
        q, k, v = self.project_qkv(x_t[:, None])  # (B, H, 1, Dh)
        key, value = kv_ring_write(state, k, v, length)  # (B, H, bs, Dh)
        skey = self._write_summary(state["summary_key"], k[:, :, 0], length)  # (B, H, C, Dh)
        svalue = self._write_summary(state["summary_value"], v[:, :, 0], length)
        first = length - torch.remainder(length, bs)  # the query's block start
        own = ring_positions(length, bs) >= first[:, None]  # (B, bs): earlier keys of its block, itself included
        spos = torch.arange(skey.shape[2], device=length.device) * st + (st - 1)
        summ = spos[None, :] < first[:, None]  # (B, C): summaries before its block (all written by now)
        allowed = torch.cat([own, summ], dim=1)[:, None, None, :]  # (B, 1, 1, bs + C)
        out = sdpa(q, torch.cat([key, skey], dim=2), torch.cat([value, svalue], dim=2), allowed)  # (B, H, 1, Dh)
        new = {"length": length + 1, "key": key, "value": value, "summary_key": skey, "summary_value": svalue}
        return self.finish(out, None)[:, 0], new

    def attend(self, q, k, v, mask):
        bs, st = self.params["block_size"], self.params["stride"]
        b, h, n, d = q.shape
        qb = to_blocks(q, bs)  # (B, nb, H, bs, Dh)
        nb = qb.shape[1]
        kp, vp = pad_to_multiple(k, bs, dim=2), pad_to_multiple(v, bs, dim=2)  # (B, H, Np, Dh)
        ks = kp[:, :, st - 1 :: st]  # (B, H, S, Dh): summary keys
        vs = vp[:, :, st - 1 :: st]
        s = ks.shape[2]
        kw = torch.cat([to_blocks(k, bs), ks[:, None].expand(b, nb, h, s, d)], dim=-2)  # (B, nb, H, bs+S, Dh)
        vw = torch.cat([to_blocks(v, bs), vs[:, None].expand(b, nb, h, s, d)], dim=-2)

        real = real_tokens(mask, b, n, bs, q.device)  # (B, Np)
        qpos = torch.arange(nb * bs, device=q.device).reshape(nb, bs)  # (nb, bs) == own-block key slots
        spos = torch.arange(s, device=q.device) * st + (st - 1)  # (S,)
        start = qpos[:, :1]  # (nb, 1)
        real_own = real.reshape(b, nb, 1, bs) > 0.5  # (B, nb, 1, bs)
        real_sum = (real[:, st - 1 :: st] > 0.5)[:, None, None, :]  # (B, 1, 1, S)
        if self.causal:
            own = real_own & (qpos[:, None, :] <= qpos[:, :, None])  # (B, nb, bs, bs)
            summ = real_sum & (spos[None, :] < start)[None, :, None, :]  # (B, nb, 1, S)
        else:
            own = real_own
            outside = (spos[None, :] < start) | (spos[None, :] >= start + bs)  # (nb, S)
            summ = real_sum & outside[None, :, None, :]
        if mask is not None:
            # A padded query may see itself, so its row is never fully masked (real rows unchanged).
            own = own | torch.eye(bs, dtype=torch.bool, device=q.device)
        rows = own.shape[2]  # bs when the pattern depends on the query, else 1
        allowed = torch.cat([own.expand(b, nb, rows, bs), summ.expand(b, nb, rows, s)], dim=-1)  # (B, nb, rows, bs+S)
        out = blocked_sdpa(qb, kw, vw, allowed, self.dropout_p if self.training else 0.0)
        return from_blocks(out, n)
