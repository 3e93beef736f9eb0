"""Routing attention: properties beyond the shared conformance suite."""

import pytest
import torch
import torch.nn.functional as F

import xsearch
from tests.conftest import D_MODEL, MAX_LEN, N_HEADS, padded_batch, small_attention

N = 37


def test_one_cluster_is_full_attention():
    m = small_attention("routing", n_clusters=1).eval()
    full = xsearch.build_attention("full", D_MODEL, N_HEADS, max_len=MAX_LEN).eval()
    full.load_state_dict(m.state_dict(), strict=False)
    x, mask = padded_batch(batch_left_pad=False)
    for msk in (None, mask):
        torch.testing.assert_close(m(x, msk), full(x, msk), atol=1e-5, rtol=1e-4)


def test_one_cluster_decoder_is_causal_shared_qk_attention():
    m = small_attention("routing", causal=True, n_clusters=1).eval()
    assert m.window >= MAX_LEN
    x, _ = padded_batch(batch_left_pad=False)
    qk = m.split_heads(m.q_proj(x))
    v = m.split_heads(m.v_proj(x))
    scores = qk @ F.normalize(qk, dim=-1).transpose(-1, -2) * m.scale
    earlier = torch.ones(N, N, dtype=torch.bool).tril(-1)
    allowed = earlier | (torch.eye(N, dtype=torch.bool) & ~earlier.any(-1, keepdim=True))  # self only at 0
    p = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    torch.testing.assert_close(m(x), m.out_proj(m.merge_heads(p @ v)), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_centroids_move_in_training_and_stay_in_eval(causal):
    m = small_attention("routing", causal=causal)
    assert "centroids" in dict(m.named_buffers())
    assert all("centroid" not in name for name, _ in m.named_parameters())
    x, mask = padded_batch(batch_left_pad=False)
    c0 = m.centroids.clone()
    m.eval()
    m(x, mask)
    assert torch.equal(m.centroids, c0)
    m.train()
    m(x, mask)
    c1 = m.centroids.clone()
    assert not torch.allclose(c1, c0)
    torch.testing.assert_close(c1.norm(dim=-1), torch.ones(c1.shape[:2]))  # unit vectors
    m(x, mask)
    assert not torch.allclose(m.centroids, c1)  # keeps moving with every training step


@pytest.mark.parametrize("causal", [False, True])
def test_centroid_update_ignores_padding(causal):
    torch.manual_seed(3)
    a = small_attention("routing", causal=causal).train()
    b = small_attention("routing", causal=causal).train()
    b.load_state_dict(a.state_dict())
    x, mask = padded_batch(batch_left_pad=False)
    x2 = torch.where(mask[..., None], x, 30.0 * torch.randn_like(x))
    a(x, mask)
    b(x2, mask)
    torch.testing.assert_close(a.centroids, b.centroids, atol=1e-6, rtol=1e-5)


def test_centroids_follow_the_data():
    """Repeated training steps on clustered data pull the centroids towards it."""
    m = small_attention("routing", n_clusters=2, decay=0.5).train()
    x, _ = padded_batch(batch_left_pad=False)
    qn = F.normalize(m.split_heads(m.q_proj(x)), dim=-1).detach()
    kn = F.normalize(m.split_heads(m.k_proj(x)), dim=-1).detach()
    data = torch.cat([qn, kn], dim=2)  # (B, H, 2N, Dh)

    def fit():  # mean similarity of each vector to its nearest centroid
        return torch.einsum("bhnd,hcd->bhnc", data, m.centroids).amax(-1).mean()

    before = fit()
    for _ in range(20):
        m(x)
    assert fit() > before


def test_decoder_ties_k_proj_and_encoder_does_not():
    dec = small_attention("routing", causal=True)
    enc = small_attention("routing")
    assert dec.k_proj.weight is dec.q_proj.weight
    assert enc.k_proj.weight is not enc.q_proj.weight


def test_causal_outputs_do_not_depend_on_the_length():
    m = small_attention("routing", causal=True).eval()
    x = torch.randn(2, MAX_LEN, D_MODEL)
    y = m(x)
    for t in (3, 20, 41):
        torch.testing.assert_close(m(x[:, :t]), y[:, :t], atol=1e-5, rtol=1e-4)


def test_encoder_attends_within_clusters_only():
    """A token's value reaches exactly the queries of the clusters that chose it as a key."""
    m = small_attention("routing", n_clusters=2).eval()
    n = 16  # w = 8 tokens per cluster
    x = torch.randn(1, n, D_MODEL)
    y = m(x)
    with torch.no_grad():
        qn = F.normalize(m.split_heads(m.q_proj(x)), dim=-1)
        kn = F.normalize(m.split_heads(m.k_proj(x)), dim=-1)
        q_sel = torch.einsum("bhnd,hcd->bhcn", qn, m.centroids).topk(8, dim=-1).indices[0]  # (H, 2, 8)
        k_sel = torch.einsum("bhnd,hcd->bhcn", kn, m.centroids).topk(8, dim=-1).indices[0]
    for token in range(4):
        reached = set()
        for h in range(N_HEADS):
            for c in range(2):
                if token in k_sel[h, c].tolist():
                    reached |= set(q_sel[h, c].tolist())

        def shift_value(module, inputs, out, token=token):  # change only this token's value
            out = out.clone()
            out[:, token] += 1.0
            return out

        handle = m.v_proj.register_forward_hook(shift_value)
        try:
            y2 = m(x)
        finally:
            handle.remove()
        changed = {i for i in range(n) if not torch.allclose(y2[0, i], y[0, i], atol=1e-6)}
        assert changed == reached


@pytest.mark.parametrize(("key", "value"), [("n_clusters", 0), ("decay", 1.0), ("decay", -0.1)])
def test_bad_params(key, value):
    with pytest.raises(ValueError, match=key):
        small_attention("routing", **{key: value})


def test_decoder_needs_max_len():
    with pytest.raises(ValueError, match="max_len"):
        small_attention("routing", causal=True, max_len=None)
    small_attention("routing", max_len=None)(torch.randn(1, 5, D_MODEL))  # the encoder does not
