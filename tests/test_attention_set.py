"""Set Transformer ISAB: permutation equivariance, padding as removal, a naive reference."""

import pytest
import torch

import xsearch
from tests.conftest import D_MODEL, N_HEADS, padded_batch, small_attention


def test_permutation_equivariant():
    m = small_attention("set").eval()
    x, mask = padded_batch()
    perm = torch.randperm(x.shape[1])
    for msk in (None, mask):
        y = m(x, msk)
        yp = m(x[:, perm], None if msk is None else msk[:, perm])
        torch.testing.assert_close(yp, y[:, perm], atol=1e-5, rtol=1e-4)


def test_padding_is_removal():
    """Padded rows anywhere in the set act as if they were not there (no positions)."""
    m = small_attention("set").eval()
    x, mask = padded_batch()
    y = m(x, mask)
    for i in range(3):
        alone = m(x[i : i + 1, mask[i]])  # the real rows only, no mask
        torch.testing.assert_close(y[i, mask[i]], alone[0], atol=1e-5, rtol=1e-4)


def _mha(q, k, v, allowed=None):
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v


def test_matches_naive_isab():
    m = small_attention("set").eval()
    x, mask = padded_batch()
    b = x.shape[0]
    sh = m.split_heads
    ind = m.inducing.expand(b, -1, -1)  # (B, m, D)
    a = _mha(sh(m.ind_q_proj(ind)), sh(m.k_proj(x)), sh(m.v_proj(x)), mask[:, None, None, :])
    s = m.ind_norm1(ind + m.ind_out_proj(m.merge_heads(a)))
    hid = m.ind_norm2(s + torch.relu(m.ind_ff(s)))
    out = _mha(sh(m.q_proj(x)), sh(m.h_k_proj(hid)), sh(m.h_v_proj(hid)))
    ref = m.out_proj(m.merge_heads(out)) * mask[..., None]
    torch.testing.assert_close(m(x, mask), ref, atol=1e-5, rtol=1e-4)


def test_more_inducing_points_change_the_summary_size_only():
    for n_inducing in (1, 3, 50):
        m = small_attention("set", n_inducing=n_inducing).eval()
        x, mask = padded_batch()
        y = m(x, mask)
        assert y.shape == x.shape and torch.isfinite(y).all()
        assert m.inducing.shape == (n_inducing, D_MODEL)


def test_fully_padded_sequence_is_finite_and_zero():
    m = small_attention("set").eval()
    x, mask = padded_batch()
    mask[0] = False
    y = m(x, mask)
    assert torch.isfinite(y).all() and (y[0] == 0).all()


def test_bad_params():
    with pytest.raises(ValueError, match="n_inducing"):
        small_attention("set", n_inducing=0)
    with pytest.raises(ValueError, match="cannot be causal"):
        xsearch.build_attention("set", D_MODEL, N_HEADS, causal=True)
