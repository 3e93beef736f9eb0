"""Axial attention: reduces to full attention on a single row or a single column, matches a
dense two-hop reference, and in decoder mode sees the whole past and nothing else."""

import math

import pytest
import torch

from tests.conftest import D_MODEL, N_HEADS, padded_both_ends, small_attention

H, DH = N_HEADS, D_MODEL // N_HEADS


def _full_like(m, causal):
    full = small_attention("full", causal=causal).eval()
    full.load_state_dict(m.state_dict())
    return full


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 9, 37])
def test_single_row_equals_full(causal, n):
    """width >= N: one row; row attention is full attention and the column step (one key: the
    position itself) is the identity."""
    m = small_attention("axial", causal=causal, width=40).eval()
    x, mask = padded_both_ends(n)
    mask[:, 0] = True
    torch.testing.assert_close(m(x, mask), _full_like(m, causal)(x, mask), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_single_column_equals_full(causal):
    """width 1: row attention is the identity (o = v) and the column step is full attention."""
    m = small_attention("axial", causal=causal, width=1).eval()
    x, mask = padded_both_ends(37)
    torch.testing.assert_close(m(x, mask), _full_like(m, causal)(x, mask), atol=1e-5, rtol=1e-4)


def two_hop_reference(m, x, mask, width, causal):
    """Dense formula over grid coordinates: o(i) = Σ_{j in row(i)} a_ij v_j (row past only for
    o_past), out(i) = Σ_{j in col(i)} b_ij o_j with o = o_full for rows above, o_past for i itself."""
    b, n, _ = x.shape

    def heads(t):
        return t.view(b, n, H, DH).transpose(1, 2)

    q, k, v = heads(m.q_proj(x)), heads(m.k_proj(x)), heads(m.v_proj(x))
    scores = q @ k.transpose(-1, -2) / math.sqrt(DH)  # (B, H, N, N)
    i = torch.arange(n)
    r, c = i // width, i % width
    real = mask[:, None, None, :]
    eye = i[:, None] == i[None, :]

    def attend(pattern, values):
        ok = (pattern[None, None] & real) | eye
        return scores.masked_fill(~ok, float("-inf")).softmax(-1) @ values

    same_row = r[:, None] == r[None, :]
    same_col = c[:, None] == c[None, :]
    o_full = attend(same_row, v)
    if not causal:
        out = attend(same_col, o_full)
    else:
        o_past = attend(same_row & (i[None, :] <= i[:, None]), v)
        above = same_col & (r[None, :] < r[:, None])
        ok = torch.cat([(above[None, None] & real), eye.expand(b, 1, n, n)], dim=-1)
        s2 = torch.cat([scores, scores], dim=-1).masked_fill(~ok, float("-inf")).softmax(-1)
        out = s2 @ torch.cat([o_full, o_past], dim=2)
    return m.out_proj(out.transpose(1, 2).reshape(b, n, H * DH))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("width", [3, 8, 11])
def test_matches_two_hop_reference(causal, width):
    m = small_attention("axial", causal=causal, width=width).eval()
    x, mask = padded_both_ends(37)
    with torch.no_grad():
        y = m(x, mask)
        ref = two_hop_reference(m, x, mask, width, causal)
    torch.testing.assert_close(y[mask], ref[mask], atol=1e-5, rtol=1e-4)


def test_causal_receptive_field_is_the_whole_past():
    width, n = 6, 30
    m = small_attention("axial", causal=True, width=width).eval()
    x = torch.randn(1, n, D_MODEL, requires_grad=True)
    t = 3 * width + 2  # row 3, column 2
    m(x)[0, t].sum().backward()
    seen = x.grad[0].abs().sum(-1) > 0
    assert seen[: t + 1].all(), "every earlier position (incl. rows above, right of the column) is reachable"
    assert not seen[t + 1 :].any()


def test_bad_params():
    with pytest.raises(ValueError, match="width"):
        small_attention("axial", width=0)
