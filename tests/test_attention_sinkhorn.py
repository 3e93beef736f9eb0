"""Sparse Sinkhorn attention: properties beyond the shared conformance suite."""

import pytest
import torch

import xsearch
from tests.conftest import D_MODEL, MAX_LEN, N_HEADS, small_attention
from xsearch.attention.sinkhorn import sinkhorn

N = 37


@pytest.mark.parametrize("causal", [False, True])
def test_single_block_is_full_attention(causal):
    m = small_attention("sinkhorn", causal=causal, block_size=MAX_LEN).eval()
    full = xsearch.build_attention("full", D_MODEL, N_HEADS, causal=causal, max_len=MAX_LEN).eval()
    missing, unexpected = full.load_state_dict(m.state_dict(), strict=False)
    assert not missing and unexpected == ["sort_net.weight"]
    x = torch.randn(3, N, D_MODEL)
    mask = torch.ones(3, N, dtype=torch.bool)
    mask[1, 28:] = False
    mask[2, :12] = False
    for msk in (None, mask):
        torch.testing.assert_close(m(x, msk), full(x, msk), atol=1e-5, rtol=1e-4)


def test_sinkhorn_balances_rows_and_columns():
    logits = 3.0 * torch.randn(2, 4, 6, 6)
    allowed = torch.ones(6, 6, dtype=torch.bool)
    s = sinkhorn(logits, allowed, n_iters=200, causal=False)
    torch.testing.assert_close(s.sum(-1), torch.ones(2, 4, 6), atol=1e-4, rtol=0)
    torch.testing.assert_close(s.sum(-2), torch.ones(2, 4, 6), atol=1e-4, rtol=0)
    # a masked block pair gets no weight, and an all-masked row is all zero
    allowed[2] = False
    allowed[:, 2] = False
    s = sinkhorn(logits, allowed, n_iters=5, causal=False)
    assert torch.isfinite(s).all() and (s[..., 2, :] == 0).all() and (s[..., :, 2] == 0).all()


def test_causal_sinkhorn_rows_only_depend_on_earlier_rows():
    logits = 3.0 * torch.randn(2, 4, 7, 7)
    allowed = torch.ones(7, 7, dtype=torch.bool).tril(-1)
    s = sinkhorn(logits, allowed, n_iters=6, causal=True)
    assert (s[..., 0, :] == 0).all() and (s.triu() == 0).all()
    for i in range(1, 7):
        changed = logits.clone()
        changed[..., i + 1 :, :] = 5.0 * torch.randn_like(changed[..., i + 1 :, :])
        torch.testing.assert_close(sinkhorn(changed, allowed, 6, True)[..., : i + 1, :], s[..., : i + 1, :])


@pytest.mark.parametrize("causal", [False, True])
def test_matches_the_block_formula(causal):
    """Block i attends [K_i ; Σ_j S_ij K_j / Σ_j S_ij] (values alike), S from SortNet + Sinkhorn."""
    m = small_attention("sinkhorn", causal=causal, block_size=8).eval()
    nb, bs = 4, 8
    x = torch.randn(2, nb * bs, D_MODEL)
    q, k, v = (m.split_heads(p(x)).reshape(2, N_HEADS, nb, bs, -1) for p in (m.q_proj, m.k_proj, m.v_proj))
    allowed = torch.ones(nb, nb, dtype=torch.bool)
    if causal:
        allowed = allowed.tril(-1)
    s = sinkhorn(m.block_logits(x, torch.ones(2, nb * bs)) / m.params["temperature"], allowed, 5, causal)
    rows = s.sum(-1, keepdim=True).clamp(min=1e-30)
    ks = torch.einsum("bhij,bhjsd->bhisd", s / rows, k)
    vs = torch.einsum("bhij,bhjsd->bhisd", s / rows, v)
    scores = torch.cat([q @ k.transpose(-1, -2), q @ ks.transpose(-1, -2)], dim=-1) * m.scale
    own = torch.ones(bs, bs, dtype=torch.bool)
    if causal:
        own = own.tril()
    keep = torch.cat([own.expand(nb, bs, bs), allowed.any(-1)[:, None, None].expand(nb, bs, bs)], dim=-1)
    p = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)  # (B, H, nb, bs, 2bs)
    out = (p @ torch.cat([v, vs], dim=-2)).reshape(2, N_HEADS, nb * bs, -1)
    torch.testing.assert_close(m(x), m.out_proj(m.merge_heads(out)), atol=1e-5, rtol=1e-4)


def test_causal_outputs_do_not_depend_on_the_length():
    m = small_attention("sinkhorn", causal=True).eval()
    x = torch.randn(2, MAX_LEN, D_MODEL)
    y = m(x)
    for t in (3, 20, 41):
        torch.testing.assert_close(m(x[:, :t]), y[:, :t], atol=1e-5, rtol=1e-4)


def test_sort_net_learns():
    m = small_attention("sinkhorn").train()
    x = torch.randn(2, N, D_MODEL)
    m(x).pow(2).sum().backward()
    assert m.sort_net.weight.grad is not None and m.sort_net.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(("key", "value"), [("block_size", 0), ("n_iters", 0), ("temperature", 0.0)])
def test_bad_params(key, value):
    with pytest.raises(ValueError, match=key):
        small_attention("sinkhorn", **{key: value})


def test_needs_max_len():
    with pytest.raises(ValueError, match="max_len"):
        small_attention("sinkhorn", max_len=None)
