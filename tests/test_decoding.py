"""Decoding conformance: for every causal variant, prefill followed by steps equals the causal forward."""

import pytest
import torch

import xsearch
from tests.conftest import D_MODEL, MAX_LEN, small_attention

CAUSAL = xsearch.list_attentions(causal=True)
TOTAL = 60  # prompt + steps, within MAX_LEN: crosses several blocks, segments and windows
#: Variants whose state does not grow with the context (its tensors keep their shapes).
CONSTANT_STATE = {"linear", "performer", "local", "longformer", "sparse", "xl", "compressive", "image"}


def _decode(m, x, prompt_lengths):
    """Prefill each row's prompt (right-padded), then step each row through its own next tokens.

    The batch steps together until its longest row reaches TOTAL tokens. Returns row i's outputs at
    its positions 0 .. prompt_i + steps - 1 (prompt outputs from prefill, the rest from steps).
    """
    b = x.shape[0]
    n = max(prompt_lengths)
    mask = torch.zeros(b, n, dtype=torch.bool)
    for i, p in enumerate(prompt_lengths):
        mask[i, :p] = True
    prompt = x[:, :n] * mask[..., None]
    y, state = m.prefill(prompt, mask if min(prompt_lengths) < n else None)
    rows = [[y[i, :p]] for i, p in enumerate(prompt_lengths)]
    shapes = None
    for j in range(TOTAL - n):
        x_t = torch.stack([x[i, p + j] for i, p in enumerate(prompt_lengths)])
        y_t, state = m.step(x_t, state)
        for i in range(b):
            rows[i].append(y_t[i : i + 1])
        now = {k: tuple(t.shape) for k, t in state.items() if k != "length"}
        if shapes is not None and m.spec.name in CONSTANT_STATE:
            assert now == shapes, f"{m.spec.name}: the state grew from {shapes} to {now}"
        shapes = now
    return [torch.cat(r) for r in rows], state


@pytest.mark.parametrize("name", CAUSAL)
@pytest.mark.parametrize("prompt", [1, 13, 40])
def test_prefill_then_steps_equal_the_causal_forward(name, prompt):
    torch.manual_seed(0)
    m = small_attention(name, causal=True).eval()
    x = torch.randn(1, TOTAL, D_MODEL)
    with torch.no_grad():
        expected = m(x)[0]
        (got,), state = _decode(m, x, [prompt])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert state["length"].tolist() == [TOTAL]
    assert set(state) == {"length", *m.state_names}


@pytest.mark.parametrize("name", CAUSAL)
def test_a_batch_of_two_prompt_lengths(name):
    """Rows at different positions: each equals the causal forward of its own sequence alone."""
    torch.manual_seed(1)
    m = small_attention(name, causal=True).eval()
    x = torch.randn(2, TOTAL, D_MODEL)
    with torch.no_grad():
        rows, _ = _decode(m, x, [5, 19])
        for i in range(2):
            n = len(rows[i])
            torch.testing.assert_close(rows[i], m(x[i : i + 1, :n])[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", CAUSAL)
def test_the_state_reaches_back(name):
    """The state is used: changing the prompt changes a later step (so the equality above is not vacuous)."""
    torch.manual_seed(2)
    m = small_attention(name, causal=True).eval()
    x = torch.randn(1, 10, D_MODEL)
    with torch.no_grad():
        _, s1 = m.prefill(x[:, :9])
        x2 = x.clone()
        x2[:, 8] += 3.0
        _, s2 = m.prefill(x2[:, :9])
        assert not torch.allclose(m.step(x[:, 9], s1)[0], m.step(x[:, 9], s2)[0])


def test_decoding_needs_a_causal_layer():
    m = small_attention("full", causal=False)
    with pytest.raises(ValueError, match="causal"):
        m.prefill(torch.randn(1, 4, D_MODEL))


def test_a_state_of_another_variant_is_refused():
    full, lin = small_attention("full", causal=True).eval(), small_attention("linear", causal=True).eval()
    _, state = full.prefill(torch.randn(1, 4, D_MODEL))
    with pytest.raises(ValueError, match="'kv'"):
        lin.step(torch.randn(1, D_MODEL), state)
    with pytest.raises(ValueError, match=r"shape \(B, 32\), got \(1, 1, 32\)"):
        full.step(torch.randn(1, 1, D_MODEL), state)


def _lm(layers=None, **over):
    cfg = dict(
        attention="full", d_model=D_MODEL, n_heads=4, n_layers=2, d_ff=48, vocab_size=23, max_len=MAX_LEN,
        causal=True, head="lm",
    )  # fmt: skip
    cfg.update(over)
    if layers is not None:
        cfg.update(layers=layers, n_layers=len(layers))
    return xsearch.build_model(xsearch.ModelConfig(**cfg)).eval()


def _small_layer(name):
    return {"attention": name, "attention_params": dict(xsearch.attention_spec(name).small_params)}


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(lambda: _lm([_small_layer("linear"), _small_layer("local"), _small_layer("xl")]), id="per-layer"),
        pytest.param(
            lambda: _lm(attention="performer", attention_params={"nb_features": 16}, weight_sharing="all", n_layers=3),
            id="shared",
        ),  # fmt: skip
        pytest.param(lambda: _lm(pos_encoding="learned"), id="learned-positions"),
        pytest.param(lambda: _lm(pos_encoding="nested_sinusoidal"), id="nested-sinusoidal-positions"),
    ],
)
def test_model_prefill_and_step_equal_forward(model):
    torch.manual_seed(3)
    m = model()
    ids = torch.randint(1, 23, (2, 30))
    lens = [7, 12]
    with torch.no_grad():
        expected = [m(ids[i : i + 1])[0] for i in range(2)]
        mask = torch.arange(12)[None] < torch.tensor(lens)[:, None]
        logits, state = m.prefill(ids[:, :12] * mask, mask)
        for i, n in enumerate(lens):
            torch.testing.assert_close(logits[i, :n], expected[i][:n], atol=1e-4, rtol=1e-4)
        for j in range(10):
            nxt = torch.stack([ids[i, lens[i] + j] for i in range(2)])
            out, state = m.step(nxt, state)
            for i, n in enumerate(lens):
                torch.testing.assert_close(out[i], expected[i][n + j], atol=1e-4, rtol=1e-4)
    assert len(state["layers"]) == m.config.n_layers


def test_model_decoding_errors():
    with pytest.raises(ValueError, match="causal language model"):
        _lm(causal=False, head="classify", n_classes=3).prefill(torch.ones(1, 3, dtype=torch.long))
    m = _lm()
    _, state = m.prefill(torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="1-D"):
        m.step(torch.ones(1, 1, dtype=torch.long), state)
    with pytest.raises(ValueError, match="vocabulary"):
        m.step(torch.tensor([99]), state)
    _, full = m.prefill(torch.ones(1, MAX_LEN, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len"):
        m.step(torch.tensor([1]), full)
