"""Longformer: the window (with dilation, causal or not) and the global tokens are exactly the pattern."""

import pytest
import torch

from tests.conftest import D_MODEL, dense_attention, input_dependence, small_attention

N = 37


def _reference(m, x, mask):
    """Longformer with dense N x N masks built from ``attention_pattern``."""
    b, n, _ = x.shape
    q, k, v = (m.split_heads(p(x)) for p in (m.q_proj, m.k_proj, m.v_proj))
    eye = torch.eye(n, dtype=torch.bool)
    out = dense_attention(q, k, v, (m.attention_pattern(n) & mask[:, None, None, :]) | eye)
    g = m.n_global
    if g:
        qg, kg, vg = m.split_heads(m.q_global(x[:, :g])), m.split_heads(m.k_global(x)), m.split_heads(m.v_global(x))
        out = torch.cat([dense_attention(qg, kg, vg, mask[:, None, None, :] | eye[:g]), out[:, :, g:]], dim=2)
    return m.out_proj(m.merge_heads(out)) * mask[..., None]


@pytest.mark.parametrize("causal", [False, True])
def test_wide_window_without_globals_equals_full(causal):
    """A window covering the whole sequence is full attention with the same projections."""
    window = N if causal else 2 * N  # the total span: N-1 back (causal) or N-1 on each side
    lf = small_attention("longformer", causal=causal, window=window, n_global=0).eval()
    full = small_attention("full", causal=causal).eval()
    lf.load_state_dict(full.state_dict())  # strict: longformer without globals has exactly full's weights
    x = torch.randn(3, N, D_MODEL)
    mask = torch.ones(3, N, dtype=torch.bool)
    mask[1, 25:] = False
    mask[2, :10] = False
    torch.testing.assert_close(lf(x), full(x), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(lf(x, mask), full(x, mask), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "causal,window,dilation,n_global",
    [
        (False, 8, 1, 0),
        (False, 8, 1, 2),
        (False, 6, 2, 0),
        (False, 4, 3, 3),
        (False, 40, 1, 1),  # block length = half-window (20) > the minimum block
        (True, 8, 1, 0),
        (True, 5, 2, 0),
        (True, 20, 1, 0),
    ],
)
def test_outputs_depend_exactly_on_the_pattern(causal, window, dilation, n_global):
    """Perturbing input j changes output i iff i may attend j (or i == j); dilation included."""
    n = 64 if window == 40 else N
    m = small_attention("longformer", causal=causal, window=window, dilation=dilation, n_global=n_global).eval()
    pattern = m.attention_pattern(n) | torch.eye(n, dtype=torch.bool)
    assert torch.equal(input_dependence(m, torch.randn(1, n, D_MODEL)), pattern)
    # the pattern itself is what the docstring promises
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    rel = i - j
    if causal:
        band = (rel >= 0) & (rel <= window * dilation) & (rel % dilation == 0)
    else:
        band = (rel.abs() <= (window // 2) * dilation) & (rel % dilation == 0)
    assert torch.equal(pattern, band | (i < n_global) | (j < n_global) | (i == j))


@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("n_global", [0, 2])
def test_matches_dense_reference(dilation, n_global):
    m = small_attention("longformer", window=6, dilation=dilation, n_global=n_global).eval()
    x = torch.randn(3, N, D_MODEL)
    mask = torch.ones(3, N, dtype=torch.bool)
    mask[1, 28:] = False
    mask[2, :3] = False  # left padding covers a global token
    mask[2, 33:] = False
    torch.testing.assert_close(m(x, mask), _reference(m, x, mask), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_dilated_padding_invariance_and_no_leak(causal):
    m = small_attention("longformer", causal=causal, window=4, dilation=3).eval()
    x = torch.randn(2, N, D_MODEL)
    mask = torch.ones(2, N, dtype=torch.bool)
    mask[1, 30:] = False
    y = m(x, mask)
    x2 = torch.where(mask[..., None], x, 50.0 * torch.randn_like(x))
    torch.testing.assert_close(y[mask], m(x2, mask)[mask], atol=1e-5, rtol=1e-4)
    if causal:
        x3 = x.clone()
        x3[:, 20:] = torch.randn_like(x3[:, 20:])
        torch.testing.assert_close(m(x)[:, :20], m(x3)[:, :20], atol=1e-5, rtol=1e-4)


def test_causal_turns_globals_off():
    m = small_attention("longformer", causal=True, n_global=3)
    assert m.n_global == 0 and m.params["n_global"] == 0
    assert not hasattr(m, "q_global")
    enc = small_attention("longformer", n_global=3)
    assert all(isinstance(getattr(enc, p), torch.nn.Linear) for p in ("q_global", "k_global", "v_global"))


def test_global_rows_use_their_own_projections():
    m = small_attention("longformer", n_global=2).eval()
    x = torch.randn(1, N, D_MODEL)
    y = m(x)
    with torch.no_grad():
        m.q_global.weight.add_(torch.randn_like(m.q_global.weight))
    y2 = m(x)
    assert not torch.allclose(y[:, :2], y2[:, :2])
    torch.testing.assert_close(y[:, 2:], y2[:, 2:], atol=0, rtol=0)


@pytest.mark.parametrize("bad", [{"window": 0}, {"dilation": 0}, {"n_global": -1}])
def test_bad_params(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        small_attention("longformer", **bad)
