"""The SuperTransformer: subnets run with its weights, extraction parity for every variant alone and mixed
per layer, save/load, training through subnets, mismatches."""

import json
import random

import pytest
import torch
import yaml

import xsearch
from tests.conftest import MAX_LEN
from xsearch.model import XSearchModel
from xsearch.search_spaces import RandomDraw, load_space
from xsearch.supernet import (
    SubnetMismatchError,
    build_supernet,
    extract_subnet,
    load_supernet,
    save_supernet,
    warm_start,
)
from xsearch.supernet.layout import inherited_tensors

FIELDS = {"vocab_size": 20, "max_len": MAX_LEN, "head": "classify", "n_classes": 5}


def space_file(tmp_path, attention, *, per_layer=False, name="s", model=None):
    doc = {
        "name": name,
        "per_layer": per_layer,
        "reference": {"attention": next(iter(attention)), "d_model": 32, "n_layers": 2, "n_heads": 2, "ffn_ratio": 2},
        "model": {"d_model": [16, 32], "n_layers": [1, 2], "n_heads": [2, 4], "ffn_ratio": [1, 2], **(model or {})},
        "attention": attention,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def variant_choices(name, causal=False):
    """The variant's small parameters, with a second, smaller value of each size parameter that still builds."""
    small = dict(xsearch.attention_spec(name).small_params)
    out = {p: [v] for p, v in small.items()}
    for p, v in small.items():
        if isinstance(v, int) and not isinstance(v, bool) and v >= 4:
            try:
                xsearch.build_attention(name, 16, 2, causal=causal, max_len=MAX_LEN, **{**small, p: v // 2})
            except ValueError:
                continue
            out[p] = [v, v // 2]
    return out


def batch(n=MAX_LEN):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 20, (3, n), generator=g)
    mask = torch.ones(3, n, dtype=torch.bool)
    mask[1, n // 2 :] = False
    ids[1, n // 2 :] = 0
    return ids, mask


def draws(space, fields, n, seed=0):
    rng = random.Random(seed)
    return [space.suggest(RandomDraw(rng), fields) for _ in range(n)]


def assert_extraction_parity(sn, cfgs, fields):
    ids, mask = batch()
    sn.eval()
    for cfg in cfgs:
        model = extract_subnet(sn, cfg)
        assert type(model) is XSearchModel and model.config == cfg
        with torch.no_grad():
            want = sn(ids, mask, subnet=cfg)
            got = model(ids, mask)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        # the plain model holds exactly the subnet's weights: leading slices of the supernet's tensors
        tensors = sn.subnet_tensors(cfg)
        for name, t in model.state_dict().items():
            if name in tensors:
                assert torch.equal(t, tensors[name]), name


def assert_warm_start_round_trip(sn, cfg):
    """Warm-start ``sn`` from a new model of ``cfg``: the supernet then runs it as the model does, and extracts it."""
    torch.manual_seed(7)  # weights the supernet does not hold anywhere
    model = xsearch.build_model(cfg).eval()
    warm_start(sn, model)
    ids, mask = batch()
    with torch.no_grad():
        torch.testing.assert_close(sn.eval()(ids, mask, subnet=cfg), model(ids, mask), atol=1e-5, rtol=0)
    for name, t in extract_subnet(sn, cfg).state_dict().items():
        torch.testing.assert_close(t, model.state_dict()[name], atol=1e-6, rtol=0)


def modes():
    out = [pytest.param(n, False, id=n) for n in xsearch.list_attentions()]
    return out + [pytest.param(n, True, id=f"{n}-causal") for n in ("local", "linear", "performer", "xl", "routing")]


@pytest.mark.parametrize("head_layout", ["leading", "per_head"])
@pytest.mark.parametrize("name,causal", modes())
def test_every_variant_extracts_with_parity(name, causal, head_layout, tmp_path):
    fields = dict(FIELDS)
    if causal:
        fields = {"vocab_size": 20, "max_len": MAX_LEN, "head": "lm", "causal": True}
    space = load_space(space_file(tmp_path, {name: variant_choices(name, causal)}), causal=causal, max_len=MAX_LEN)
    sn = build_supernet(space, fields, head_layout=head_layout)
    cfgs = draws(space, fields, 4)
    assert {c.d_model for c in cfgs} | {c.n_heads for c in cfgs} > {32}  # smaller widths or heads are drawn
    assert_extraction_parity(sn, cfgs, fields)


@pytest.mark.parametrize("width_scaling,head_layout", [("none", "leading"), ("fan_in", "leading"),
                                                       ("fan_in", "per_head")])  # fmt: skip
def test_mixed_per_layer_subnets_extract_with_parity(tmp_path, width_scaling, head_layout):
    variants = ["full", "local", "linformer", "performer", "set", "synthesizer", "xl", "bigbird", "sinkhorn"]
    space = load_space(space_file(tmp_path, {n: variant_choices(n) for n in variants}, per_layer=True),
                       max_len=MAX_LEN)  # fmt: skip
    sn = build_supernet(space, FIELDS, width_scaling=width_scaling, head_layout=head_layout)
    cfgs = [c for c in draws(space, FIELDS, 30) if c.per_layer][:6]
    assert len(cfgs) == 6 and len({e["attention"] for c in cfgs for e in c.layers}) >= 5
    assert_extraction_parity(sn, cfgs, FIELDS)
    # a layer's own tensors belong to its variant in that layer: two layers of one variant do not share them
    own = [n for n in sn.shapes if n.startswith(("layers.0.linformer.", "layers.1.linformer."))]
    assert sorted(own) == [
        "layers.0.linformer.E",
        "layers.0.linformer.F",
        "layers.1.linformer.E",
        "layers.1.linformer.F",
    ]


def test_nested_sinusoidal_subnets_of_every_width_share_one_position_signal(tmp_path):
    space = load_space(space_file(tmp_path, {"full": {}}, model={"pos_encoding": ["nested_sinusoidal"]}),
                       max_len=MAX_LEN)  # fmt: skip
    sn = build_supernet(space, FIELDS)
    cfgs = draws(space, FIELDS, 8)
    assert {c.pos_encoding for c in cfgs} == {"nested_sinusoidal"} and {c.d_model for c in cfgs} == {16, 32}
    assert_extraction_parity(sn, cfgs, FIELDS)
    tables = {c.d_model: extract_subnet(sn, c).pos_table for c in cfgs}
    torch.testing.assert_close(tables[32][:, :16], tables[16], atol=0, rtol=0)


def test_extracted_subnet_trains_saves_and_exports(tmp_path):
    from xsearch.export import to_onnx

    space = load_space("tiny", max_len=MAX_LEN)
    sn = build_supernet(space, FIELDS)
    cfg = draws(space, FIELDS, 1, seed=3)[0]
    model = extract_subnet(sn, cfg)
    xsearch.save_model(model, tmp_path / "m")
    loaded = xsearch.load_model(tmp_path / "m")
    ids, mask = batch()
    torch.testing.assert_close(loaded(ids, mask), sn.eval()(ids, mask, subnet=cfg), atol=1e-5, rtol=0)
    assert to_onnx(loaded, tmp_path / "m.onnx").max_abs_diff <= 1e-4


def test_training_a_subnet_trains_only_its_slices():
    space = load_space("tiny", max_len=MAX_LEN)
    sn = build_supernet(space, FIELDS)
    small = space.reference_config(FIELDS)
    small = xsearch.ModelConfig.from_dict({**small.to_dict(), "d_model": 32, "n_layers": 1, "n_heads": 2,
                                           "d_ff": 32})  # fmt: skip
    before = {n: sn.tensor(n).detach().clone() for n in sn.shapes}
    ids, mask = batch()
    sn.train()
    loss = sn(ids, mask, subnet=small).logsumexp(-1).mean()
    loss.backward()
    fc1 = sn.tensor("layers.0.ffn.fc1.weight")
    assert fc1.grad[:32, :32].abs().sum() > 0 and fc1.grad[32:].abs().sum() == 0 and fc1.grad[:, 32:].abs().sum() == 0
    assert sn.tensor("layers.1.ffn.fc1.weight").grad is None  # the second layer is not in this subnet
    assert all(torch.equal(before[n], sn.tensor(n)) for n in sn.shapes)  # (no step taken: nothing moved)


def test_save_load_round_trip_and_a_foreign_folder(tmp_path):
    space = load_space(space_file(tmp_path, {"linformer": {"k": [16, 32]}, "performer": {"nb_features": [8, 16]}},
                                  per_layer=True), max_len=MAX_LEN)  # fmt: skip
    sn = build_supernet(space, FIELDS, seed=4)
    save_supernet(sn, tmp_path / "sn")
    again = load_supernet(tmp_path / "sn")
    assert again.shapes == sn.shapes and again.space.to_yaml() == sn.space.to_yaml()
    assert all(torch.equal(again.tensor(n), sn.tensor(n)) for n in sn.shapes)
    ids, mask = batch()
    for cfg in draws(space, FIELDS, 3):
        torch.testing.assert_close(again(ids, mask, subnet=cfg), sn.eval()(ids, mask, subnet=cfg), atol=0, rtol=0)
    xsearch.save_model(extract_subnet(sn, cfg), tmp_path / "plain")
    with pytest.raises(ValueError, match="is not a saved supernet"):
        load_supernet(tmp_path / "plain")
    with pytest.raises(FileNotFoundError, match="nope"):
        load_supernet(tmp_path / "nope")


def test_subnets_outside_the_space_or_task_are_refused(tmp_path):
    space = load_space("tiny", max_len=MAX_LEN)
    sn = build_supernet(space, FIELDS)
    ref = space.reference_config(FIELDS).to_dict()
    with pytest.raises(SubnetMismatchError, match="attention 'reformer'.*does not hold"):
        sn(*batch(), subnet={**ref, "attention": "reformer", "attention_params": {}})
    with pytest.raises(SubnetMismatchError, match=r"d128.*not in the supernet's space 'tiny'"):
        sn(*batch(), subnet={**ref, "d_model": 128, "d_ff": 256})
    with pytest.raises(SubnetMismatchError, match="n_classes=3, but the supernet was built for n_classes=5"):
        extract_subnet(sn, {**ref, "n_classes": 3})


def test_warm_start_is_the_inverse_of_extraction(tmp_path):
    """A trained model's weights go into their leading slices (so the supernet runs that subnet as the model
    does); every other weight, of other variants, layers or widths, is left as it was."""
    variants = ["full", "linformer", "set"]
    space = load_space(space_file(tmp_path, {n: variant_choices(n) for n in variants}, per_layer=True),
                       max_len=MAX_LEN)  # fmt: skip
    sn = build_supernet(space, FIELDS)
    before = {name: sn.tensor(name).detach().clone() for name in sn.shapes}
    narrow = [c for c in draws(space, FIELDS, 40, seed=1) if c.d_model == 16 and c.n_layers == 2]
    cfg = next(c for c in narrow if "linformer" in {e["attention"] for e in c.layers})
    torch.manual_seed(7)  # weights the supernet does not hold anywhere
    model = xsearch.build_model(cfg).eval()
    copied = warm_start(sn, model)
    assert copied == sum(t.numel() for _, t in inherited_tensors(model))
    ids, mask = batch()
    with torch.no_grad():
        torch.testing.assert_close(sn.eval()(ids, mask, subnet=cfg), model(ids, mask), atol=1e-5, rtol=0)
    for name, t in extract_subnet(sn, cfg).state_dict().items():
        assert torch.equal(t, model.state_dict()[name]), name
    held = sn.subnet_tensors(cfg)
    touched = {sn._template(cfg)[1][n][0] for n in held}
    changed = {name for name in sn.shapes if not torch.equal(sn.tensor(name), before[name])}
    assert changed <= touched  # (the model's tensors' supernet tensors, and no other; norms start equal)
    assert {n for n in touched if not n.split(".")[-2].startswith("ln")} <= changed
    for name in touched:  # and within them, only the leading slice
        shape = next(s.shape for s in sn._template(cfg)[1].values() if s.source == name)
        rest = torch.ones(sn.shapes[name], dtype=torch.bool)
        rest[tuple(slice(0, k) for k in shape)] = False
        assert torch.equal(sn.tensor(name)[rest], before[name][rest]), name
    # a layer's own tensors went to that layer's variant
    own = {n for n in changed if n.count(".") == 3}
    assert own and own == {f"layers.{i}.{e['attention']}.{n.split('.')[-1]}" for n in own
                           for i, e in enumerate(cfg.layers) if n.startswith(f"layers.{i}.")}  # fmt: skip


def test_warm_start_refuses_a_model_of_another_task_or_space(tmp_path):
    space = load_space("tiny", max_len=MAX_LEN)
    sn = build_supernet(space, FIELDS)
    cfg = draws(space, FIELDS, 1)[0]
    other_task = xsearch.build_model(type(cfg).from_dict({**cfg.to_dict(), "vocab_size": 30}))
    with pytest.raises(SubnetMismatchError, match="vocab_size=30"):
        warm_start(sn, other_task)
    wide = xsearch.build_model(type(cfg).from_dict({**cfg.to_dict(), "d_model": 512, "head_dim": None}))
    with pytest.raises(SubnetMismatchError, match="is not in the supernet's space"):
        warm_start(sn, wide)


def test_fan_in_scaling_multiplies_each_narrower_linear_slice_by_the_ratio_of_initial_scales(tmp_path):
    """Only nn.Linear weights that take fewer inputs than the supernet's are scaled, by sqrt(held / own inputs);
    biases, norms, embeddings and full-width weights stay the plain slices, and gradients reach the supernet."""
    space = load_space(space_file(tmp_path, {"full": {}, "linformer": {"k": [8, 16]}}), max_len=MAX_LEN)
    plain, scaled = build_supernet(space, FIELDS, seed=2), build_supernet(space, FIELDS, seed=2, width_scaling="fan_in")
    assert all(torch.equal(plain.tensor(n), scaled.tensor(n)) for n in plain.shapes)  # (the same weights held)
    ref = space.reference_config(FIELDS).to_dict()
    cfg = xsearch.ModelConfig.from_dict({**ref, "attention": "linformer", "attention_params": {"k": 8},
                                         "d_model": 16, "n_heads": 2, "head_dim": None, "d_ff": 16})  # fmt: skip
    model = extract_subnet(plain, cfg)
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    a, b = ({k: t.detach() for k, t in sn.subnet_tensors(cfg).items()} for sn in (plain, scaled))
    factors = {}
    for name in a:
        ratio = (b[name] / a[name])[a[name] != 0]
        if not len(ratio):  # (a tensor of zeros: biases)
            assert torch.equal(a[name], b[name]), name
            ratio = torch.ones(1)
        assert torch.allclose(ratio, ratio[0].expand_as(ratio), atol=1e-6), name
        factors[name] = round(float(ratio[0]), 5)
    assert {n for n, f in factors.items() if f != 1.0} == linear  # fc1, fc2, q/k/v/out, the classifier: 32 -> 16
    assert factors["blocks.0.ffn.fc2.weight"] == round((64 / 16) ** 0.5, 5)  # (d_ff: held 64 = 32 x 2, own 16)
    assert factors["blocks.0.attn.q_proj.weight"] == round(2**0.5, 5)
    assert factors["blocks.0.attn.E"] == 1.0  # (Linformer's own projection over the length: not a Linear)
    # the subnet's Linear weights now spread as a model of its own width draws them (PyTorch: 1/sqrt(3 inputs))
    fc1 = b["blocks.0.ffn.fc1.weight"]
    assert abs(float(fc1.std()) * (3 * 16) ** 0.5 - 1) < 0.15
    # training the subnet trains the supernet's leading slice through the factor, and nothing beyond it
    ids, mask = batch()
    scaled.train()
    scaled(ids, mask, subnet=cfg).logsumexp(-1).mean().backward()
    assert scaled.tensor("layers.0.ffn.fc1.weight").grad[:16, :16].abs().sum() > 0
    assert scaled.tensor("layers.0.ffn.fc1.weight").grad[16:].abs().sum() == 0


def test_fan_in_scaling_survives_save_load_warm_start_and_training(tmp_path):
    from xsearch.errors import XSearchError
    from xsearch.supernet import SupernetTrainSettings
    from xsearch.supernet.train import train_supernet
    from xsearch.tasks import get_task

    space = load_space(space_file(tmp_path, {"full": {}, "local": variant_choices("local")}), max_len=MAX_LEN)
    sn = build_supernet(space, FIELDS, width_scaling="fan_in")
    assert "width_scaling='fan_in'" in repr(sn)
    save_supernet(sn, tmp_path / "sn")
    again = load_supernet(tmp_path / "sn")
    assert again.width_scaling == "fan_in"
    ids, mask = batch()
    for cfg in draws(space, FIELDS, 4):
        torch.testing.assert_close(again(ids, mask, subnet=cfg), sn.eval()(ids, mask, subnet=cfg), atol=0, rtol=0)
    # a folder saved before the option reads as plain slices; an unknown value is named
    doc = json.loads((tmp_path / "sn" / "config.json").read_text())
    (tmp_path / "sn" / "config.json").write_text(json.dumps({k: v for k, v in doc.items() if k != "width_scaling"}))
    assert load_supernet(tmp_path / "sn").width_scaling == "none"
    (tmp_path / "sn" / "config.json").write_text(json.dumps({**doc, "width_scaling": "fan_out"}))
    with pytest.raises(XSearchError, match="config.json: unknown width_scaling 'fan_out'"):
        load_supernet(tmp_path / "sn")
    with pytest.raises(ValueError, match="unknown width_scaling 'sqrt'"):
        build_supernet(space, FIELDS, width_scaling="sqrt")

    # warm start divides by the factor: the supernet then runs the model as the model does
    assert_warm_start_round_trip(sn, next(c for c in draws(space, FIELDS, 40, seed=1) if c.d_model == 16))

    # training takes the width scaling from its settings, and refuses a supernet built otherwise
    task = get_task("listops", n_train=32, n_valid=8, n_test=8, min_len=8, max_len=MAX_LEN)
    fields = task.model_fields()
    space = load_space("tiny", max_len=MAX_LEN)
    with pytest.raises(ValueError, match="built with width_scaling='none', the settings say 'fan_in'"):
        train_supernet(build_supernet(space, fields), task, SupernetTrainSettings(steps=1, width_scaling="fan_in"),
                       progress=False)  # fmt: skip
    record = train_supernet(build_supernet(space, fields, width_scaling="fan_in"), task,
                            SupernetTrainSettings(steps=2, batch_size=4, width_scaling="fan_in"),
                            out=tmp_path / "trained", progress=False)  # fmt: skip
    assert record["steps"] == 2 and load_supernet(tmp_path / "trained").width_scaling == "fan_in"


def test_per_head_layout_holds_head_h_of_every_width_in_block_h(tmp_path):
    """Laid out per head, head h of a narrower subnet is the leading part of head h of a wider one (a leading
    slice puts a d16 subnet's head 1 inside the d32 subnet's head 0), and a subnet trains only its heads' rows."""
    space = load_space(space_file(tmp_path, {"full": {}}), max_len=MAX_LEN)
    sn = build_supernet(space, FIELDS, head_layout="per_head")
    # blocks: heads 0-1 as wide as the widest such head (d32 / 2 = 16), heads 2-3 as d32 / 4 = 8
    assert sn.shapes["layers.0.attn.q_proj.weight"] == (48, 32)
    assert sn.shapes["layers.0.attn.q_proj.bias"] == (48,) and sn.shapes["layers.0.attn.out_proj.weight"] == (32, 48)
    assert sn.shapes["layers.0.attn.out_proj.bias"] == (32,) and sn.shapes["layers.0.ffn.fc1.weight"] == (64, 32)
    ref = space.reference_config(FIELDS).to_dict()

    def cfg(d, h):
        return xsearch.ModelConfig.from_dict({**ref, "d_model": d, "n_heads": h, "head_dim": None, "d_ff": d})

    def heads(net, c):
        t, hd = net.subnet_tensors(c), c.d_model // c.n_heads
        q, o = t["blocks.0.attn.q_proj.weight"], t["blocks.0.attn.out_proj.weight"]
        return [(q[i * hd : (i + 1) * hd], o[:, i * hd : (i + 1) * hd]) for i in range(c.n_heads)]

    for n_heads in (2, 4):
        narrow, wide = heads(sn, cfg(16, n_heads)), heads(sn, cfg(32, n_heads))
        hd = 16 // n_heads
        for (qn, on), (qw, ow) in zip(narrow, wide, strict=True):
            assert torch.equal(qn, qw[:hd, :16]) and torch.equal(on, ow[:16, :hd])
    plain = build_supernet(space, FIELDS)  # (the leading layout: the narrow head 1 is part of the wide head 0)
    narrow, wide = heads(plain, cfg(16, 2)), heads(plain, cfg(32, 2))
    assert torch.equal(narrow[1][0], wide[0][0][8:16, :16]) and not torch.equal(narrow[1][0], wide[1][0][:8, :16])
    assert_extraction_parity(sn, [cfg(16, 2), cfg(16, 4), cfg(32, 2), cfg(32, 4)], FIELDS)

    sn.train()
    sn(*batch(), subnet=cfg(16, 2)).logsumexp(-1).mean().backward()
    grad = sn.tensor("layers.0.attn.q_proj.weight").grad
    rows = torch.zeros(48, dtype=torch.bool)
    rows[0:8] = rows[16:24] = True  # the leading 8 of blocks 0 and 1
    assert grad[rows, :16].abs().sum() > 0 and grad[~rows].abs().sum() == 0 and grad[:, 16:].abs().sum() == 0
    out = sn.tensor("layers.0.attn.out_proj.weight").grad
    assert out[:16][:, rows].abs().sum() > 0 and out[:, ~rows].abs().sum() == 0


def test_per_head_layout_survives_save_load_warm_start_and_training(tmp_path):
    from xsearch.errors import XSearchError
    from xsearch.supernet import SupernetTrainSettings
    from xsearch.supernet.train import train_supernet
    from xsearch.tasks import get_task

    variants = {"full": {}, "reformer": variant_choices("reformer"), "longformer": variant_choices("longformer")}
    space = load_space(space_file(tmp_path, variants), max_len=MAX_LEN)
    sn = build_supernet(space, FIELDS, width_scaling="fan_in", head_layout="per_head")
    assert "width_scaling='fan_in', head_layout='per_head'" in repr(sn)
    assert_extraction_parity(sn, draws(space, FIELDS, 8), FIELDS)  # (reformer's q and k are one tensor)
    save_supernet(sn, tmp_path / "sn")
    again = load_supernet(tmp_path / "sn")
    assert again.layout == {"width_scaling": "fan_in", "head_layout": "per_head"} and again.shapes == sn.shapes
    ids, mask = batch()
    for cfg in draws(space, FIELDS, 4):
        torch.testing.assert_close(again(ids, mask, subnet=cfg), sn.eval()(ids, mask, subnet=cfg), atol=0, rtol=0)
    doc = json.loads((tmp_path / "sn" / "config.json").read_text())
    (tmp_path / "sn" / "config.json").write_text(json.dumps({**doc, "head_layout": "per_row"}))
    with pytest.raises(XSearchError, match="config.json: unknown head_layout 'per_row'"):
        load_supernet(tmp_path / "sn")
    (tmp_path / "sn" / "config.json").write_text(json.dumps({k: v for k, v in doc.items() if k != "head_layout"}))
    with pytest.raises(XSearchError, match="do not match its config.json"):  # (a leading layout's shapes)
        load_supernet(tmp_path / "sn")

    # warm start writes a model's heads into their rows (divided by the fan-in factor) and nothing else
    narrow = next(c for c in draws(space, FIELDS, 40, seed=1) if c.d_model == 16 and c.n_heads == 4)
    before = sn.tensor("layers.0.attn.q_proj.weight").detach().clone()
    assert_warm_start_round_trip(sn, narrow)
    rows = torch.zeros(48, dtype=torch.bool)
    for start in (0, 16, 32, 40):  # the leading 4 of each of the four blocks
        rows[start : start + 4] = True
    after = sn.tensor("layers.0.attn.q_proj.weight").detach()
    assert not torch.equal(after[rows, :16], before[rows, :16]) and torch.equal(after[~rows], before[~rows])
    assert torch.equal(after[:, 16:], before[:, 16:])

    task = get_task("listops", n_train=32, n_valid=8, n_test=8, min_len=8, max_len=MAX_LEN)
    fields, tiny = task.model_fields(), load_space("tiny", max_len=MAX_LEN)
    with pytest.raises(ValueError, match="built with head_layout='leading', the settings say 'per_head'"):
        train_supernet(build_supernet(tiny, fields), task, SupernetTrainSettings(steps=1, head_layout="per_head"),
                       progress=False)  # fmt: skip
    settings = SupernetTrainSettings(steps=2, batch_size=4, head_layout="per_head")
    record = train_supernet(build_supernet(tiny, fields, **settings.layout), task, settings, out=tmp_path / "trained",
                            progress=False)  # fmt: skip
    assert record["steps"] == 2 and load_supernet(tmp_path / "trained").head_layout == "per_head"
