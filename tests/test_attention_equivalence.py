"""Exact equivalences and approximation properties of the foundation variants."""

import contextlib

import torch

import xsearch
from tests.conftest import D_MODEL, N_HEADS, small_attention


def _same_weights(dst, src):
    dst.load_state_dict(src.state_dict(), strict=False)
    return dst


def test_local_with_one_block_equals_full():
    for causal in (False, True):
        full = xsearch.build_attention("full", D_MODEL, N_HEADS, causal=causal, max_len=64).eval()
        local = _same_weights(small_attention("local", causal=causal, block_size=64), full).eval()
        x = torch.randn(2, 40, D_MODEL)
        mask = torch.ones(2, 40, dtype=torch.bool)
        mask[1, 25:] = False
        torch.testing.assert_close(local(x, mask)[mask], full(x, mask)[mask], atol=1e-5, rtol=1e-4)


def test_local_block_pattern():
    """A query sees exactly its block and the one before (lookback=1): check through gradients."""
    m = small_attention("local", block_size=4, lookback=1).eval()
    x = torch.randn(1, 16, D_MODEL, requires_grad=True)
    y = m(x)
    y[0, 9].sum().backward()  # query 9 is in block 2 (positions 8-11): sees 4..11
    touched = (x.grad[0].abs().sum(-1) > 0).nonzero().flatten().tolist()
    assert touched == list(range(4, 12))


def test_sparse_pattern_reaches_summaries():
    m = small_attention("sparse", block_size=4, stride=4, causal=True).eval()
    x = torch.randn(1, 16, D_MODEL, requires_grad=True)
    m(x)[0, 13].sum().backward()  # own block 12..13 causal, summaries 3, 7, 11 before the block
    touched = (x.grad[0].abs().sum(-1) > 0).nonzero().flatten().tolist()
    assert touched == [3, 7, 11, 12, 13]


def _softmax_attention(m, x, causal):
    q, k, v = (m.split_heads(p(x)) for p in (m.q_proj, m.k_proj, m.v_proj))
    scores = q @ k.transpose(-1, -2) / m.head_dim**0.5
    if causal:
        n = x.shape[1]
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return m.out_proj(m.merge_heads(scores.softmax(-1) @ v))


def test_performer_error_falls_with_more_features():
    torch.manual_seed(0)
    x = 0.5 * torch.randn(4, 48, D_MODEL)
    ref_model = small_attention("full").eval()
    errors = []
    for m_features in (8, 64, 1024):
        errs = []
        for seed in range(3):
            torch.manual_seed(seed)
            p = _same_weights(small_attention("performer", nb_features=m_features), ref_model).eval()
            errs.append((p(x) - _softmax_attention(ref_model, x, False)).pow(2).mean().item())
        errors.append(sum(errs) / len(errs))
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 0.25 * errors[0], errors


def test_performer_features_fixed_in_eval_redrawn_in_training():
    p = small_attention("performer", redraw=2).eval()
    before = p.projection.clone()
    x = torch.randn(1, 10, D_MODEL)
    p(x)
    p(x)
    p(x)
    assert torch.equal(before, p.projection)
    p.train()
    for _ in range(3):
        p(x)
    assert not torch.equal(before, p.projection)


def test_causal_linear_equals_quadratic_formula():
    for chunk in (1, 5, 16, 64):
        m = small_attention("linear", causal=True, chunk_size=chunk).eval()
        x = torch.randn(2, 37, D_MODEL)
        q, k, v = (m.split_heads(p(x)) for p in (m.q_proj, m.k_proj, m.v_proj))
        fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
        a = (fq @ fk.transpose(-1, -2)).tril()  # (B, H, N, N) masked kernel matrix
        ref = (a @ v) / (a.sum(-1, keepdim=True) + 1e-6)
        expected = m.out_proj(m.merge_heads(ref))
        torch.testing.assert_close(m(x), expected, atol=1e-5, rtol=1e-4)


def test_noncausal_linear_equals_quadratic_formula():
    m = small_attention("linear").eval()
    x = torch.randn(2, 37, D_MODEL)
    q, k, v = (m.split_heads(p(x)) for p in (m.q_proj, m.k_proj, m.v_proj))
    a = (torch.nn.functional.elu(q) + 1) @ (torch.nn.functional.elu(k) + 1).transpose(-1, -2)
    expected = m.out_proj(m.merge_heads((a @ v) / (a.sum(-1, keepdim=True) + 1e-6)))
    torch.testing.assert_close(m(x), expected, atol=1e-5, rtol=1e-4)


