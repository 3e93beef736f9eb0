"""Every variant exports to one ONNX file that matches torch under onnxruntime."""

import json
import logging
import subprocess
import sys

import numpy as np
import pytest
import torch

import xsearch
from xsearch.export import ExportParityError, Predictor, quantize_onnx, read_metadata, to_onnx
from xsearch.tasks import get_task


@pytest.fixture(scope="module")
def task():
    return get_task("listops", n_train=64, n_valid=16, n_test=16, min_len=8, max_len=64, max_depth=4, seed=1)


def tiny_model(task, name, causal=False, **kw):
    torch.manual_seed(0)
    fields = task.model_fields()
    if causal:
        fields.update(head="lm", causal=True)
        fields.pop("n_classes")
    cfg = xsearch.ModelConfig(
        **fields,
        d_model=32,
        n_layers=1,
        n_heads=4,
        attention=name,
        attention_params=dict(xsearch.attention_spec(name).small_params),
        **kw,
    )
    return xsearch.build_model(cfg).eval()


#: Causal variants whose plain (whole-sequence) export is checked here. Every causal variant's decoder export
#: (its prefill graph runs the same causal layers, and its step graph) is checked by tests/test_decoder_export.py;
#: these keep the plain graph of each kind of causal state: none, a block cache, segment memories, hashing.
PLAIN_CAUSAL = ("full", "local", "xl", "compressive", "reformer")


def export_modes():
    out = [pytest.param(n, False, id=n) for n in xsearch.list_attentions()]
    out += [pytest.param(n, True, id=f"{n}-causal") for n in PLAIN_CAUSAL]
    return out


@pytest.mark.parametrize("name,causal", export_modes())
def test_every_variant_exports_with_parity(name, causal, task, tmp_path, caplog):
    model = tiny_model(task, name, causal)
    path = tmp_path / "m.onnx"
    caplog.set_level(logging.WARNING)
    report = to_onnx(model, path, task=task.describe())
    assert [r.getMessage() for r in caplog.records] == []  # the exporter's chatter stays quiet
    assert report.max_abs_diff is not None and report.max_abs_diff <= 1e-4
    assert len(report.lengths_checked) >= 2 and max(report.lengths_checked) == 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # self-contained, no temp left
    assert report.size_bytes == path.stat().st_size
    meta = read_metadata(path)
    assert xsearch.ModelConfig.from_dict(meta["config"]) == model.config
    assert meta["task"]["name"] == "listops" and meta["version"] == xsearch.__version__
    # the Predictor reproduces torch on a new padded batch at a length the check did not use
    p = Predictor(path, threads=1)
    ids = torch.randint(1, 16, (2, 30))
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1, 11:] = False
    ids[1, 11:] = 0
    got = p.logits(ids.numpy(), mask.numpy())
    with torch.no_grad():
        want = model(ids, mask).numpy()
    if causal:
        got, want = got[mask.numpy()], want[mask.numpy()]
    np.testing.assert_allclose(got, want, atol=1e-4)
    preds = p.predict(["[MAX 2 9 [MIN 4 7 ] 0 ]", "[SM 1 2 ]"])
    assert len(preds) == 2 and all(0 < pr.score <= 1 for pr in preds)


