"""Latency modes: forward, prefill and decode (one step after a context) on every target kind, the cache
key, and a search that optimises the mode it is given."""

import optuna
import pytest
import torch

import xsearch
from xsearch.errors import SettingError
from xsearch.latency import measure
from xsearch.latency.cache import cache_key
from xsearch.latency.target import check_mode
from xsearch.search import SearchSettings, run_search

MAX_LEN = 48


def _lm(attention="linear"):
    torch.manual_seed(0)
    cfg = xsearch.ModelConfig(attention=attention, d_model=32, n_heads=4, n_layers=1, d_ff=48, vocab_size=31,
                              max_len=MAX_LEN, causal=True, head="lm")  # fmt: skip
    return xsearch.build_model(cfg).eval()


@pytest.mark.parametrize("target", ["torch-cpu", "ort-cpu"])
def test_every_mode_is_timed(target):
    model = _lm()
    for mode, context in (("forward", None), ("prefill", None), ("decode", 8), ("decode", MAX_LEN - 1)):
        st = measure(model, target, seq_len=16, threads=1, warmup=1, repeats=3, mode=mode, context=context)
        assert st.median_ms > 0 and st.repeats == 3


def test_the_decode_runner_times_one_step_from_a_fixed_state(monkeypatch):
    """Each timed call is model.step from the state of `context` tokens; prefill runs once, untimed."""
    model = _lm()
    calls = {"prefill": [], "step": []}
    real_prefill, real_step = model.prefill, model.step

    def prefill(ids, mask=None):
        calls["prefill"].append(ids.shape)
        return real_prefill(ids, mask)

    def step(nxt, state):
        calls["step"].append(int(state["length"][0]))
        return real_step(nxt, state)

    monkeypatch.setattr(model, "prefill", prefill)
    monkeypatch.setattr(model, "step", step)
    measure(model, "torch-cpu", seq_len=16, threads=1, warmup=2, repeats=3, mode="decode", context=20)
    assert calls["prefill"] == [torch.Size([1, 20])]
    assert calls["step"] == [20] * 5


def test_mode_errors(tmp_path):
    cls = dict(_lm().config.to_dict(), causal=False, head="classify", n_classes=3)
    with pytest.raises(ValueError, match="causal language model"):
        check_mode("decode", 8, cls)
    with pytest.raises(ValueError, match="unknown latency mode 'backward'"):
        check_mode("backward", None, cls)
    with pytest.raises(ValueError, match="max_len=48"):
        check_mode("decode", MAX_LEN, _lm().config.to_dict())
    with pytest.raises(ValueError, match="context >= 1"):
        check_mode("decode", None, _lm().config.to_dict())
    # an encoder export cannot time a decoder mode
    from xsearch.export import to_onnx

    to_onnx(_lm(), tmp_path / "enc.onnx", check=False)
    with pytest.raises(ValueError, match="not a decoder export"):
        measure(tmp_path / "enc.onnx", "ort-cpu", seq_len=8, repeats=1, warmup=0, mode="prefill")
    with pytest.raises(SettingError, match="latency_predictor"):
        SearchSettings(latency_predictor="p.json", latency_mode="decode")
    with pytest.raises(SettingError, match="context"):
        SearchSettings(context=16)


def test_the_cache_key_holds_the_mode_and_context():
    cfg, dev = _lm().config.to_dict(), {"cpu": "x"}
    forward = cache_key(cfg, "ort-cpu", 1, 32, dev)
    assert cache_key(cfg, "ort-cpu", 1, 32, dev, "forward", None) == forward  # older keys still hit
    modes = [("prefill", None), ("decode", 16), ("decode", 31)]
    keys = {forward, *(cache_key(cfg, "ort-cpu", 1, 32, dev, mode, context) for mode, context in modes)}
    assert len(keys) == 4


def test_a_search_optimises_decode_latency(tmp_path):
    base = dict(
        task="lm", task_options={"max_len": MAX_LEN}, space="tiny", target="torch-cpu", trials=2,
        storage=f"sqlite:///{tmp_path}/s.db", train_steps=2, batch_size=4, latency_repeats=2, threads=1,
        latency_cache=str(tmp_path / "lat.jsonl"),
    )  # fmt: skip
    run_search(SearchSettings(**base, study="d", latency_mode="decode", context=40), progress=False)
    trials = optuna.load_study(study_name="d", storage=base["storage"]).get_trials()
    assert len(trials) == 2 and all(t.state.name == "COMPLETE" for t in trials)
    assert all(t.values[1] == t.user_attrs["latency"]["median_ms"] for t in trials)
    # the same reference in forward mode is measured anew (another key), not read from the cache
    run_search(SearchSettings(**{**base, "trials": 1}, study="f"), progress=False)
    ref = optuna.load_study(study_name="f", storage=base["storage"]).get_trials()[0]
    assert ref.user_attrs["latency_cached"] is False
    with pytest.raises(ValueError, match="needs the lm task"):
        run_search(SearchSettings(**{**base, "task": "listops", "task_options": {}}, study="x",
                                  latency_mode="prefill"), progress=False)  # fmt: skip
