"""Per-layer models (``ModelConfig.layers``) through build, save/load, prune, adapters, export, int8,
latency features and cache, reports; per-layer search spaces."""

import random

import numpy as np
import optuna
import pytest
import torch

import xsearch
from tests.conftest import MAX_LEN
from xsearch.compress import add_adapters, prune
from xsearch.config import describe_config
from xsearch.export import Predictor, quantize_onnx, to_onnx
from xsearch.latency import measure
from xsearch.latency.cache import cache_key
from xsearch.latency.predictor.features import architecture_features
from xsearch.search_spaces import RandomDraw, SpaceError, load_space
from xsearch.tasks import get_task

MIXED = [
    {"attention": "local", "attention_params": {"block_size": 16}, "n_heads": 2, "d_ff": 48},
    {"attention": "linformer", "attention_params": {"k": 16}, "n_heads": 4, "d_ff": 64},
    {"attention": "performer", "attention_params": {"nb_features": 16}, "n_heads": 8, "d_ff": 32},
    {"attention": "full", "n_heads": 4, "d_ff": 96},
]


@pytest.fixture(scope="module")
def task():
    return get_task("listops", n_train=256, n_valid=64, n_test=64, min_len=8, max_len=MAX_LEN, max_depth=4, seed=3)


def mixed_config(task, layers=MIXED, **kw):
    return xsearch.ModelConfig(**task.model_fields(), d_model=32, n_layers=len(layers), layers=list(layers), **kw)


def mixed_model(task, **kw):
    torch.manual_seed(0)
    return xsearch.build_model(mixed_config(task, **kw)).eval()


