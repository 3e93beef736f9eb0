"""Axial attention (Ho et al.): attention along the rows, then along the columns, of the
sequence laid out as a grid of ``width`` columns in raster order.
"""

from __future__ import annotations

import torch

from xsearch.attention._base import Attention, AttentionSpec, pad_to_multiple, positive_int, sdpa
from xsearch.attention._blocks import real_tokens
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
    """

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
