"""Axial attention (Ho et al.): attention along the rows, then along the columns, of the
sequence laid out as a grid of ``width`` columns in raster order.
"""

from __future__ import annotations

import torch

from xsearch.attention._base import Attention, AttentionSpec, pad_to_multiple, positive_int, sdpa
from xsearch.attention._blocks import real_tokens
from xsearch.attention._decode import append_at, lengths_of, ring_from_prefix, ring_write, take_at
from xsearch.attention._registry import register


@register(
    AttentionSpec(
        name="axial",
        paper="Axial Attention in Multidimensional Transformers",
        family=("FP",),
        complexity="O(N·(w + N/w))",
        causal=True,
        params={"width": 64},
        small_params={"width": 8},
    )
)
class AxialAttention(Attention):
    """Row attention followed by column attention over the row outputs.

    The sequence is padded inside to whole rows of ``width``. Step 1, within each row:
    ``o = softmax(q kᵀ) v``. Step 2, within each column: ``out = softmax(q kᵀ) o`` with the same
    per-head queries and keys, and the row outputs as values, so one layer reaches the whole
    grid (two hops) with the usual four projections.

    Decoder mode follows the Axial Transformer's causal structure: rows above the query are
    entirely in the past, so they are summarised by UNMASKED row attention, while the query's
    own row uses MASKED row attention. The column step attends, in one softmax, the rows
    strictly above (values: their unmasked row outputs) and its own position (value: its
    masked row output). Every value therefore depends only on positions at or before the
    query, and the receptive field is the whole past (a position sees the rows above in
    full, including columns to its right). Both row attentions share one kernel call
    (queries stacked), and the column step's two value sets are keys stacked along the
    key axis, so all calls are fused 4-D ones with head-broadcast masks.

    Decoding state (position t at row ``t // w``, column ``t mod w``, with ``w = width``):
        * ``key`` ``(B, H, N, Dh)``, every key, and ``column`` ``(B, H, N, Dh)``, the unmasked row
          output of every position whose row is complete: what the column step reads (a column's
          rows above). Both grow by one slot a token; ``column`` is written w tokens late (at step
          t, position ``t - w``, whose row is then complete).
        * Rings of the last w positions (slot = column: the query's row so far, then the row
          above): ``row_query``, ``row_key``, ``row_value`` ``(B, H, w, Dh)`` and the running
          softmax of each position's row attention over its row's keys so far, ``row_out``
          ``(B, H, w, Dh)`` (normalised) and ``row_lse`` ``(B, H, w)`` (its log-sum-exp), to which
          each new key of the row is added.

        ``O(N)`` in all; a step costs ``O(w + N / w)``: the new key added to its row's w running
        outputs, the new query's masked row attention, and the column step over ``N / w`` rows.
    """

    state_names = ("key", "column", "row_query", "row_key", "row_value", "row_out", "row_lse")

    def prefill(self, x, mask=None):
        mask = self.check_decoding(x, mask)
        width = self.params["width"]
        b, n, _ = x.shape
        h, d = self.n_heads, self.head_dim
        q, k, v = self.project_qkv(x)  # (B, H, N, Dh)
        length = lengths_of(x, mask)
        # Each position's row attention over the real keys of its row: complete rows in full, the
        # last row up to the prompt's end (the running state a step continues).
        real = pad_to_multiple(real_tokens(mask, b, n, 1, x.device), width, dim=1) > 0.5  # (B, R*w)
        own = torch.eye(width, dtype=torch.bool, device=x.device)  # a padded query sees itself: no empty row
        allowed = real.view(b, 1, -1, 1, width) | own  # (B, 1, R, w, w)

        def grid(t: torch.Tensor) -> torch.Tensor:  # (B, H, N, Dh) -> (B, H, R, w, Dh)
            return pad_to_multiple(t, width, dim=2).view(b, h, -1, width, d)

        scores = torch.matmul(grid(q), grid(k).transpose(-2, -1)) * self.scale  # (B, H, R, w, w)
        scores = scores.masked_fill(~allowed, float("-inf"))
        lse = scores.logsumexp(-1)  # (B, H, R, w)
        out = torch.matmul((scores - lse[..., None]).exp(), grid(v))  # (B, H, R, w, Dh)
        out, lse = out.reshape(b, h, -1, d)[:, :, :n], lse.reshape(b, h, -1)[:, :, :n]  # (B, H, N, ·)
        if mask is not None:  # padded slots hold zeros (rewritten before they are read)
            k = k * mask[:, None, :, None].to(k.dtype)
        state = {"length": length, "key": k, "column": out}
        for name, t in (("row_query", q), ("row_key", k), ("row_value", v), ("row_out", out), ("row_lse", lse)):
            state[name] = ring_from_prefix(t, length, width, dim=2)
        return self.forward(x, mask), state

    def step(self, x_t, state):
        length = self.check_step(x_t, state)  # the new token's position t, per row
        width = self.params["width"]
        col = torch.remainder(length, width)  # (B,): t's column; its row r = (t - col) / w
        q, k, v = self.project_qkv(x_t[:, None])  # (B, H, 1, Dh)
        key = append_at(state["key"], k[:, :, 0], length, dim=2)  # (B, H, S + 1, Dh)
        # Ring slot col still holds position t - w, whose row is now complete: its row output is final.
        column = append_at(state["column"], take_at(state["row_out"], col, dim=2), length - width, dim=2)
        rq, rk, rv = (ring_write(state[name], t[:, :, 0], length, dim=2)  # (B, H, w, Dh)
                      for name, t in (("row_query", q), ("row_key", k), ("row_value", v)))  # fmt: skip
        slot = torch.arange(width, device=x_t.device)[None, None, :]  # (1, 1, w)
        earlier = slot < col[:, None, None]  # (B, 1, w): the row's positions before t

        # Row step. The new key joins the running softmax of the row's earlier positions ...
        s = torch.matmul(rq, k.transpose(-2, -1))[..., 0] * self.scale  # (B, H, w)
        lse_old = state["row_lse"]
        lse_new = torch.logaddexp(lse_old, s)
        out_new = state["row_out"] * (lse_old - lse_new).exp()[..., None] + (s - lse_new).exp()[..., None] * v
        # ... and the new query attends its row up to itself (masked row attention).
        scores = torch.matmul(q, rk.transpose(-2, -1))[:, :, 0] * self.scale  # (B, H, w)
        scores = scores.masked_fill(slot > col[:, None, None], float("-inf"))
        lse_t = scores.logsumexp(-1, keepdim=True)  # (B, H, 1)
        o_t = torch.matmul((scores - lse_t).exp()[:, :, None], rv)  # (B, H, 1, Dh)
        here = slot == col[:, None, None]
        row_out = torch.where(earlier[..., None], out_new, torch.where(here[..., None], o_t, state["row_out"]))
        row_lse = torch.where(earlier, lse_new, torch.where(here, lse_t, lse_old))

        # Column step: the rows above in t's column (their unmasked row outputs) and t itself (its
        # masked row output), in one softmax.
        kc, vc = self._column(key, col), self._column(column, col)  # (B, H, R', Dh)
        above = torch.arange(kc.shape[2], device=x_t.device)[None, :] * width < length[:, None] - col[:, None]
        allowed = torch.cat([above, above.new_ones(above.shape[0], 1)], dim=1)[:, None, None, :]  # (B, 1, 1, R' + 1)
        out = sdpa(q, torch.cat([kc, k], dim=2), torch.cat([vc, o_t], dim=2), allowed)  # (B, H, 1, Dh)
        state = {"length": length + 1, "key": key, "column": column, "row_query": rq, "row_key": rk,
                 "row_value": rv, "row_out": row_out, "row_lse": row_lse}  # fmt: skip
        return self.finish(out, None)[:, 0], state

    def _column(self, buf: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        """Slots ``col[i] + w·j`` of row i of ``buf`` ``(B, H, S, Dh)``: ``(B, H, ceil(S / w), Dh)``."""
        width = self.params["width"]
        b, h, _, d = buf.shape
        grid = pad_to_multiple(buf, width, dim=2).view(b, h, -1, width, d)  # (B, H, R', w, Dh)
        idx = col.view(b, 1, 1, 1, 1).expand(b, h, grid.shape[2], 1, d)
        return torch.gather(grid, 3, idx)[:, :, :, 0]

    def check_params(self, width: int) -> None:
        positive_int("axial", "width", width)

    def attend(self, q, k, v, mask):
        width = self.params["width"]
        b, h, n, d = q.shape
        p = self.dropout_p if self.training else 0.0

        def grid(t: torch.Tensor) -> torch.Tensor:  # (B, H, N, Dh) -> (B, H, R, W, Dh)
            return pad_to_multiple(t, width, dim=2).reshape(b, h, -1, width, d)

        qg, kg, vg = grid(q), grid(k), grid(v)
        r = qg.shape[2]
        real = pad_to_multiple(real_tokens(mask, b, n, 1, q.device), width, dim=1) > 0.5  # (B, R*W)
        real = real.reshape(b, r, width)  # (B, R, W)

        # -- step 1: rows as the batch, (B*R, H, W, Dh) ------------------------------------
        def rows(t: torch.Tensor) -> torch.Tensor:
            return t.permute(0, 2, 1, 3, 4).reshape(b * r, h, width, d)

        cw = torch.arange(width, device=q.device)
        own_w = cw[None, :] == cw[:, None]  # (W, W)
        key_ok = real.reshape(b * r, 1, 1, width)
        if self.causal:
            # Queries stacked twice: the first copy sees the whole row, the second only its past.
            past = cw[None, :] <= cw[:, None]
            pattern = torch.cat([torch.ones_like(past), past], dim=0)  # (2W, W)
            allowed = (key_ok & pattern) | torch.cat([own_w, own_w], dim=0)  # (B*R, 1, 2W, W)
            qr = rows(qg)
            o = sdpa(torch.cat([qr, qr], dim=2), rows(kg), rows(vg), allowed, dropout_p=p)  # (B*R, H, 2W, Dh)
            o_full, o_past = o[:, :, :width], o[:, :, width:]
        else:
            o_full = sdpa(rows(qg), rows(kg), rows(vg), key_ok | own_w, dropout_p=p)  # (B*R, H, W, Dh)

        # -- step 2: columns as the batch, (B*W, H, R, Dh) ---------------------------------
        def cols(t: torch.Tensor) -> torch.Tensor:  # from the grid (B, H, R, W, Dh)
            return t.permute(0, 3, 1, 2, 4).reshape(b * width, h, r, d)

        def cols_of_rows(t: torch.Tensor) -> torch.Tensor:  # from the row layout (B*R, H, W, Dh)
            return t.reshape(b, r, h, width, d).permute(0, 3, 2, 1, 4).reshape(b * width, h, r, d)

        cr = torch.arange(r, device=q.device)
        own_r = cr[None, :] == cr[:, None]  # (R, R)
        key_ok = real.transpose(1, 2).reshape(b * width, 1, 1, r)
        kc = cols(kg)
        if self.causal:
            above = key_ok & (cr[None, :] < cr[:, None])  # (B*W, 1, R, R): rows strictly above
            allowed = torch.cat([above, own_r.expand(b * width, 1, r, r)], dim=-1)  # (B*W, 1, R, 2R)
            values = torch.cat([cols_of_rows(o_full), cols_of_rows(o_past)], dim=2)  # (B*W, H, 2R, Dh)
            out = sdpa(cols(qg), torch.cat([kc, kc], dim=2), values, allowed, dropout_p=p)
        else:
            out = sdpa(cols(qg), kc, cols_of_rows(o_full), key_ok | own_r, dropout_p=p)  # (B*W, H, R, Dh)
        out = out.reshape(b, width, h, r, d).permute(0, 2, 3, 1, 4)  # (B, H, R, W, Dh)
        return out.reshape(b, h, r * width, d)[:, :, :n]