def test_linformer_matches_direct_formula():
    """Projecting the input before k_proj/v_proj equals projecting keys and values (paper form)."""
    m = small_attention("linformer", k=8).eval()
    n = 30
    x = torch.randn(2, n, D_MODEL)
    q = m.split_heads(m.q_proj(x))
    keys = m.split_heads(m.E[:, :n] @ m.k_proj(x))
    values = m.split_heads(m.F[:, :n] @ m.v_proj(x))
    ref = ((q @ keys.transpose(-1, -2)) / m.head_dim**0.5).softmax(-1) @ values
    torch.testing.assert_close(m(x), m.out_proj(m.merge_heads(ref)), atol=1e-5, rtol=1e-4)


def test_linformer_padding_equals_truncation():
    m = small_attention("linformer", k=8).eval()
    x = torch.randn(1, 30, D_MODEL)
    mask = torch.ones(1, 30, dtype=torch.bool)
    mask[0, 20:] = False
    torch.testing.assert_close(m(x, mask)[0, :20], m(x[:, :20])[0], atol=1e-5, rtol=1e-4)


def test_performer_chunked_encoder_equals_vectorised_path():
    from xsearch.attention._kernel_core import kernel_attention

    m = small_attention("performer").eval()
    x = torch.randn(2, 45, D_MODEL)
    mask = torch.ones(2, 45, dtype=torch.bool)
    mask[1, 20:] = False
    mask[1, :3] = False
    q, k, v = (m.split_heads(p(x)) for p in (m.q_proj, m.k_proj, m.v_proj))
    ref = kernel_attention(m._features(q, True, mask), m._features(k, False, mask) * mask[:, None, :, None], v,
                           causal=False)  # fmt: skip
    for chunk in (1, 7, 16, 64):
        got = m._encoder_chunked(q, k, v, mask, chunk=chunk)
        torch.testing.assert_close(got[:, :, :20], ref[:, :, :20], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=1e-4)


def test_attention_graph_equals_fused_kernel():
    """The exported form of attention (plain matmuls, a per-key mask folded into the product)
    gives the fused kernel's result for every kind of mask the variants pass."""
    from xsearch.attention._base import _attention_graph
    from xsearch.attention._fused import standard_ops_only

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    keys = torch.rand(2, 1, 1, 7) > 0.4
    keys[..., 0] = True  # no fully masked row
    rows = (torch.rand(2, 1, 5, 7) > 0.5) | torch.eye(5, 7, dtype=torch.bool)
    float_keys = torch.zeros(2, 1, 1, 7).masked_fill(~keys, float("-inf"))
    fused = torch.nn.functional.scaled_dot_product_attention
    for fusion in (contextlib.nullcontext, standard_ops_only):  # the fused node, and plain MatMuls
        with fusion():
            for allowed in (keys, rows, float_keys, None):
                for scale in (None, 0.3):
                    got = _attention_graph(q, k, v, allowed, causal=False, scale=scale)
                    want = fused(q, k, v, attn_mask=allowed, scale=scale)
                    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    q7 = torch.randn(2, 3, 7, 8)
    got = _attention_graph(q7, k, v, None, causal=True, scale=None)
    torch.testing.assert_close(got, fused(q7, k, v, is_causal=True), atol=1e-5, rtol=1e-5)
    # 5-D blocks with a mask broadcast over heads, as blocked attention passes them
    qb, kb, vb = torch.randn(2, 4, 3, 5, 8), torch.randn(2, 4, 3, 6, 8), torch.randn(2, 4, 3, 6, 8)
    blocks = (torch.rand(2, 4, 1, 1, 6) > 0.3) | (torch.arange(6) == 0)
    want = fused(qb.flatten(0, 1), kb.flatten(0, 1), vb.flatten(0, 1), attn_mask=blocks.flatten(0, 1))
    got = _attention_graph(qb, kb, vb, blocks, causal=False, scale=None)
    torch.testing.assert_close(got, want.view(2, 4, 3, 5, 8), atol=1e-5, rtol=1e-5)
