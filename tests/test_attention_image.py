"""Image Transformer local 2-D attention: equals full attention when one block covers the grid,
and matches a dense mask built from grid coordinates otherwise."""

import math

import pytest
import torch

from tests.conftest import D_MODEL, N_HEADS, padded_both_ends, small_attention


def masked_reference(m, x, mask, allowed):
    """Softmax attention with m's projections and an explicit (N, N) pattern."""
    b, n, _ = x.shape
    h, dh = N_HEADS, D_MODEL // N_HEADS

    def heads(t):
        return t.view(b, n, h, dh).transpose(1, 2)

    q, k, v = heads(m.q_proj(x)), heads(m.k_proj(x)), heads(m.v_proj(x))
    scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
    ok = allowed[None, None] & mask[:, None, None, :]
    att = scores.masked_fill(~ok, float("-inf")).softmax(-1)
    return m.out_proj((att @ v).transpose(1, 2).reshape(b, n, h * dh))


def local2d_pattern(n, width, bh, bw, mem, causal):
    i = torch.arange(n)
    r, c = i // width, i % width
    top = (r // bh) * bh - mem  # memory block rows [top, bottom), cols [left, right)
    bottom = (r // bh) * bh + bh + (0 if causal else mem)
    left = (c // bw) * bw - mem
    right = (c // bw) * bw + bw + mem
    allowed = (
        (r[None, :] >= top[:, None])
        & (r[None, :] < bottom[:, None])
        & (c[None, :] >= left[:, None])
        & (c[None, :] < right[:, None])
    )
    if causal:
        allowed = allowed & (i[None, :] <= i[:, None])
    return allowed


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n,width", [(37, 8), (37, 6), (20, 20)])
def test_one_block_covering_the_grid_equals_full(causal, n, width):
    rows = math.ceil(n / width)
    m = small_attention("image", causal=causal, width=width, block_h=rows, block_w=width, memory=0).eval()
    full = small_attention("full", causal=causal).eval()
    full.load_state_dict(m.state_dict())
    x, mask = padded_both_ends(n)
    torch.testing.assert_close(m(x, mask), full(x, mask), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("width,bh,bw,mem", [(8, 2, 4, 1), (7, 3, 2, 2), (10, 1, 3, 0), (5, 2, 5, 3)])
def test_matches_dense_local2d_pattern(causal, width, bh, bw, mem):
    n = 37
    m = small_attention("image", causal=causal, width=width, block_h=bh, block_w=bw, memory=mem).eval()
    x, mask = padded_both_ends(n)
    with torch.no_grad():
        ref = masked_reference(m, x, mask, local2d_pattern(n, width, bh, bw, mem, causal))
        y = m(x, mask)
    torch.testing.assert_close(y[mask], ref[mask], atol=1e-5, rtol=1e-4)


def test_causal_memory_reaches_rows_above_to_the_right():
    """The decoder's memory block extends right of the query block in the rows above."""
    m = small_attention("image", causal=True, width=8, block_h=2, block_w=4, memory=2).eval()
    x = torch.randn(1, 32, D_MODEL, requires_grad=True)
    # query (row 2, col 3): block rows 2-3, cols 0-3; memory rows 0-3, cols -2..5
    m(x)[0, 2 * 8 + 3].sum().backward()
    g = x.grad[0].abs().sum(-1).view(4, 8) > 0
    assert g[1, 5] and g[0, 4]  # above-right, inside the flange
    assert not g[1, 6] and not g[2, 4]  # outside the flange / later in raster order


def test_bad_params():
    for key in ("width", "block_h", "block_w"):
        with pytest.raises(ValueError, match=key):
            small_attention("image", **{key: 0})
    with pytest.raises(ValueError, match="memory"):
        small_attention("image", memory=-1)
