"""One conformance suite run against every registered latency target (as the attention zoo's is)."""

from __future__ import annotations

import pytest
import torch

import xsearch
from xsearch.errors import UnavailableError, XSearchError
from xsearch.latency import find_target, get_target, list_targets, measure, measure_interleaved, time_in_rounds


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = xsearch.ModelConfig(vocab_size=12, max_len=32, d_model=16, n_layers=1, n_heads=2, n_classes=3,
                              attention="local", attention_params={"block_size": 8})  # fmt: skip
    return xsearch.build_model(cfg).eval()


def test_the_registry_names_every_target_and_refuses_unknown_ones():
    assert {"ort-cpu", "ort-cuda", "torch-cpu", "torch-cuda"} <= set(list_targets())
    with pytest.raises(XSearchError, match=r"unknown target 'tpu'; valid: ort-cpu, ort-cuda, torch-cpu, torch-cuda"):
        get_target("tpu")
    assert get_target(get_target("ort-cpu")).name == "ort-cpu"  # a Target is returned as it is
    assert find_target("torch", "cpu").name == "torch-cpu"


@pytest.mark.parametrize("name", list_targets())
def test_every_target_measures_what_it_says_or_refuses_clearly(name, model, tmp_path):
    t = get_target(name)
    assert t.name == name and t.engine in ("onnxruntime", "torch") and t.device in ("cpu", "cuda") and t.summary
    assert (t.deployment().engine, t.deployment().device) == ("onnxruntime", t.device)
    assert (t.eager().engine, t.eager().device) == ("torch", t.device)
    reason = t.unavailable()
    if reason is not None:  # never a silent fallback to another device
        with pytest.raises(UnavailableError, match=f"target '{name}' "):
            measure(model, name, seq_len=16, repeats=2)
        with pytest.raises(UnavailableError, match=f"target '{name}' "):
            time_in_rounds({"m": model}, name, seq_len=16, rounds=1, per_round=1)
        return
    prepared = t.prepare(model, tmp_path / "m.onnx")  # what the target times for a torch model
    if t.runs_exported:
        assert prepared == tmp_path / "m.onnx" and prepared.is_file()
    else:
        assert prepared is model
        (tmp_path / "x.onnx").write_bytes(b"")
        with pytest.raises(XSearchError, match="measures a torch model"):
            measure(tmp_path / "x.onnx", name, seq_len=16, repeats=2)
    stats = measure(prepared, name, seq_len=16, batch=2, threads=1, repeats=3, warmup=1)
    assert stats.target == name and stats.repeats == 3 and 0 < stats.p10_ms <= stats.median_ms <= stats.p90_ms
    assert stats.device == t.fingerprint(1) and stats.device["threads"] == 1
    timed = time_in_rounds({"a": prepared, "b": prepared}, name, seq_len=16, threads=1, rounds=2, per_round=1,
                           warmup=0)  # fmt: skip
    assert set(timed.stats) == {"a", "b"} and len(timed.round_speed) == 2 and timed.stats["a"].target == name
    with pytest.raises(XSearchError, match="seq_len=33 exceeds the model's max_len=32"):
        measure(prepared, name, seq_len=33, repeats=1)
    for bad in ({"seq_len": 0}, {"seq_len": 8, "repeats": 0}, {"seq_len": 8, "threads": 0}):
        with pytest.raises(XSearchError, match="must be an integer >= 1"):
            measure(prepared, name, **bad)


def test_a_torch_model_on_an_exporting_target_is_exported_and_models_may_have_their_own_target(model):
    stats = measure_interleaved({"onnx": model, "torch": model}, "ort-cpu", seq_len=16, threads=1, repeats=2,
                                targets={"torch": "torch-cpu"})  # fmt: skip
    assert (stats["onnx"].target, stats["torch"].target) == ("ort-cpu", "torch-cpu")
    path = "m.onnx"
    with pytest.raises(XSearchError, match="targets names models that are not measured: nope"):
        measure_interleaved({"onnx": path}, "ort-cpu", seq_len=16, targets={"nope": "torch-cpu"})  # (checked first)
