"""Performer in causal mode is as exact as the encoder: a decoder output equals the encoder's on its prefix."""

import pytest
import torch

import xsearch
from xsearch.attention._kernel_core import NEG, kernel_attention

PREFIXES = (1, 9, 16, 17, 40)


def performer(d_model=32, n_heads=4, causal=True, chunk_size=16):
    torch.manual_seed(0)
    return xsearch.build_attention(
        "performer", d_model, n_heads, causal=causal, nb_features=64, chunk_size=chunk_size
    ).eval()


def encoder_twin(m):
    """The non-causal module with ``m``'s weights (projection included)."""
    enc = performer(m.d_model, m.n_heads, causal=False, chunk_size=m.params["chunk_size"])
    enc.load_state_dict(m.state_dict())
    return enc


def assert_prefix_exact(m, x, prefixes=PREFIXES):
    """causal(x)[:, p-1] == encoder(x[:, :p])[:, p-1] for every prefix length p."""
    enc = encoder_twin(m)
    with torch.no_grad():
        y = m(x)
        assert torch.isfinite(y).all()
        for p in prefixes:
            torch.testing.assert_close(y[:, p - 1], enc(x[:, :p])[:, p - 1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("d_model,n_heads,scale", [(32, 4, 1.0), (64, 2, 1.0), (32, 4, 5.0), (64, 2, 5.0)])
def test_one_key_returns_its_value(d_model, n_heads, scale):
    m = performer(d_model, n_heads)
    x = torch.randn(2, 1, d_model) * scale
    with torch.no_grad():
        torch.testing.assert_close(m(x), m.out_proj(m.v_proj(x)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk_size", [1, 7, 16, 64])
def test_causal_output_equals_encoder_on_the_prefix(chunk_size):
    m = performer(chunk_size=chunk_size)
    assert_prefix_exact(m, torch.randn(2, 40, 32))


def test_large_logits_stay_exact_and_finite():
    m = performer()
    x = torch.randn(2, 40, 32)
    x[:, 30] *= 30.0  # one key with a huge norm late in the sequence
    x[1, 4] *= 10.0
    with torch.no_grad():
        k = m.split_heads(m.k_proj(x))
        s = m._logits(k).amax(-1)  # (B, H, N): each key's max logit
    assert ((s.amax(-1) - s.amin(-1)) > 100).all()
    assert_prefix_exact(m, x, PREFIXES + (30, 31))
    # gradients stay finite too (masked exponents are finite sentinels, never inf * 0)
    x = x.requires_grad_()
    m(x).square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_right_padding_equals_the_row_alone():
    m = performer()
    x = torch.randn(2, 40, 32)
    x[1, 23:] *= 50.0  # padded keys with huge logits must not raise the running max
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 23:] = False
    with torch.no_grad():
        y = m(x, mask)
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y[0], m(x[:1])[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(y[1, :23], m(x[1:, :23])[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_kernel_attention_logscale_equals_quadratic_formula(chunk):
    """Features times exp(logscale), quadratically; keys 0-2 padded (query rows with no key give 0)."""
    b, h, n, m, d = 2, 3, 37, 8, 4
    phi_q, phi_k, v = torch.rand(b, h, n, m), torch.rand(b, h, n, m), torch.randn(b, h, n, d)
    s = 3.0 * torch.randn(b, h, n)
    phi_k[:, :, :3] = 0.0
    s[:, :, :3] = NEG
    a = (phi_q @ (phi_k * s.exp().unsqueeze(-1)).transpose(-1, -2)).tril()  # (B, H, N, N)
    ref = (a @ v) / a.sum(-1, keepdim=True).clamp_min(1e-30)
    got = kernel_attention(phi_q, phi_k, v, causal=True, chunk=chunk, key_logscale=s)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)
    assert (got[:, :, :3] == 0).all()
    a = phi_q @ (phi_k * s.exp().unsqueeze(-1)).transpose(-1, -2)
    full = kernel_attention(phi_q, phi_k, v, causal=False, key_logscale=s)
    torch.testing.assert_close(full, (a @ v) / a.sum(-1, keepdim=True), atol=1e-5, rtol=1e-4)
