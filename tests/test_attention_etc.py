"""ETC: long-to-long attention stays inside the radius; the global memory reads every real token."""

import pytest
import torch

from tests.conftest import D_MODEL, dense_attention, small_attention

N = 37


def _reference(m, x, mask):
    """ETC's two stages with dense masks over [global tokens; long tokens]."""
    b, n, _ = x.shape
    g = m.global_tokens.shape[0]
    r = m.params["radius"]
    mem = m.global_tokens.expand(b, -1, -1)
    both = torch.cat([mem, x], dim=1)  # (B, G+N, D)
    q, k, v = (m.split_heads(p(both)) for p in (m.q_proj, m.k_proj, m.v_proj))
    keys_ok = torch.cat([torch.ones(b, g, dtype=torch.bool), mask], dim=1)[:, None, None, :]
    og = dense_attention(q[:, :, :g], k, v, keys_ok)  # g2g + g2l
    upd = mem + m.out_proj(m.merge_heads(og))
    gk, gv = m.split_heads(m.k_proj(upd)), m.split_heads(m.v_proj(upd))
    pos = torch.arange(n)
    l2l = ((pos[:, None] - pos[None, :]).abs() <= r) & mask[:, None, None, :] | torch.eye(n, dtype=torch.bool)
    allowed = torch.cat([torch.ones(b, 1, n, g, dtype=torch.bool), l2l], dim=-1)  # l2g + l2l
    out = dense_attention(q[:, :, g:], torch.cat([gk, k[:, :, g:]], 2), torch.cat([gv, v[:, :, g:]], 2), allowed)
    return m.out_proj(m.merge_heads(out)) * mask[..., None]


@pytest.mark.parametrize("radius", [0, 3, 20])
def test_matches_dense_reference(radius):
    m = small_attention("etc", radius=radius).eval()
    x = torch.randn(3, N, D_MODEL)
    mask = torch.ones(3, N, dtype=torch.bool)
    mask[1, 22:] = False
    mask[2, :6] = False
    mask[2, 34:] = False
    torch.testing.assert_close(m(x, mask), _reference(m, x, mask), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("radius,n", [(4, N), (20, 64)])
def test_long_to_long_stays_inside_the_radius(radius, n):
    """With the global states held fixed, perturbing long key/value j changes output i iff |i-j| <= radius;
    every output reads every global token."""
    m = small_attention("etc", radius=radius).eval()
    h, dh, g = m.n_heads, m.head_dim, m.params["n_global"]
    q, k, v = torch.randn(3, 1, h, n, dh).unbind(0)
    gk, gv = torch.randn(2, 1, h, g, dh).unbind(0)
    real = torch.ones(1, n, dtype=torch.bool)
    base = m.local_side(q, k, v, gk, gv, real)  # (1, H, N, Dh)
    dep = torch.zeros(n, n, dtype=torch.bool)
    for j in range(n):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, j] += torch.randn(h, dh)
        v2[:, :, j] += torch.randn(h, dh)
        dep[:, j] = (m.local_side(q, k2, v2, gk, gv, real) - base).abs().amax(dim=(0, 1, 3)) > 1e-5
    pos = torch.arange(n)
    assert torch.equal(dep, (pos[:, None] - pos[None, :]).abs() <= radius)
    for e in range(g):
        gv2 = gv.clone()
        gv2[:, :, e] += 1.0
        assert ((m.local_side(q, k, v, gk, gv2, real) - base).abs().amax(dim=(0, 1, 3)) > 1e-5).all()


def test_global_memory_reads_every_real_token_and_no_padding():
    m = small_attention("etc").eval()
    x = torch.randn(1, N, D_MODEL)
    mask = torch.ones(1, N, dtype=torch.bool)
    mask[0, 30:] = False
    k, v = m.split_heads(m.k_proj(x)), m.split_heads(m.v_proj(x))
    gk, gv = m.global_states(k, v, mask)
    for j in range(N):
        k2 = k.clone()
        k2[:, :, j] += 1.0
        changed = not torch.allclose(m.global_states(k2, v, mask)[0], gk, atol=1e-6, rtol=0)
        assert changed == bool(mask[0, j]), j


def test_global_tokens_carry_information_across_the_sequence():
    """Beyond the radius a long token still depends on far tokens, through the global memory."""
    m = small_attention("etc", radius=2).eval()
    x = torch.randn(1, N, D_MODEL)
    x2 = x.clone()
    x2[:, -1] += 3.0
    assert not torch.allclose(m(x)[:, 0], m(x2)[:, 0])


@pytest.mark.parametrize("bad", [{"n_global": 0}, {"radius": -1}])
def test_bad_params(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        small_attention("etc", **bad)
