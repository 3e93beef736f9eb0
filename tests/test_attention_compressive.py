"""Compressive Transformer attention: reduction to ``xl``, a segment-by-segment reference, and
the gradient paths of the compressed memory."""

import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import D_MODEL, N_HEADS, small_attention

H, DH = N_HEADS, D_MODEL // N_HEADS


def _padded(n, b=2):
    x = torch.randn(b, n, D_MODEL)
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[1, :5] = False
    mask[1, n - 3 :] = False
    return x, mask


def _sinusoid(dist, p):
    inv_freq = 1.0 / 10000 ** (torch.arange(0, p, 2).float() / p)
    ang = dist.float()[..., None] * inv_freq
    return torch.cat([ang.sin(), ang.cos()], dim=-1)


def reference(m, x, mask, *, causal, seg, mem, cmem, c, fn):
    """Loop over segments: keys [cmem slots; mem states; segment], relative distances counted in
    window slots, compressed slot t = f(states [tc, (t+1)c)) of the masked layer input."""
    b, n, d = x.shape
    real = mask.float()
    xm = x * real[..., None]
    n_seg = math.ceil(n / seg)
    np_ = n_seg * seg
    xp = torch.cat([xm, xm.new_zeros(b, np_ - n, d)], 1)
    rp = torch.cat([real, real.new_zeros(b, np_ - n)], 1)
    if fn == "conv":
        comp = F.conv1d(xp.transpose(1, 2), m.compress.weight, m.compress.bias, stride=c).transpose(1, 2)
    else:
        comp = xp.reshape(b, -1, c, d).sum(2) / rp.reshape(b, -1, c).sum(-1).clamp(min=1)[..., None]
    comp_real = rp.reshape(b, -1, c).sum(-1) > 0  # (B, T)

    def heads(t):
        return t.view(b, -1, H, DH).transpose(1, 2)

    q, k, v = heads(m.q_proj(xp)), heads(m.k_proj(xp)), heads(m.v_proj(xp))
    kc, vc = heads(m.k_proj(comp)), heads(m.v_proj(comp))
    out = torch.zeros(b, H, np_, DH)
    for s in range(n_seg):
        lo = s * seg
        slots = [(lo - mem) // c - cmem + t for t in range(cmem)]
        ks, vs, ok = [], [], []
        for t in slots:
            ks.append(kc[:, :, max(t, 0)])
            vs.append(vc[:, :, max(t, 0)])
            ok.append(comp_real[:, max(t, 0)] & (t >= 0))
        for j in range(lo - mem, lo + seg):
            ks.append(k[:, :, max(j, 0)])
            vs.append(v[:, :, max(j, 0)])
            ok.append((rp[:, max(j, 0)] > 0) & (j >= 0))
        kk, vv, okk = torch.stack(ks, 2), torch.stack(vs, 2), torch.stack(ok, 1)  # (B, H, W, Dh), (B, W)
        w = kk.shape[2]
        qs = q[:, :, lo : lo + seg]
        qpos = torch.arange(w - seg, w)
        kpos = torch.arange(w)
        rel = m.r_proj(_sinusoid(qpos[:, None] - kpos[None, :], m.r_proj.in_features)).view(seg, w, H, DH)
        scores = torch.einsum("bhid,bhjd->bhij", qs + m.u_bias[:, None], kk)
        scores = (scores + torch.einsum("bhid,ijhd->bhij", qs + m.v_bias[:, None], rel)) / math.sqrt(DH)
        allowed = okk[:, None, None, :] | (kpos[None, :] == qpos[:, None])
        if causal:
            allowed = allowed & (kpos[None, :] <= qpos[:, None])
        out[:, :, lo : lo + seg] = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ vv
    return m.out_proj(out[:, :, :n].transpose(1, 2).reshape(b, n, H * DH))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fn", ["conv", "mean"])
@pytest.mark.parametrize("seg,mem,cmem,c", [(8, 8, 4, 2), (6, 3, 3, 3), (4, 0, 5, 2)])
def test_matches_segment_loop_reference(causal, fn, seg, mem, cmem, c):
    m = small_attention(
        "compressive", causal=causal, segment_len=seg, mem_len=mem, cmem_len=cmem, compression=c, compress_fn=fn
    ).eval()
    x, mask = _padded(37)
    with torch.no_grad():
        y = m(x, mask)
        ref = reference(m, x, mask, causal=causal, seg=seg, mem=mem, cmem=cmem, c=c, fn=fn)
    torch.testing.assert_close(y[mask], ref[mask], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_without_compressed_memory_equals_xl(causal):
    xl = small_attention("xl", causal=causal, segment_len=8, mem_len=8).eval()
    comp = small_attention("compressive", causal=causal, segment_len=8, mem_len=8, cmem_len=0).eval()
    comp.load_state_dict(xl.state_dict())  # strict: no compression module when cmem_len == 0
    x, mask = _padded(37)
    torch.testing.assert_close(comp(x, mask), xl(x, mask), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_compressed_memory_is_used_and_gradient_stopped(causal):
    seg = 8
    m = small_attention("compressive", causal=causal, segment_len=seg, mem_len=seg, cmem_len=4, compression=2).train()
    x = torch.randn(2, 4 * seg, D_MODEL, requires_grad=True)
    # Segment 3 (positions [24, 32)) sees [16, 24) as memory and [8, 16) as 4 compressed slots.
    m(x)[:, 3 * seg :].pow(2).sum().backward()
    assert (x.grad[:, : 3 * seg] == 0).all(), "gradient leaked into the (compressed) memory"
    assert m.compress.weight.grad.abs().sum() > 0, "the compression gets no gradient"
    with torch.no_grad():
        y = m(x)[:, 3 * seg :]
        x2 = x.clone()
        x2[:, seg : 2 * seg] += torch.randn_like(x2[:, seg : 2 * seg])
        assert not torch.allclose(y, m(x2)[:, 3 * seg :])
        x3 = x.clone()  # older than the compressed memory: not seen
        x3[:, :seg] += torch.randn_like(x3[:, :seg])
        torch.testing.assert_close(y, m(x3)[:, 3 * seg :])


def test_mean_compression_padding_invariance():
    m = small_attention("compressive", causal=True, compress_fn="mean").eval()
    x, mask = _padded(37)
    x2 = torch.where(mask[..., None], x, 50 * torch.randn_like(x))
    torch.testing.assert_close(m(x, mask)[mask], m(x2, mask)[mask], atol=1e-5, rtol=1e-4)
    assert not any("compress" in name for name, _ in m.named_parameters())


def test_bad_params():
    with pytest.raises(ValueError, match="segment_len"):
        small_attention("compressive", segment_len=9, compression=2)
    with pytest.raises(ValueError, match="mem_len"):
        small_attention("compressive", mem_len=5, compression=2)
    with pytest.raises(ValueError, match="compression"):
        small_attention("compressive", compression=0)
    with pytest.raises(ValueError, match="cmem_len"):
        small_attention("compressive", cmem_len=-1)
    with pytest.raises(ValueError, match="compress_fn"):
        small_attention("compressive", compress_fn="max")
