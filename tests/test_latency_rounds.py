"""Round-robin timing with the machine's speed divided out, and the sweep that measures in groups."""

import random

import optuna
import pytest

import xsearch
from xsearch.cli import main
from xsearch.export.onnx_export import to_onnx
from xsearch.latency.predictor.data import rows_from_study
from xsearch.latency.predictor.features import LatencyRow
from xsearch.latency.rounds import median_polish, round_robin, time_in_rounds

TASK_OPTS = {"n_train": 32, "n_valid": 8, "n_test": 8, "min_len": 16, "max_len": 64, "max_depth": 4}
TASK_FLAGS = ["--task", "listops", *sum((["--task-opt", f"{k}={v}"] for k, v in TASK_OPTS.items()), [])]


def small_model(d_model=32, n_layers=1, attention="full"):
    return xsearch.build_model(xsearch.ModelConfig(vocab_size=16, max_len=64, d_model=d_model, n_layers=n_layers,
                                                   n_heads=2, attention=attention)).eval()  # fmt: skip


def test_median_polish_divides_out_each_rounds_speed():
    rng = random.Random(0)
    latency = {"a": 2.0, "b": 5.0, "c": 11.0, "d": 40.0, "e": 0.7}
    speed = [1.0, 1.6, 0.9, 2.1, 1.0, 1.25, 0.8]  # a machine that runs up to 2.1x slower in some rounds
    samples = {
        n: [[ms * s * (1 + rng.uniform(-0.01, 0.01)) for _ in range(3)] for s in speed] for n, ms in latency.items()
    }
    samples["c"][3] = [v * 3 for v in samples["c"][3]]  # one model disturbed in one round only
    normalized, found = median_polish(samples)
    typical = sorted(speed)[len(speed) // 2]
    assert found == pytest.approx([s / typical for s in speed], rel=0.02)
    for n, ms in latency.items():
        label = sorted(normalized[n])[len(normalized[n]) // 2]
        assert label == pytest.approx(ms * typical, rel=0.02), n  # the speed of a typical round, every round alike
        assert len(normalized[n]) == 3 * len(speed)
    # Without the division the slow rounds would spread each model's timings by 2x.
    assert max(normalized["b"]) / min(normalized["b"]) < 1.05
    with pytest.raises(ValueError, match="every model timed"):
        median_polish({"a": [[1.0], [1.0]], "b": [[1.0]]})


def test_round_robin_times_every_model_in_every_round_in_shuffled_orders():
    calls = []
    runs = {n: (lambda n=n: calls.append(n) or 1.0) for n in "abcd"}
    samples = round_robin(runs, warmup=1, per_round=2, rounds=5, seed=3)
    assert all(len(samples[n]) == 5 and all(len(r) == 2 for r in samples[n]) for n in runs)
    turns = [calls[i] for i in range(0, len(calls), 3)]  # each turn: 1 warm-up + 2 timed calls of one model
    orders = [tuple(turns[i : i + 4]) for i in range(0, len(turns), 4)]
    assert all(sorted(o) == list("abcd") for o in orders) and len(set(orders)) > 1


def test_time_in_rounds_on_onnxruntime_and_torch(tmp_path):
    small, big = small_model(), small_model(d_model=128, n_layers=3)
    paths = {"small": tmp_path / "small.onnx", "big": tmp_path / "big.onnx"}
    to_onnx(small, paths["small"], check=False)
    to_onnx(big, paths["big"], check=False)
    ort = time_in_rounds(paths, "ort-cpu", seq_len=64, threads=1, warmup=1, per_round=2, rounds=3)
    assert set(ort.stats) == {"small", "big"} and len(ort.round_speed) == 3
    assert all(s.repeats == 6 and s.target == "ort-cpu" and s.device["threads"] == 1 for s in ort.stats.values())
    assert sorted(ort.round_speed)[1] == pytest.approx(1.0)
    mixed = time_in_rounds({"model": small, "file": paths["small"]}, "ort-cpu", seq_len=32, rounds=2)  # exports `model`
    assert set(mixed.stats) == {"model", "file"}
    torch_side = time_in_rounds({"small": small, "big": big}, "torch-cpu", seq_len=64, threads=1, rounds=2)
    assert set(torch_side.stats) == {"small", "big"} and torch_side.stats["big"].target == "torch-cpu"


def test_time_in_rounds_bad_input_names_the_value(tmp_path):
    model = small_model()
    with pytest.raises(ValueError, match="at least one model"):
        time_in_rounds({}, seq_len=8)
    with pytest.raises(ValueError, match="rounds must be an integer >= 1, got 0"):
        time_in_rounds({"m": model}, "torch-cpu", seq_len=8, rounds=0)
    with pytest.raises(ValueError, match="unknown target 'tpu'"):
        time_in_rounds({"m": model}, "tpu", seq_len=8)
    with pytest.raises(ValueError, match="no ONNX file at .*missing.onnx"):
        time_in_rounds({"m": tmp_path / "missing.onnx"}, seq_len=8)
    (tmp_path / "broken.onnx").write_bytes(b"not an onnx file")
    with pytest.raises(RuntimeError, match="timing process failed"):
        time_in_rounds({"m": tmp_path / "broken.onnx"}, seq_len=8)


def _sweep_trial(study, cfg, median_ms, reference_ms):
    dist = optuna.distributions.FloatDistribution(0, 1)
    study.add_trial(optuna.trial.create_trial(
        params={"x": 0.5}, distributions={"x": dist}, value=median_ms,
        user_attrs={"model_config": cfg, "seq_len": 64, "batch": 1, "latency_reference_ms": reference_ms,
                    "latency": {"median_ms": median_ms, "target": "ort-cpu"}, "device": {"threads": 2}},
    ))  # fmt: skip


def test_rows_from_study_divide_out_the_speed_of_each_group():
    cfg_a = small_model().config.to_dict()
    cfg_b = small_model(d_model=64).config.to_dict()
    study = optuna.create_study()
    # Group 1 ran at the typical speed (reference 10 ms); group 2 while the machine ran 2x slower.
    _sweep_trial(study, cfg_a, 4.0, 10.0)
    _sweep_trial(study, cfg_b, 6.0, 10.0)
    _sweep_trial(study, cfg_a, 8.0, 20.0)
    _sweep_trial(study, cfg_b, 12.0, 20.0)
    _sweep_trial(study, cfg_b, 6.5, 10.0)
    rows = rows_from_study(study)
    assert [r.latency_ms for r in rows] == [4.0, 6.0, 4.0, 6.0, 6.5]  # typical reference: median(10, 10, 20, 20, 10)
    assert all(isinstance(r, LatencyRow) and r.seq_len == 64 for r in rows)
    search_like = optuna.create_study()  # trials without a reference (a search study) are read as measured
    _sweep_trial(search_like, cfg_a, 3.0, None)
    assert [r.latency_ms for r in rows_from_study(search_like)] == [3.0]


def _sweep_argv(storage, *extra):
    return ["latency", "sweep", *TASK_FLAGS, "--space", "tiny", "--target", "torch-cpu", "--storage", storage,
            "--study", "sw", "--repeats", "2", "--rounds", "2", "--group", "3", "--threads", "1", "--quiet",
            *extra]  # fmt: skip


def test_sweep_fails_an_unbuildable_architecture_alone_and_never_leaves_trials_running(tmp_path, monkeypatch, capsys):
    from xsearch.latency import sweep as latency_sweep

    monkeypatch.setenv("XSEARCH_CACHE_DIR", str(tmp_path / "cache"))
    storage = f"sqlite:///{tmp_path}/sw.db"
    prepare = latency_sweep._GroupMeasurer._prepare

    def flaky(self, model, number, tmp):
        if number == 1:
            raise RuntimeError("export broke on trial 1")
        return prepare(self, model, number, tmp)

    monkeypatch.setattr(latency_sweep._GroupMeasurer, "_prepare", flaky)
    assert main(_sweep_argv(storage, "--samples", "5")) == 0
    trials = optuna.load_study(study_name="sw", storage=storage).get_trials()
    states = {t.number: t.state.name for t in trials}
    assert states[1] == "FAIL" and "export broke on trial 1" in trials[1].user_attrs["error"]
    assert sum(s == "COMPLETE" for s in states.values()) == 5  # the total is still reached
    groups = {}
    for t in trials:
        if t.state.name == "COMPLETE":
            assert t.user_attrs["latency_reference_ms"] > 0 and len(t.user_attrs["latency_round_speed"]) == 2
            groups.setdefault(t.user_attrs["latency_group"], set()).add(t.user_attrs["latency_reference_ms"])
    assert len(groups) >= 2  # two groups, each with the reference timed among its members
    assert all(len(refs) == 1 for refs in groups.values())  # one reference timing per group

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("xsearch.latency.rounds.time_in_rounds", interrupted)
    with pytest.raises(KeyboardInterrupt):
        latency_sweep.run_sweep(latency_sweep.SweepSettings(
            task="listops", task_options=TASK_OPTS, space="tiny", target="torch-cpu", samples=7, storage=storage,
            study="sw", threads=1, latency_repeats=2, rounds=2, group=3, latency_cache=None),
            progress=False)  # fmt: skip
    trials = optuna.load_study(study_name="sw", storage=storage).get_trials()
    assert not [t for t in trials if t.state.name == "RUNNING"]
    assert sum(t.state.name == "COMPLETE" for t in trials) == 5

    def full_disk(*args):
        raise OSError("disk full")

    monkeypatch.setattr(latency_sweep._GroupMeasurer, "_prepare", full_disk)
    capsys.readouterr()
    assert main(_sweep_argv(storage, "--samples", "9")) == 1  # not the user's input: a system error
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("xsearch")]
    assert len(err) == 1 and "no architecture of a whole group was measured" in err[0] and "disk full" in err[0]
    assert err[0].startswith("xsearch: system error: OSError") and "traceback: " in err[0]