def batch(n=MAX_LEN):
    ids = torch.randint(1, 16, (3, n))
    mask = torch.ones(3, n, dtype=torch.bool)
    mask[1, n // 2 :] = False
    ids[1, n // 2 :] = 0
    return ids, mask


def test_each_layer_is_built_as_its_entry_says(task):
    model = mixed_model(task)
    for layer, entry in zip(model.layers(), MIXED, strict=True):
        assert layer.attn.spec.name == entry["attention"]
        assert layer.attn.n_heads == entry["n_heads"] and layer.attn.head_dim == 32 // entry["n_heads"]
        assert layer.ffn.fc1.out_features == entry["d_ff"]
    # entries are stored complete (defaults filled in), so the config round-trips through JSON
    cfg = model.config
    assert cfg.layers[0]["attention_params"] == {"block_size": 16, "lookback": 1}
    assert xsearch.ModelConfig.from_json(cfg.to_json()) == cfg
    assert cfg.per_layer and cfg.layer_configs() == cfg.layers
    assert describe_config(cfg).startswith("d32 L4 [local(block_size=16,lookback=1) H2 ff48 | linformer(")


def test_a_uniform_layers_list_is_the_uniform_model(task):
    uniform = xsearch.ModelConfig(**task.model_fields(), d_model=32, n_layers=2, attention="local",
                                  attention_params={"block_size": 16})  # fmt: skip
    listed = xsearch.ModelConfig(**task.model_fields(), d_model=32, n_layers=2, attention="local",
                                 attention_params={"block_size": 16}, layers=[{}, {}])  # fmt: skip
    assert listed.layers == uniform.layer_configs() and not listed.per_layer
    torch.manual_seed(0)
    a = xsearch.build_model(uniform).eval()
    torch.manual_seed(0)
    b = xsearch.build_model(listed).eval()
    ids, mask = batch()
    torch.testing.assert_close(a(ids, mask), b(ids, mask), atol=0, rtol=0)
    assert describe_config(listed) == describe_config(uniform)
    assert architecture_features(listed, MAX_LEN) == architecture_features(uniform, MAX_LEN)


@pytest.mark.parametrize(
    "layers,match",
    [
        ([{"attention": "nope"}, {}], r"layers\[0\]\.attention: unknown attention 'nope'"),
        ([{}, {"n_heads": 0}], r"layers\[1\]\.n_heads must be a positive int, got 0"),
        ([{}, {"n_heads": 3}], r"layers\[1\]: d_model=32 is not divisible by n_heads=3"),
        ([{}, {"d_ff": -4}], r"layers\[1\]\.d_ff must be a positive int, got -4"),
        ([{"heads": 2}, {}], r"layers\[0\]: unknown key 'heads'"),
        ([{}, {"attention": "local", "attention_params": {"block_size": 9999}}], r"layers\[1\]: .*block_size=9999"),
        ([{}, {"attention": "linear", "attention_params": {"k": 3}}], r"layers\[1\]: .*no parameter 'k'"),
        ([{}, "full"], r"layers\[1\] must be a dict, got 'full'"),
        ([{}], r"layers has 1 entries for n_layers=2"),
    ],
)
def test_a_bad_layer_entry_names_its_index_and_value(task, layers, match):
    with pytest.raises(ValueError, match=match):
        xsearch.ModelConfig(**task.model_fields(), d_model=32, n_layers=2, layers=layers)


def test_causality_and_sharing_are_checked_per_layer(task):
    fields = {**task.model_fields(), "head": "lm", "causal": True}
    fields.pop("n_classes")
    with pytest.raises(ValueError, match=r"layers\[1\]: attention 'linformer' cannot be causal"):
        xsearch.ModelConfig(**fields, d_model=32, n_layers=2, layers=[{}, {"attention": "linformer"}])
    with pytest.raises(ValueError, match=r"layers\[1\]\.attention='local' differs from layer 0's 'full'.*'attention'"):
        mixed_config(task, layers=[{}, {"attention": "local"}], weight_sharing="attention")
    with pytest.raises(ValueError, match=r"layers\[1\]\.d_ff=64 differs .*'ffn'"):
        mixed_config(task, layers=[{}, {"d_ff": 64}], weight_sharing="ffn")
    shared = xsearch.build_model(mixed_config(task, layers=[{"d_ff": 64}, {"attention": "local", "d_ff": 64}],
                                              weight_sharing="ffn"))  # fmt: skip
    assert shared.blocks[0].ffn is shared.blocks[1].ffn and shared.blocks[1].attn.spec.name == "local"


def test_save_load_train_and_adapters(task, tmp_path):
    model = mixed_model(task)
    xsearch.train(model, task, steps=3, batch_size=16, progress=False)
    model.eval()
    ids, mask = batch()
    xsearch.save_model(model, tmp_path / "m")
    loaded = xsearch.load_model(tmp_path / "m")
    assert loaded.config == model.config
    torch.testing.assert_close(loaded(ids, mask), model(ids, mask), atol=0, rtol=0)
    adapted = add_adapters(loaded, kind="lora", size=2)
    lora = {n.split(".")[1] for n, p in adapted.named_parameters() if "lora_" in n}
    assert lora == {"0", "1", "2", "3"}  # every layer's projections, whatever its variant


def test_pruning_a_per_layer_model(task, tmp_path):
    model = mixed_model(task)
    prune(model, heads=0.5, ffn=0.5)
    assert [e["n_heads"] for e in model.config.layers] == [1, 2, 4, 2]
    assert [e["d_ff"] for e in model.config.layers] == [24, 32, 16, 48]
    assert [layer.attn.n_heads for layer in model.layers()] == [1, 2, 4, 2]
    assert model.config.ffn_dims is None
    ids, mask = batch()
    out = model(ids, mask)
    xsearch.save_model(model, tmp_path / "p")
    loaded = xsearch.load_model(tmp_path / "p")
    torch.testing.assert_close(loaded(ids, mask), out, atol=0, rtol=0)
    assert to_onnx(loaded, tmp_path / "p.onnx").max_abs_diff <= 1e-4


def test_export_parity_and_int8(task, tmp_path):
    model = mixed_model(task)
    xsearch.train(model, task, steps=20, batch_size=32, lr=3e-3, progress=False)
    model.eval()
    report = to_onnx(model, tmp_path / "m.onnx", task=task.describe())
    assert report.max_abs_diff <= 1e-4
    ids, mask, _ = next(task.batches("test", 64))
    want = model(ids, mask).detach().numpy()
    np.testing.assert_allclose(Predictor(tmp_path / "m.onnx").logits(ids.numpy(), mask.numpy()), want, atol=1e-4)
    quantize_onnx(tmp_path / "m.onnx", tmp_path / "q.onnx", "dynamic-int8")
    got = Predictor(tmp_path / "q.onnx").logits(ids.numpy(), mask.numpy())
    agree = float((got.argmax(-1) == want.argmax(-1)).mean())
    assert agree > 0.9, agree


def test_latency_features_and_cache_key(task):
    cfg = mixed_config(task)
    feats = architecture_features(cfg, MAX_LEN)
    assert sum(v for k, v in feats.items() if k.startswith("attention=")) == pytest.approx(1.0)
    assert feats["attention=local"] == feats["attention=full"] == pytest.approx(0.25)
    assert feats["log2_n_heads"] == pytest.approx(np.log2(4.5))
    other = mixed_config(task, layers=[MIXED[1], MIXED[0], MIXED[2], MIXED[3]])
    key = cache_key(cfg.to_dict(), "ort-cpu", 1, MAX_LEN, {"cpu": "x"})
    assert key != cache_key(other.to_dict(), "ort-cpu", 1, MAX_LEN, {"cpu": "x"})
    uniform = {k: v for k, v in other.to_dict().items() if k != "layers"}
    assert cache_key(uniform, "ort-cpu", 1, 64, {}) == cache_key({**uniform, "layers": None}, "ort-cpu", 1, 64, {})
    stats = measure(xsearch.build_model(cfg).eval(), "ort-cpu", seq_len=MAX_LEN, warmup=1, repeats=3)
    assert stats.median_ms > 0


def per_layer_space_file(tmp_path, **extra):
    lines = ["name: mixed", "per_layer: true",
             "reference: {attention: full, d_model: 32, n_layers: 2, n_heads: 2, ffn_ratio: 2}",
             "model:", "  d_model: [32]", "  n_layers: [1, 2, 3]", "  n_heads: [2, 4]", "  ffn_ratio: [1, 2]",
             "attention:", "  full: {}", "  local: {block_size: [16, 32]}", "  linear: {}"]  # fmt: skip
    lines += [f"  {k}: {v}" for k, v in extra.items()]
    path = tmp_path / "mixed.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_per_layer_space_draws_each_layer(task, tmp_path):
    space = load_space(per_layer_space_file(tmp_path), max_len=MAX_LEN)
    assert space.per_layer
    assert space.size() == 16 + 16**2 + 16**3  # (full, local x 2 blocks, linear) x 2 heads x 2 ratios per layer
    fields = task.model_fields()
    rng = random.Random(0)
    cfgs = [space.suggest(RandomDraw(rng), fields) for _ in range(40)]
    assert any(c.per_layer and len({e["attention"] for e in c.layers}) > 1 for c in cfgs)
    assert {len(c.layers) for c in cfgs} == {1, 2, 3}
    for c in cfgs:
        assert all(e["d_ff"] in (32, 64) and e["n_heads"] in (2, 4) for e in c.layers)
    # Optuna draws the same names, and the enqueued reference is the reference architecture
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial(space.reference_params())
    ref = space.suggest(study.ask(), fields)
    assert ref.layer_configs() == space.reference_config(fields).layer_configs()
    t = study.ask()
    c = space.suggest(t, fields)
    assert t.params[f"layers.{c.n_layers - 1}.attention"] == c.layers[-1]["attention"]
    (tmp_path / "again.yaml").write_text(space.to_yaml())
    assert load_space(tmp_path / "again.yaml").per_layer


def test_per_layer_space_errors_and_shipped_space(tmp_path):
    with pytest.raises(SpaceError, match="weight_sharing .* per_layer"):
        path = per_layer_space_file(tmp_path)
        shared = path.read_text().replace("  ffn_ratio: [1, 2]", "  ffn_ratio: [1, 2]\n  weight_sharing: [none, all]")
        path.write_text(shared)
        load_space(path)
    path = per_layer_space_file(tmp_path)
    path.write_text(path.read_text().replace("per_layer: true", "per_layer: 1"))
    with pytest.raises(SpaceError, match="per_layer must be true or false, got 1"):
        load_space(path)
    shipped = load_space("per_layer", max_len=512)
    assert shipped.per_layer and len(shipped.attention) == 19
    assert shipped.size() > load_space("default", max_len=512).size() ** 2
