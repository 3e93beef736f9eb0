"""Reformer LSH attention: properties beyond the shared conformance suite."""

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import D_MODEL, MAX_LEN, N_HEADS, small_attention

N = 37


def shared_qk_reference(m, x, mask=None, causal=False):
    """Softmax attention with keys = normalised shared queries; a token attends itself only when no
    other (real, and in causal mode earlier) key exists."""
    b, n, _ = x.shape
    qk = m.split_heads(m.q_proj(x))  # (B, H, N, Dh)
    v = m.split_heads(m.v_proj(x))
    scores = qk @ F.normalize(qk, dim=-1).transpose(-1, -2) / m.head_dim**0.5  # (B, H, N, N)
    allowed = torch.ones(b, 1, n, n, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
    eye = torch.eye(n, dtype=torch.bool)
    others = allowed & ~eye
    allowed = others | (eye & ~others.any(dim=-1, keepdim=True))
    p = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    y = m.out_proj(m.merge_heads(p @ v))
    return y if mask is None else y * mask[..., None]


@pytest.mark.parametrize("causal", [False, True])
def test_one_round_one_bucket_is_shared_qk_attention(causal):
    m = small_attention("reformer", causal=causal, n_hashes=1, bucket_size=MAX_LEN).eval()
    assert m.n_buckets == 1
    x = torch.randn(3, N, D_MODEL)
    mask = torch.ones(3, N, dtype=torch.bool)
    mask[1, 30:] = False
    mask[2, :10] = False
    for msk in (None, mask):
        torch.testing.assert_close(m(x, msk), shared_qk_reference(m, x, msk, causal), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_several_rounds_one_bucket_is_still_shared_qk_attention(causal):
    """Identical rounds combined by log-sum-exp give the single-round result (the multi-round path)."""
    m = small_attention("reformer", causal=causal, n_hashes=3, bucket_size=MAX_LEN).eval()
    x = torch.randn(2, N, D_MODEL)
    with torch.no_grad():  # inference path (fused kernel with log-sum-exp)
        fast = m(x)
    slow = m(x)  # differentiable path
    ref = shared_qk_reference(m, x, causal=causal)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(slow, ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_inference_and_differentiable_paths_agree(causal):
    m = small_attention("reformer", causal=causal, n_hashes=3).eval()
    x = torch.randn(3, N, D_MODEL)
    mask = torch.ones(3, N, dtype=torch.bool)
    mask[1, 25:] = False
    with torch.no_grad():
        fast = m(x, mask)
    torch.testing.assert_close(fast, m(x, mask), atol=1e-5, rtol=1e-4)


def test_k_proj_is_tied_to_q_proj():
    m = small_attention("reformer")
    assert m.k_proj.weight is m.q_proj.weight and m.k_proj.bias is m.q_proj.bias
    names = [n for n, _ in m.named_parameters()]
    assert "q_proj.weight" in names and "k_proj.weight" not in names  # one shared parameter


def test_rotations_fixed_in_eval_and_redrawn_in_training():
    m = small_attention("reformer")
    x = torch.randn(2, N, D_MODEL)
    m.eval()
    r0 = m.rotations.clone()
    y = m(x)
    m(x)
    assert torch.equal(m.rotations, r0)
    torch.testing.assert_close(m(x), y, atol=0, rtol=0)
    m.train()
    m(x)
    assert not torch.equal(m.rotations, r0)
    fixed = small_attention("reformer", redraw=False).train()
    r1 = fixed.rotations.clone()
    fixed(x)
    assert torch.equal(fixed.rotations, r1)


def test_hash_is_angular_lsh():
    m = small_attention("reformer").eval()
    qk = torch.randn(2, N_HEADS, N, m.head_dim)
    rot = torch.einsum("bhnd,hrdk->bhrnk", qk, m.rotations)
    expected = torch.cat([rot, -rot], dim=-1).argmax(dim=-1)
    assert torch.equal(m.hash(qk), expected)
    assert int(expected.max()) < m.n_buckets


@pytest.mark.parametrize("n_hashes", [1, 2])
def test_causal_outputs_do_not_depend_on_the_length(n_hashes):
    """A prefix gives the same outputs as the whole sequence (buckets are fixed by max_len, and the
    chunk a token lands in does not decide what it sees)."""
    m = small_attention("reformer", causal=True, n_hashes=n_hashes, bucket_size=4).eval()
    x = torch.randn(2, MAX_LEN, D_MODEL)
    y = m(x)
    for t in (5, 23, 40):
        torch.testing.assert_close(m(x[:, :t]), y[:, :t], atol=1e-5, rtol=1e-4)


def test_single_token_attends_itself():
    for causal in (False, True):
        m = small_attention("reformer", causal=causal).eval()
        x = torch.randn(2, 1, D_MODEL)
        expected = m.out_proj(m.v_proj(x))
        torch.testing.assert_close(m(x), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("key", "value"), [("bucket_size", 0), ("n_hashes", 0)])
def test_bad_params(key, value):
    with pytest.raises(ValueError, match=key):
        small_attention("reformer", **{key: value})


def test_needs_max_len():
    with pytest.raises(ValueError, match="max_len"):
        small_attention("reformer", max_len=None)


def brute_force(m, x, mask, causal):
    """LSH attention written out token by token from its definition (small inputs only)."""
    from xsearch.attention.reformer import SELF_SCORE

    b, n, _ = x.shape
    c = m.params["bucket_size"]
    qk = m.split_heads(m.q_proj(x))
    v = m.split_heads(m.v_proj(x))
    k = F.normalize(qk, dim=-1)
    buckets = m.hash(qk)  # (B, H, R, N)
    real = torch.ones(b, n, dtype=torch.bool) if mask is None else mask
    out = torch.zeros_like(v)
    for bi in range(b):
        for h in range(m.n_heads):
            for i in range(n):
                outs, lses = [], []
                for r in range(buckets.shape[2]):
                    bk = [int(buckets[bi, h, r, j]) if real[bi, j] else m.n_buckets for j in range(n)]
                    order = sorted(range(n), key=lambda j: (bk[j], j))
                    s = order.index(i)
                    if causal:  # the c most recent earlier tokens of the bucket
                        keys = [j for j in order[max(0, s - c) : s] if bk[j] == bk[i]]
                    else:  # own chunk and previous chunk of the sorted order
                        lo = (s // c - 1) * c
                        keys = [j for j in order[max(0, lo) : lo + 2 * c] if j != i and real[bi, j]]
                    scores = torch.stack([qk[bi, h, i] @ k[bi, h, j] for j in keys]) if keys else None
                    if scores is None:
                        scores = (qk[bi, h, i] @ k[bi, h, i])[None] + SELF_SCORE * m.head_dim**0.5
                        keys = [i]
                    scores = scores * m.scale
                    p = torch.softmax(scores, dim=0)
                    outs.append(p @ v[bi, h, keys])
                    lses.append(torch.logsumexp(scores, dim=0))
                w = torch.softmax(torch.stack(lses), dim=0)
                out[bi, h, i] = (w[:, None] * torch.stack(outs)).sum(0)
    y = m.out_proj(m.merge_heads(out))
    return y * real[..., None]


@pytest.mark.parametrize("causal", [False, True])
def test_matches_brute_force_definition(causal):
    m = small_attention("reformer", causal=causal, n_hashes=2, bucket_size=4).eval()
    x = torch.randn(2, 21, D_MODEL)
    mask = torch.ones(2, 21, dtype=torch.bool)
    mask[1, 15:] = False
    mask[1, :3] = False
    with torch.no_grad():
        torch.testing.assert_close(m(x, mask), brute_force(m, x, mask, causal), atol=1e-5, rtol=1e-4)
