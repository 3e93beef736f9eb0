"""The contract every attention variant meets, run over the whole registry."""

import re

import pytest
import torch

import xsearch
from tests.conftest import D_MODEL, MAX_LEN, modes, padded_batch, small_attention

N = 37  # deliberately not a multiple of any block size

MODES = modes()
NAMES = xsearch.list_attentions()


@pytest.mark.parametrize("name,causal", MODES)
def test_shape_and_finite(name, causal):
    m = small_attention(name, causal=causal).eval()
    x, mask = padded_batch()
    for msk in (None, mask):
        y = m(x, msk)
        assert y.shape == x.shape
        assert torch.isfinite(y).all()


@pytest.mark.parametrize("name,causal", MODES)
def test_projection_names(name, causal):
    m = small_attention(name, causal=causal)
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        assert isinstance(getattr(m, proj), torch.nn.Linear), proj


@pytest.mark.parametrize("name,causal", MODES)
def test_gradients_reach_every_parameter(name, causal):
    m = small_attention(name, causal=causal).train()
    x, mask = padded_batch()
    x.requires_grad_(True)
    (m(x, mask) ** 2).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for pname, p in m.named_parameters():
        assert p.grad is not None, f"{name}: no gradient reaches {pname}"
        assert torch.isfinite(p.grad).all(), f"{name}: non-finite gradient in {pname}"
        if re.search(r"(^|[._])k_(proj|global)\.bias$", pname):
            continue  # a key bias shifts every score of a query equally: softmax cancels it
        assert p.grad.abs().max() > 1e-6, f"{name}: no real gradient in {pname}"


@pytest.mark.parametrize("name,causal", MODES)
def test_padding_invariance(name, causal):
    """Real positions never depend on what sits at padded positions."""
    m = small_attention(name, causal=causal).eval()
    x, mask = padded_batch()
    y = m(x, mask)
    x2 = torch.where(mask[..., None], x, 50.0 * torch.randn_like(x))
    y2 = m(x2, mask)
    torch.testing.assert_close(y[mask], y2[mask], atol=1e-5, rtol=1e-4)
    assert (y[~mask] == 0).all(), "padded positions must be zero"


@pytest.mark.parametrize("name", xsearch.list_attentions(causal=True))
@pytest.mark.parametrize("t", [1, 9, 20, 36])
def test_no_causal_leak(name, t):
    """Perturbing positions >= t leaves outputs < t unchanged."""
    m = small_attention(name, causal=True).eval()
    x, _ = padded_batch()
    y = m(x)
    x2 = x.clone()
    x2[:, t:] = 10.0 * torch.randn_like(x2[:, t:])
    y2 = m(x2)
    torch.testing.assert_close(y[:, :t], y2[:, :t], atol=1e-5, rtol=1e-4)
    # and the future does matter to the future, so the check above is not vacuous
    assert not torch.allclose(y[:, t:], y2[:, t:])


@pytest.mark.parametrize("name", xsearch.list_attentions(causal=True))
def test_causal_prefix_consistency(name):
    """A decoder's outputs on a prefix equal its outputs on the whole sequence (no dependence on N)."""
    m = small_attention(name, causal=True).eval()
    x, _ = padded_batch()
    y = m(x)
    for t in (1, 8, 20, 33):
        torch.testing.assert_close(m(x[:, :t]), y[:, :t], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name,causal", MODES)
def test_inference_mode_matches_autograd_mode(name, causal):
    """Inference-only code paths (fused projections, eager chunking) compute the same function."""
    m = small_attention(name, causal=causal).eval()
    x, mask = padded_batch()
    y = m(x, mask)
    with torch.inference_mode():
        torch.testing.assert_close(m(x, mask), y, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name,causal", MODES)
def test_eval_determinism(name, causal):
    torch.manual_seed(1)
    m1 = small_attention(name, causal=causal).eval()
    torch.manual_seed(1)
    m2 = small_attention(name, causal=causal).eval()
    x, mask = padded_batch()
    y = m1(x, mask)
    torch.testing.assert_close(y, m1(x, mask), atol=0, rtol=0)
    torch.testing.assert_close(y, m2(x, mask), atol=0, rtol=0)


@pytest.mark.parametrize("name,causal", MODES)
@pytest.mark.parametrize("n", [1, 2, 5, 17, MAX_LEN])
def test_any_length(name, causal, n):
    m = small_attention(name, causal=causal).eval()
    x, mask = padded_batch(n)
    mask[:, 0] = True  # at least one real token per row
    y = m(x, mask)
    assert y.shape == (3, n, D_MODEL) and torch.isfinite(y).all()


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_errors(name):
    m = small_attention(name).eval()
    with pytest.raises(ValueError, match="3-D"):
        m(torch.randn(N, D_MODEL))
    with pytest.raises(ValueError, match="d_model"):
        m(torch.randn(1, N, D_MODEL + 1))
    with pytest.raises(ValueError, match="max_len"):
        m(torch.randn(1, MAX_LEN + 1, D_MODEL))
    with pytest.raises(ValueError, match="mask shape"):
        m(torch.randn(2, N, D_MODEL), torch.ones(2, N + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="no_such_param"):
        small_attention(name, no_such_param=3)


@pytest.mark.parametrize("name", NAMES)
def test_spec_is_complete(name):
    spec = xsearch.attention_spec(name)
    assert spec.name == name and spec.paper and spec.complexity.startswith("O(")
    assert set(spec.small_params) <= set(spec.params)
    if name != "full":
        assert spec.family, f"{name}: no survey family"


@pytest.mark.parametrize("name,causal", MODES)
def test_model_save_load_round_trip(name, causal, tmp_path):
    cfg = xsearch.ModelConfig(
        vocab_size=20,
        max_len=MAX_LEN,
        d_model=D_MODEL,
        n_layers=2,
        n_heads=4,
        attention=name,
        attention_params=dict(xsearch.attention_spec(name).small_params),
        causal=causal,
        head="lm" if causal else "classify",
        n_classes=3,
    )
    model = xsearch.build_model(cfg).eval()
    ids = torch.randint(1, 20, (2, N))
    mask = torch.ones(2, N, dtype=torch.bool)
    mask[1, 30:] = False
    xsearch.save_model(model, tmp_path / "m")
    loaded = xsearch.load_model(tmp_path / "m")
    torch.testing.assert_close(model(ids, mask), loaded(ids, mask), atol=0, rtol=0)
    assert loaded.config == model.config
