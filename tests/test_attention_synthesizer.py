"""Synthesizer: reference equivalences, content independence of random mode, masking per mode."""

import pytest
import torch

import xsearch
from tests.conftest import D_MODEL, MAX_LEN, N_HEADS, padded_batch, small_attention

N = 37


def _synthetic_logits(m, x):
    """The synthetic logits S, (B|1, H, N, N), computed the naive way."""
    n = x.shape[1]
    mode = m.params["mode"]
    if mode == "dense":
        hid = m.split_heads(torch.relu(m.dense_in(x)))  # (B, H, N, Dh)
        return hid @ m.dense_out[:, :, :n] + m.dense_bias[:, None, :n]
    if mode == "random":
        return m.random[None, :, :n, :n]
    return (m.factor_q[:, :n] @ m.factor_k[:, :n].transpose(-1, -2))[None]


def _reference(m, x, mask, causal):
    """softmax(mix·QKᵀ/√d + (1-mix)·S) V with an explicit N x N mask (padded queries see themselves)."""
    n = x.shape[1]
    mix = m.params["mix"]
    q, k, v = (m.split_heads(p(x)) for p in (m.q_proj, m.k_proj, m.v_proj))
    scores = mix * (q @ k.transpose(-1, -2)) / m.head_dim**0.5
    if mix < 1:
        scores = scores + (1 - mix) * _synthetic_logits(m, x)
    allowed = torch.ones(x.shape[0], 1, n, n, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
    allowed = allowed | torch.eye(n, dtype=torch.bool)
    out = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
    y = m.out_proj(m.merge_heads(out))
    return y if mask is None else y * mask[..., None]


@pytest.mark.parametrize("mode", ["dense", "random", "factorized"])
@pytest.mark.parametrize("mix", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_naive_reference(mode, mix, causal):
    m = small_attention("synthesizer", causal=causal, mode=mode, mix=mix).eval()
    x, mask = padded_batch()
    for msk in (None, mask):
        y = m(x, msk)
        ref = _reference(m, x, msk, causal)
        real = torch.ones_like(mask) if msk is None else msk
        torch.testing.assert_close(y[real], ref[real], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_mix_one_equals_full(causal):
    full = xsearch.build_attention("full", D_MODEL, N_HEADS, causal=causal, max_len=MAX_LEN).eval()
    m = small_attention("synthesizer", causal=causal, mix=1.0)
    m.load_state_dict(full.state_dict(), strict=False)
    m.eval()
    x, mask = padded_batch()
    for msk in (None, mask):
        torch.testing.assert_close(m(x, msk), full(x, msk), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_random_pure_synthetic_ignores_queries_and_keys(causal):
    """mix=0, random mode: the attention weights depend on no input, only values matter."""
    m = small_attention("synthesizer", causal=causal, mode="random", mix=0.0).eval()
    x, mask = padded_batch()
    y = m(x, mask)
    # Other q/k projection weights: nothing changes.
    with torch.no_grad():
        for proj in (m.q_proj, m.k_proj):
            proj.weight.normal_(0, 5.0)
            proj.bias.normal_(0, 5.0)
    torch.testing.assert_close(m(x, mask), y, atol=0, rtol=0)
    # The output is an affine function of x (fixed weights times v_proj(x)): mixing two inputs
    # mixes the outputs, which content-dependent weights would not.
    x2 = 3.0 * torch.randn_like(x)
    a = 0.3
    torch.testing.assert_close(m(a * x + (1 - a) * x2, mask), a * y + (1 - a) * m(x2, mask), atol=1e-5, rtol=1e-4)
    # Exactly softmax(R) V with hand-built masks.
    n = x.shape[1]
    v = m.split_heads(m.v_proj(x))
    allowed = mask[:, None, None, :] & (torch.ones(n, n, dtype=torch.bool).tril() if causal else True)
    allowed = allowed | torch.eye(n, dtype=torch.bool)
    w = m.random[None, :, :n, :n].masked_fill(~allowed, float("-inf")).softmax(-1)  # (B, H, N, N)
    ref = m.out_proj(m.merge_heads(w @ v)) * mask[..., None]
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["dense", "random", "factorized"])
def test_pure_synthetic_reads_other_tokens_through_values_only(mode):
    """mix=0: moving token j along the null space of v_proj (its key and query change, its
    value does not) leaves every other output unchanged; with mix > 0 it does not."""
    x = torch.randn(1, 12, D_MODEL)
    for mix in (0.0, 0.5):
        torch.manual_seed(0)
        m = small_attention("synthesizer", mode=mode, mix=mix, head_dim=4).eval()  # v_proj: 32 -> 16
        null = torch.linalg.svd(m.v_proj.weight.detach()).Vh[-1]  # (D,): v_proj.weight @ null == 0
        x2 = x.clone()
        x2[0, 7] += 10.0 * null
        y, y2 = m(x), m(x2)
        others = torch.arange(12) != 7
        if mix == 0.0:
            torch.testing.assert_close(y2[0, others], y[0, others], atol=1e-5, rtol=1e-4)
            # Token 7's own row: only dense mode computes its weights from its content.
            assert torch.allclose(y2[0, 7], y[0, 7], atol=1e-5) == (mode != "dense")
        else:
            assert not torch.allclose(y2[0, others], y[0, others], atol=1e-4)


@pytest.mark.parametrize("mode", ["dense", "random", "factorized"])
@pytest.mark.parametrize("causal", [False, True])
def test_every_mode_meets_the_masking_contract(mode, causal):
    m = small_attention("synthesizer", causal=causal, mode=mode).eval()
    x, mask = padded_batch()
    y = m(x, mask)
    x2 = torch.where(mask[..., None], x, 50.0 * torch.randn_like(x))
    torch.testing.assert_close(m(x2, mask)[mask], y[mask], atol=1e-5, rtol=1e-4)
    assert (y[~mask] == 0).all()
    if causal:
        for t in (1, 9, 20, 36):
            x3 = x.clone()
            x3[:, t:] = 10.0 * torch.randn_like(x3[:, t:])
            torch.testing.assert_close(m(x3)[:, :t], m(x)[:, :t], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["dense", "random", "factorized"])
def test_every_mode_trains_every_parameter(mode):
    m = small_attention("synthesizer", mode=mode).train()
    x, mask = padded_batch()
    (m(x, mask) ** 2).sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("n", [1, 2, MAX_LEN])
def test_lengths_each_mode(n):
    for mode in ("dense", "random", "factorized"):
        for causal in (False, True):
            m = small_attention("synthesizer", causal=causal, mode=mode).eval()
            y = m(torch.randn(2, n, D_MODEL))
            assert y.shape == (2, n, D_MODEL) and torch.isfinite(y).all()


def test_bad_params():
    with pytest.raises(ValueError, match="mode.*'bogus'"):
        small_attention("synthesizer", mode="bogus")
    with pytest.raises(ValueError, match="mix"):
        small_attention("synthesizer", mix=1.5)
    with pytest.raises(ValueError, match="mix"):
        small_attention("synthesizer", mix=-0.1)
    with pytest.raises(ValueError, match="'k'"):
        small_attention("synthesizer", mode="factorized", k=0)
    with pytest.raises(ValueError, match="max_len"):
        xsearch.build_attention("synthesizer", D_MODEL, N_HEADS)