@pytest.mark.parametrize(
    "name,params",
    [
        ("synthesizer", {"mode": "random"}),
        ("synthesizer", {"mode": "factorized", "mix": 0.0}),
        ("synthesizer", {"mode": "dense", "mix": 1.0}),
        ("reformer", {"n_hashes": 1}),
        ("reformer", {"n_hashes": 3}),
        # blocks longer than the old traced length (17): a block count of 1 was baked into the graph
        ("sinkhorn", {"block_size": 32}),
        ("local", {"block_size": 32}),
        ("image", {"width": 32, "block_h": 2, "block_w": 32}),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={x}" for k, x in v.items()),
)
def test_variant_modes_export_with_parity(name, params, task, tmp_path):
    """Modes whose export path differs from eager (unpadded values, rounds combined), and blocks
    longer than the old traced length, keep parity."""
    torch.manual_seed(0)
    cfg = xsearch.ModelConfig(**task.model_fields(), d_model=32, n_layers=1, n_heads=4, attention=name,
                              attention_params={**xsearch.attention_spec(name).small_params, **params})  # fmt: skip
    report = to_onnx(xsearch.build_model(cfg).eval(), tmp_path / "m.onnx")
    assert report.max_abs_diff is not None and report.max_abs_diff <= 1e-4


@pytest.mark.parametrize("name", ["full", "local"])
def test_first_token_pooling_exports_with_parity(name, task, tmp_path):
    model = tiny_model(task, name, pooling="first")
    report = to_onnx(model, tmp_path / "m.onnx", task=task.describe())
    assert report.max_abs_diff is not None and report.max_abs_diff <= 1e-4
    assert xsearch.ModelConfig.from_dict(read_metadata(tmp_path / "m.onnx")["config"]).pooling == "first"


def test_example_length_is_a_long_prime():
    from xsearch.export.onnx_export import example_length

    assert [example_length(n) for n in (64, 4096, 17, 3, 2, 1)] == [61, 4093, 17, 3, 2, 1]


def test_parity_failure_raises_with_numbers(task, tmp_path):
    model = tiny_model(task, "full")
    with pytest.raises(ExportParityError, match="differs from torch by") as err:
        to_onnx(model, tmp_path / "m.onnx", tolerance=-1.0)
    assert err.value.max_abs_diff >= 0 and err.value.case[0] in (1, 3)
    assert not (tmp_path / "m.onnx").exists()


def test_random_ops_are_refused(task, tmp_path):
    class Noisy(type(tiny_model(task, "full"))):
        def forward(self, input_ids, mask=None):
            out = super().forward(input_ids, mask)
            return out + 1e-3 * torch.randn_like(out)

    torch.manual_seed(0)
    noisy = Noisy(tiny_model(task, "full").config).eval()
    with pytest.raises(ExportParityError, match="Random"):
        to_onnx(noisy, tmp_path / "m.onnx", check=False)


@pytest.fixture(scope="module")
def trained(task, tmp_path_factory):
    torch.manual_seed(0)
    model = tiny_model(task, "local")
    xsearch.train(model, task, steps=40, batch_size=16, lr=3e-3, progress=False)
    d = tmp_path_factory.mktemp("trained")
    xsearch.save_model(model, d / "m", task=task.describe())
    to_onnx(xsearch.load_model(d / "m"), d / "m.onnx")
    return model, d


@pytest.mark.parametrize("mode", ["dynamic-int8", "static-int8", "fp16"])
def test_quantized_models_keep_metadata_and_predictions(trained, task, mode):
    model, d = trained
    out = d / f"m.{mode}.onnx"
    calib = [(i.numpy(), m.numpy()) for i, m, _ in task.batches("train", 8, max_batches=4)]
    quantize_onnx(d / "m.onnx", out, mode, calibration=calib)
    assert read_metadata(out)["config"] == read_metadata(d / "m.onnx")["config"]
    fp32, q = Predictor(d / "m.onnx"), Predictor(out)
    agree = total = 0
    for ids, mask, _ in task.batches("test", 16):
        a = fp32.logits(ids.numpy(), mask.numpy()).argmax(-1)
        b = q.logits(ids.numpy(), mask.numpy()).argmax(-1)
        agree += int((a == b).sum())
        total += len(a)
    assert agree / total >= 0.9, (mode, agree, total)
    if mode == "dynamic-int8":
        assert out.stat().st_size < (d / "m.onnx").stat().st_size


def test_attention_with_key_padding_runs_as_one_fused_node(task, tmp_path):
    """Full attention with padded keys exports its attention core as onnxruntime's
    MultiHeadAttention (the padding folded into q and k), matches torch, and every
    quantization mode still builds a working model from it; ``portable=True`` keeps to
    standard ONNX operators."""
    import onnx

    model = tiny_model(task, "full")
    from xsearch.cli import main

    xsearch.save_model(model, tmp_path / "full", task=task.describe())
    assert main(["export", str(tmp_path / "full"), "--out", str(tmp_path / "portable.onnx"), "--portable"]) == 0
    assert {n.domain for n in onnx.load(tmp_path / "portable.onnx").graph.node} <= {"", "ai.onnx"}
    report = to_onnx(model, tmp_path / "m.onnx")  # parity at two lengths, with padding
    assert report.max_abs_diff <= 1e-4
    ops = [n.op_type for n in onnx.load(tmp_path / "m.onnx").graph.node]
    assert ops.count("MultiHeadAttention") == model.config.n_layers and "Softmax" not in ops
    ids, mask, _ = next(iter(task.batches("test", 8)))
    mask[0, 5:] = False
    want = model(ids, mask).detach().numpy()
    for mode in ("dynamic-int8", "static-int8", "fp16"):
        quantize_onnx(tmp_path / "m.onnx", tmp_path / f"{mode}.onnx", mode, calibration=[(ids.numpy(), mask.numpy())])
        got = Predictor(tmp_path / f"{mode}.onnx").logits(ids.numpy(), mask.numpy())
        assert np.abs(got - want).max() < 0.05, mode


def test_quantize_errors(trained, tmp_path):
    _, d = trained
    with pytest.raises(ValueError, match="int4"):
        quantize_onnx(d / "m.onnx", tmp_path / "q.onnx", "int4")
    with pytest.raises(ValueError, match="calibration"):
        quantize_onnx(d / "m.onnx", tmp_path / "q.onnx", "static-int8")
    with pytest.raises(FileNotFoundError, match="nope.onnx"):
        quantize_onnx(tmp_path / "nope.onnx", tmp_path / "q.onnx")


def test_predictor_bad_input(trained):
    _, d = trained
    p = Predictor(d / "m.onnx")
    ok = np.ones((1, 5), dtype=np.int64)
    with pytest.raises(ValueError, match="int64"):
        p.logits(ok.astype(np.int32))
    with pytest.raises(ValueError, match="2-D"):
        p.logits(ok[0])
    with pytest.raises(ValueError, match="exceeds max_len=64"):
        p.logits(np.ones((1, 65), dtype=np.int64))
    with pytest.raises(ValueError, match="empty batch"):
        p.logits(np.ones((0, 5), dtype=np.int64))
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        p.logits(np.full((1, 5), 99, dtype=np.int64))
    with pytest.raises(ValueError, match="non-empty list"):
        p.predict([])
    with pytest.raises(ValueError, match="unknown token 'FOO'"):
        p.predict(["[MAX FOO ]"])
    with pytest.raises(ValueError, match="UTF-8"):
        p.predict([b"\xff\xfe"])
    long = "[SM " + "1 " * 70 + "]"
    with pytest.raises(ValueError, match="truncate"):
        p.predict([long])
    assert len(p.predict([long], truncate=True)) == 1
    with pytest.raises(FileNotFoundError):
        Predictor(d / "missing.onnx")


def test_deployment_never_imports_torch(trained, tmp_path):
    _, d = trained
    code = (
        "import sys\n"
        "from xsearch.export import Predictor\n"
        f"p = Predictor({str(d / 'm.onnx')!r})\n"
        "print(p.predict(['[MAX 1 2 ]'])[0].label)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('"[MAX 1 2 ]"\n{"text": "[MIN 3 4 ]"}\n')
    code = (
        "import sys, runpy\n"
        f"sys.argv = ['xsearch', 'predict', {str(d / 'm.onnx')!r}, '--input', {str(inputs)!r}]\n"
        "from xsearch.cli import main\n"
        "rc = main()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "sys.exit(rc)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 2 and all(x["label"] in [str(i) for i in range(10)] for x in lines)


def test_cli_export_and_bench(trained, tmp_path):
    from xsearch.cli import main

    _, d = trained
    out = tmp_path / "q.onnx"
    assert main(["export", str(d / "m"), "--out", str(out), "--int8"]) == 0
    assert out.is_file() and (tmp_path / "q.fp32.onnx").is_file()
    assert main(["bench", str(out), "--vs", str(d / "m"), "--seq-len", "32", "--threads", "1", "--repeats", "3"]) == 0
    assert main(["export", str(d / "m"), "--out", str(tmp_path / "x.txt")]) == 2
