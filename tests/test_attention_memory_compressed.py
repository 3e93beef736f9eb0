"""Memory-compressed attention: equivalence with full attention at c=1, a naive reference at
c>1, no look-ahead inside a group."""

import pytest
import torch
import torch.nn.functional as F

import xsearch
from tests.conftest import D_MODEL, MAX_LEN, N_HEADS, padded_batch, small_attention


@pytest.mark.parametrize("causal", [False, True])
def test_compression_one_equals_full(causal):
    """With c=1 the (mean-pooling initialised) convolutions are the identity: exactly full."""
    full = xsearch.build_attention("full", D_MODEL, N_HEADS, causal=causal, max_len=MAX_LEN).eval()
    m = small_attention("memory_compressed", causal=causal, compression=1)
    m.load_state_dict(full.state_dict(), strict=False)
    m.eval()
    x, mask = padded_batch()
    for msk in (None, mask):
        torch.testing.assert_close(m(x, msk), full(x, msk), atol=1e-5, rtol=1e-4)


def _reference(m, x, mask):
    """Per-query loops over an explicit key list, the strided conv as F.conv1d."""
    b, n, _ = x.shape
    c = m.params["compression"]
    q = m.split_heads(m.q_proj(x))
    k, v = m.k_proj(x), m.v_proj(x)
    real = torch.ones(b, n) if mask is None else mask.float()
    g = -(-n // c)
    realp = F.pad(real, (0, g * c - n))
    kp = F.pad(k, (0, 0, 0, g * c - n)) * realp[..., None]
    vp = F.pad(v, (0, 0, 0, g * c - n)) * realp[..., None]
    ck = m.split_heads(F.conv1d(kp.transpose(1, 2), m.k_conv.weight, stride=c).transpose(1, 2))  # (B, H, G, Dh)
    cv = m.split_heads(F.conv1d(vp.transpose(1, 2), m.v_conv.weight, stride=c).transpose(1, 2))
    valid = realp.reshape(b, g, c).amax(-1) > 0
    kh, vh = m.split_heads(k), m.split_heads(v)
    out = torch.zeros_like(q)
    for i in range(b):
        for t in range(n):
            if m.causal:
                grp = [j for j in range(t // c) if valid[i, j]]
                loc = [j for j in range(t // c * c, t + 1) if real[i, j] > 0 or j == t]
            else:
                grp = [j for j in range(g) if valid[i, j]] or list(range(g))
                loc = []
            keys = torch.cat([ck[i][:, grp], kh[i][:, loc]], dim=1)  # (H, K, Dh)
            vals = torch.cat([cv[i][:, grp], vh[i][:, loc]], dim=1)
            p = (keys @ q[i, :, t, :, None] * m.scale).squeeze(-1).softmax(-1)  # (H, K)
            out[i, :, t] = (p[..., None] * vals).sum(1)
    return m.finish(out, mask)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("c", [2, 3, 5])
def test_matches_naive_reference(causal, c):
    m = small_attention("memory_compressed", causal=causal, compression=c).eval()
    with torch.no_grad():  # away from the mean-pooling initialisation
        m.k_conv.weight.normal_(0, 0.3)
        m.v_conv.weight.normal_(0, 0.3)
    x, mask = padded_batch(23)
    for msk in (None, mask):
        torch.testing.assert_close(m(x, msk), _reference(m, x, msk), atol=2e-5, rtol=1e-4)


def test_causal_merge_is_stable_with_large_scores():
    m = small_attention("memory_compressed", causal=True).eval()
    with torch.no_grad():
        m.q_proj.weight.mul_(40.0)  # scores in the hundreds
    x, mask = padded_batch(23)
    y = m(x, mask)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, _reference(m, x, mask), atol=1e-4, rtol=1e-3)


def test_no_lookahead_inside_a_group():
    """Every output t depends on exactly the inputs 0..t (checked through gradients)."""
    m = small_attention("memory_compressed", causal=True, compression=4).eval()
    x = torch.randn(1, 14, D_MODEL, requires_grad=True)
    y = m(x)
    for t in range(14):
        (grad,) = torch.autograd.grad(y[0, t].sum(), x, retain_graph=True)
        touched = (grad[0].abs().sum(-1) > 0).nonzero().flatten().tolist()
        assert touched == list(range(t + 1)), t


def test_encoder_sees_groups_not_tokens():
    """c=4, mean pooling: swapping two tokens inside one group leaves the encoder's output at
    other positions unchanged (the group summary is the same)."""
    m = small_attention("memory_compressed", compression=4).eval()
    x = torch.randn(1, 16, D_MODEL)
    x2 = x.clone()
    x2[0, [4, 6]] = x[0, [6, 4]]
    keep = [i for i in range(16) if i not in (4, 6)]
    torch.testing.assert_close(m(x2)[0, keep], m(x)[0, keep], atol=1e-5, rtol=1e-4)


def test_bad_params():
    with pytest.raises(ValueError, match="compression"):
        small_attention("memory_compressed", compression=0)
