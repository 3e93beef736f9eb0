import json

import pytest
import torch

import xsearch
from xsearch.model import count_parameters, sinusoidal_positions


def cfg(**kw):
    base = dict(vocab_size=30, max_len=48, d_model=32, n_layers=3, n_heads=4, n_classes=5)
    return xsearch.ModelConfig(**{**base, **kw})


def test_config_round_trip_through_json():
    c = cfg(attention="performer", attention_params={"nb_features": 16}, weight_sharing="ffn")
    again = xsearch.ModelConfig.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again == c
    assert again.attention_params["redraw"] == 0  # defaults filled in
    assert c.head_dim == 8 and c.d_ff == 128


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(d_model=0), "d_model"),
        (dict(d_model=30), "divisible"),
        (dict(head="regress"), "head"),
        (dict(weight_sharing="some"), "weight_sharing"),
        (dict(attention="nope"), "nope"),
        (dict(attention="local", attention_params={"bogus": 1}), "bogus"),
        (dict(attention="linformer", causal=True, head="lm"), "cannot be causal"),
        (dict(head="lm"), "causal=True"),
        (dict(dropout=1.5), "dropout"),
        (dict(n_classes=1), "n_classes"),
        (dict(pooling="cls"), "pooling.*'cls'"),
    ],
)
def test_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        cfg(**kw)


def test_from_dict_rejects_unknown_field():
    d = cfg().to_dict()
    d["n_layer"] = 2
    with pytest.raises(ValueError, match="n_layer"):
        xsearch.ModelConfig.from_dict(d)


def test_output_shapes_and_pooling_ignores_padding():
    m = xsearch.build_model(cfg()).eval()
    ids = torch.randint(1, 30, (2, 20))
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 12:] = False
    out = m(ids, mask)
    assert out.shape == (2, 5)
    ids2 = ids.clone()
    ids2[1, 12:] = torch.randint(1, 30, (8,))
    torch.testing.assert_close(m(ids2, mask), out)
    # a padded sequence classifies like the same sequence unpadded
    torch.testing.assert_close(m(ids[1:, :12])[0], out[1], atol=1e-5, rtol=1e-4)
    lm = xsearch.build_model(cfg(head="lm", causal=True)).eval()
    assert lm(ids, mask).shape == (2, 20, 30)


def test_first_token_pooling_reads_position_zero_only():
    torch.manual_seed(0)
    m = xsearch.build_model(cfg(pooling="first")).eval()
    ids = torch.randint(1, 30, (2, 20))
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 12:] = False
    out = m(ids, mask)
    h = m.hidden_states(ids, mask)
    torch.testing.assert_close(out, m.head(h[:, 0]))
    torch.testing.assert_close(m(ids[1:, :12])[0], out[1], atol=1e-5, rtol=1e-4)  # padding still ignored
    mean = xsearch.build_model(cfg())
    mean.load_state_dict(m.state_dict())  # the same weights: only the pooling differs
    assert not torch.allclose(mean.eval()(ids, mask), out)
    assert "pool=first" in xsearch.describe_config(m.config) and "pool" not in xsearch.describe_config(mean.config)


def test_weight_sharing_reduces_parameters_and_is_saved(tmp_path):
    counts = {ws: count_parameters(xsearch.build_model(cfg(weight_sharing=ws))) for ws in xsearch.config.WEIGHT_SHARING}
    assert counts["all"] < counts["attention"] < counts["none"]
    assert counts["all"] < counts["ffn"] < counts["none"]
    block = count_parameters(xsearch.build_model(cfg(n_layers=1))) - count_parameters(
        xsearch.build_model(cfg(n_layers=1, weight_sharing="all"))
    )
    assert block == 0
    m = xsearch.build_model(cfg(weight_sharing="attention")).eval()
    assert m.blocks[0].attn is m.blocks[2].attn and m.blocks[0].ffn is not m.blocks[2].ffn
    xsearch.save_model(m, tmp_path / "m")
    loaded = xsearch.load_model(tmp_path / "m")
    assert loaded.blocks[0].attn is loaded.blocks[1].attn
    ids = torch.randint(1, 30, (2, 20))
    torch.testing.assert_close(loaded(ids), m(ids), atol=0, rtol=0)


def test_learned_positions_and_bad_inputs():
    m = xsearch.build_model(cfg(pos_encoding="learned")).eval()
    # the one-line description names a position encoding that is not the default
    learned, plain = xsearch.describe_config(m.config), xsearch.describe_config(cfg())
    assert learned.endswith(" pos=learned")
    assert "pos=" not in plain and plain != learned
    with pytest.raises(ValueError, match="max_len=48"):
        m(torch.randint(1, 30, (1, 49)))
    with pytest.raises(ValueError, match="2-D"):
        m(torch.randint(1, 30, (49,)))
    with pytest.raises(ValueError, match="token id 30"):
        m(torch.full((1, 4), 30))
    with pytest.raises(ValueError, match="int64"):
        m(torch.ones(1, 4))


def test_nested_sinusoidal_positions_nest_across_widths_with_the_plain_frequencies():
    tables = {d: sinusoidal_positions(300, d, nested=True) for d in (16, 32, 64, 128)}
    plain = {d: sinusoidal_positions(300, d) for d in tables}
    for d, table in tables.items():
        torch.testing.assert_close(tables[128][:, :d], table, atol=0, rtol=0)  # a narrower width's: leading columns
        # the plain table's frequencies in another order (d / 2 is a power of two): each row, sorted, the same
        torch.testing.assert_close(table.sort(dim=1).values, plain[d].sort(dim=1).values, atol=1e-5, rtol=0)
        if d < 128:  # what the plain order does not do: its narrower table holds other frequencies
            assert (plain[128][:, :d] - plain[d]).abs().max() > 0.5
    torch.testing.assert_close(tables[16][:, :2], plain[16][:, :2])  # pair 0: exponent 0 in both orders
    # the exponents of the pairs 1, 2, 3: 1/2, 1/4, 3/4 (the van der Corput order)
    pos = torch.arange(300.0)
    for k, e in [(1, 0.5), (2, 0.25), (3, 0.75)]:
        torch.testing.assert_close(tables[16][:, 2 * k], torch.sin(pos / 10000**e), atol=1e-4, rtol=0)
    # a model with it: the table is its buffer, not saved (it follows from the config), and it runs
    m = xsearch.build_model(cfg(pos_encoding="nested_sinusoidal")).eval()
    torch.testing.assert_close(m.pos_table, sinusoidal_positions(48, 32, nested=True), atol=0, rtol=0)
    assert "pos_table" not in m.state_dict()
    assert m(torch.randint(1, 30, (2, 10))).shape == (2, 5)


def test_save_is_atomic_and_load_errors(tmp_path):
    m = xsearch.build_model(cfg())
    out = xsearch.save_model(m, tmp_path / "m")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    with pytest.raises(FileNotFoundError, match="nowhere"):
        xsearch.load_model(tmp_path / "nowhere")
    (out / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="malformed JSON"):
        xsearch.load_model(out)
    xsearch.save_model(m, out)
    (out / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cannot read weights"):
        xsearch.load_model(out)
    other = xsearch.build_model(cfg(d_model=64))
    xsearch.save_model(other, tmp_path / "o")
    (tmp_path / "o" / "config.json").write_text((out / "config.json").read_text())
    with pytest.raises(ValueError):
        xsearch.load_model(tmp_path / "o")
