"""BigBird: outputs depend exactly on the block pattern (window, globals, fixed random blocks)."""

import pytest
import torch

import xsearch
from tests.conftest import D_MODEL, MAX_LEN, input_dependence, small_attention

N = 37


def _reference(m, x, mask):
    """BigBird with a dense N x N mask built from ``attention_pattern``."""
    n = x.shape[1]
    q, k, v = (m.split_heads(p(x)) for p in (m.q_proj, m.k_proj, m.v_proj))
    allowed = (m.attention_pattern(n) & mask[:, None, None, :]) | torch.eye(n, dtype=torch.bool)
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    out = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
    return m.out_proj(m.merge_heads(out)) * mask[..., None]


def _expected_pattern(m, n):
    """The pattern from first principles, block by block."""
    bs, gb = m.params["block_size"], m.params["n_global_blocks"]
    nb = -(-n // bs)
    blocks = torch.zeros(nb, nb, dtype=torch.bool)
    for i in range(nb):
        for j in range(nb):
            blocks[i, j] = abs(i - j) <= 1 or i < gb or j < gb
        for j in m.random_blocks[i].tolist():
            if j < nb:
                blocks[i, j] = True
    blk = torch.arange(n) // bs
    return blocks[blk[:, None], blk[None, :]]


@pytest.mark.parametrize(
    "n,params",
    [
        (N, {}),
        (MAX_LEN, {}),
        (N, {"n_global_blocks": 0, "n_random_blocks": 3}),
        (N, {"n_global_blocks": 2, "n_random_blocks": 0, "block_size": 3}),
        (MAX_LEN, {"block_size": 5, "n_random_blocks": 4}),
    ],
)
def test_outputs_depend_exactly_on_the_pattern(n, params):
    m = small_attention("bigbird", **params).eval()
    pattern = m.attention_pattern(n)
    assert torch.equal(pattern, _expected_pattern(m, n))
    assert torch.equal(input_dependence(m, torch.randn(1, n, D_MODEL)), pattern)


def test_matches_dense_reference():
    m = small_attention("bigbird", n_random_blocks=3).eval()
    x = torch.randn(3, N, D_MODEL)
    mask = torch.ones(3, N, dtype=torch.bool)
    mask[1, 22:] = False
    mask[2, :6] = False  # left padding covers the global block
    mask[2, 34:] = False
    torch.testing.assert_close(m(x, mask), _reference(m, x, mask), atol=1e-5, rtol=1e-4)


def test_random_blocks_avoid_window_and_globals_and_are_distinct():
    m = small_attention("bigbird", block_size=4, n_global_blocks=2, n_random_blocks=3)
    rb = m.random_blocks
    nb = MAX_LEN // 4
    assert rb.shape == (nb, 3)
    assert (rb[:2] == nb).all(), "global blocks need no random blocks"
    for i in range(2, nb):
        row = rb[i].tolist()
        assert len(set(row)) == 3
        assert all(2 <= j < nb and abs(j - i) > 1 for j in row)


def test_random_blocks_come_from_the_seed_and_are_saved():
    torch.manual_seed(3)
    a = small_attention("bigbird")
    torch.manual_seed(3)
    b = small_attention("bigbird")
    torch.manual_seed(4)
    c = small_attention("bigbird")
    assert torch.equal(a.random_blocks, b.random_blocks)
    assert not torch.equal(a.random_blocks, c.random_blocks)
    assert "random_blocks" in a.state_dict()
    c.load_state_dict(a.state_dict())
    assert torch.equal(c.random_blocks, a.random_blocks)


def test_training_uses_the_same_pattern():
    m = small_attention("bigbird")
    x = torch.randn(2, N, D_MODEL)
    torch.testing.assert_close(m.train()(x), m.eval()(x), atol=0, rtol=0)  # dropout 0: same blocks


def test_padding_length_does_not_change_real_outputs():
    """A sequence padded to a longer batch length gives the same outputs at its real tokens."""
    m = small_attention("bigbird").eval()
    x = torch.randn(1, 21, D_MODEL)
    padded = torch.cat([x, torch.randn(1, MAX_LEN - 21, D_MODEL)], dim=1)
    mask = torch.arange(MAX_LEN)[None] < 21
    torch.testing.assert_close(m(padded, mask)[:, :21], m(x), atol=1e-5, rtol=1e-4)


def test_needs_max_len_and_valid_params():
    with pytest.raises(ValueError, match="max_len"):
        xsearch.build_attention("bigbird", D_MODEL, 4)
    for bad in ({"block_size": 0}, {"n_global_blocks": -1}, {"n_random_blocks": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            small_attention("bigbird", **bad)
