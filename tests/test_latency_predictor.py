import json
import math
import os
import random
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import optuna
import pytest
import torch

import xsearch
from xsearch.cli import main
from xsearch.latency import device_fingerprint
from xsearch.latency.predictor import (
    COUNT_KINDS,
    LatencyPredictor,
    LatencyRow,
    architecture_features,
    fit_with_holdout,
    forward_counts,
    holdout_metrics,
    kendall_tau,
    mape,
    row_features,
    split_by_architecture,
)
from xsearch.latency.predictor.models import _nnls
from xsearch.search import SearchSettings, run_search

TASK_OPTS = {"n_train": 64, "n_valid": 32, "n_test": 16, "min_len": 16, "max_len": 64, "max_depth": 4}
TASK_FLAGS = ["--task", "listops", *sum((["--task-opt", f"{k}={v}"] for k, v in TASK_OPTS.items()), [])]
FIELDS = {"vocab_size": 20, "max_len": 64, "n_classes": 10}
VARIANTS = {"full": {}, "linear": {}, "local": {"block_size": 16}, "linformer": {"k": 16}}
# A known formula: the synthetic "latency" of a config; the variant factors are made up.
FACTOR = {"full": 1.6, "linear": 0.7, "local": 1.0, "linformer": 0.8}


def config(attention="full", params=None, d_model=32, n_layers=1, n_heads=2, d_ff=64, **kw):
    return xsearch.ModelConfig(**FIELDS, attention=attention, attention_params=params or {}, d_model=d_model,
                               n_layers=n_layers, n_heads=n_heads, d_ff=d_ff, **kw).to_dict()  # fmt: skip


def synthetic_rows(n, seed=0, target="torch-cpu"):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        attention = rng.choice(sorted(VARIANTS))
        cfg = config(attention, VARIANTS[attention], d_model=rng.choice([16, 32, 64]), n_layers=rng.choice([1, 2, 3]),
                     d_ff=rng.choice([32, 64, 128]))  # fmt: skip
        seq_len = rng.choice([32, 64])
        ms = 0.05 * FACTOR[attention] * cfg["n_layers"] * (cfg["d_model"] / 16) ** 1.3 * (seq_len / 32) ** 1.1
        ms *= 1 + cfg["d_ff"] / 256
        rows.append(LatencyRow(cfg, seq_len, 1, ms, target, device_fingerprint(target, 1)))
    return rows


@pytest.fixture(scope="module")
def synthetic_predictor():
    return fit_with_holdout(synthetic_rows(60), seed=0, members=2, epochs=300)


def test_features_are_deterministic_distinguish_variants_and_leave_the_rng_alone():
    base = architecture_features(config("full"), 64)
    torch.manual_seed(7)
    again = architecture_features(config("full"), 64)
    after = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(after, torch.rand(3))  # computing features draws nothing from the caller's RNG
    assert base == again
    names = xsearch.list_attentions()
    assert sum(base[f"attention={n}"] for n in names) == 1.0 and base["attention=full"] == 1.0
    lin16, lin32 = (architecture_features(config("linformer", {"k": k}), 64) for k in (16, 32))
    assert lin16["attention=linformer"] == 1.0 and lin16["attention=full"] == 0.0
    assert lin16["attention.linformer.k"] == pytest.approx(math.log2(17))
    assert lin32["attention.linformer.k"] == pytest.approx(math.log2(33))
    assert lin16["log10_flops"] < lin32["log10_flops"] < base["log10_flops"]  # rank 16 < 32 < full 64x64 scores
    assert architecture_features(config("full"), 32)["log10_flops"] < base["log10_flops"]
    # a pruned config: the real FFN widths, not d_ff
    pruned = architecture_features(config("full", n_layers=2, ffn_dims=[16, 48]), 64)
    assert pruned["log2_d_ff"] == pytest.approx(5.0)
    shared = architecture_features(config("full", n_layers=2, weight_sharing="all"), 64)
    unshared = architecture_features(config("full", n_layers=2), 64)
    assert shared["sharing=all"] == 1.0 and shared["log10_parameters"] < unshared["log10_parameters"]
    assert shared["log10_flops"] == unshared["log10_flops"]  # shared weights, same work
    with pytest.raises(ValueError, match="max_len=64"):
        architecture_features(config("full"), 65)


def test_forward_counts_split_the_work_by_kind():
    full = xsearch.build_model(xsearch.ModelConfig.from_dict(config("full", n_layers=2, n_heads=2)))
    counts = forward_counts(full, 64, batch=3)
    assert set(COUNT_KINDS) <= set(counts)
    assert counts["flops_matmul"] + counts["flops_attention"] == counts["flops"]
    # fused attention: Q K^T and P V over 2 heads of 16 dims, and the 64 x 64 scores, per layer and sequence
    assert counts["flops_attention"] == 2 * 3 * 2 * (2 * 2 * 64 * 64 * 16)
    assert counts["elements_attention"] == 2 * 3 * 2 * 64 * 64
    assert counts["elements_sort"] == 0
    reformer = xsearch.build_model(xsearch.ModelConfig.from_dict(config("reformer", {"bucket_size": 16})))
    assert forward_counts(reformer, 64)["elements_sort"] > 0  # hashing sorts tokens into buckets
    linear = xsearch.build_model(xsearch.ModelConfig.from_dict(config("linear")))
    assert forward_counts(linear, 64)["flops_attention"] == 0  # no n x n scores at all


def test_nnls_meets_the_optimality_conditions():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.normal(size=(30, 6)), rng.normal(size=30)
        x = _nnls(a, b)
        gradient = a.T @ (b - a @ x)  # minus half the gradient of |a x - b|^2
        assert (x >= 0).all()
        assert np.allclose(gradient[x > 0], 0.0, atol=1e-8)  # free coefficients: stationary
        assert (gradient[x == 0] <= 1e-8).all()  # coefficients at the bound: pushing them up would not help
    a = rng.uniform(size=(20, 3))
    assert np.allclose(_nnls(a, a @ np.array([1.0, 2.0, 3.0])), [1.0, 2.0, 3.0])  # exact, positive: lstsq's answer


def test_additive_stage_extrapolates_a_sum_of_work():
    """Latency that is a sum of costs per unit of work is predicted for models bigger than any fitted."""
    rng = random.Random(0)
    configs = []
    for _ in range(40):
        attention = rng.choice(sorted(VARIANTS))
        configs.append(config(attention, VARIANTS[attention], d_model=rng.choice([16, 32]),
                              n_layers=rng.choice([1, 2]), d_ff=rng.choice([32, 64])))  # fmt: skip
    configs += [config("full", d_model=d_model, n_layers=3, d_ff=256) for d_model in (64, 96)]  # bigger than any
    feats = [architecture_features(c, 64) for c in configs]
    rows = [LatencyRow(c, 64, 1, 0.02 + 2e-9 * 10 ** f["log10_flops"] + 1e-4 * 10 ** f["log10_ops"])
            for c, f in zip(configs, feats)]  # fmt: skip
    unseen = [r.latency_ms for r in rows[40:]]
    errors = {}
    for additive in (True, False):
        p = LatencyPredictor(additive=additive, alpha=1e-4, weight_decay=None).fit(rows[:40], feats[:40])
        errors[additive] = mape(unseen, p.predict_features(feats[40:]))
    assert errors[True] < 3.0
    assert errors[False] > 2 * errors[True]  # a power law in log space misses the sum where it has no data


def test_mape_and_kendall_tau_against_hand_computed_values():
    assert mape([100, 200], [110, 180]) == pytest.approx(10.0)
    assert mape([4.0], [5.0]) == pytest.approx(25.0)
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)  # 5 concordant, 1 discordant pair
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # tau-b with ties: 4 concordant, 0 discordant, one tie in each sequence -> 4 / sqrt(5 * 5)
    assert kendall_tau([1, 2, 2, 3], [1, 2, 3, 3]) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="constant"):
        kendall_tau([1, 1, 1], [1, 2, 3])
    with pytest.raises(ValueError, match="equally long"):
        mape([1, 2], [1])
    with pytest.raises(ValueError, match="actual value is 0"):
        mape([0, 1], [1, 1])


def test_split_never_puts_one_architecture_on_both_sides():
    rows = synthetic_rows(40)
    rows += [LatencyRow(r.config, 16, 1, r.latency_ms / 2) for r in rows[:10]]  # the same configs at another length
    train, test = split_by_architecture(rows, 0.25, seed=3)
    assert sorted(train + test) == list(range(len(rows))) and test
    keys = {i: json.dumps(rows[i].config, sort_keys=True) for i in range(len(rows))}
    assert not {keys[i] for i in train} & {keys[i] for i in test}
    assert split_by_architecture(rows, 0.25, seed=3) == (train, test)  # seeded
    assert split_by_architecture(rows, 0.25, seed=4) != (train, test)
    with pytest.raises(ValueError, match="two distinct architectures"):
        split_by_architecture(rows[:1] * 3)
    with pytest.raises(ValueError, match="test_fraction"):
        split_by_architecture(rows, 1.5)


def test_fit_learns_a_known_formula(synthetic_predictor):
    m = synthetic_predictor.metrics
    assert m["n_test"] >= 8 and m["n_train"] + m["n_test"] == 60
    assert m["mape"] < 5.0 and m["kendall_tau"] > 0.95
    # a constant guess (the geometric mean) is far worse on the same rows: the fit learned something
    test = m["test"]
    guess = math.exp(np.mean(np.log([t["measured_ms"] for t in test])))
    assert mape([t["measured_ms"] for t in test], [guess] * len(test)) > 4 * m["mape"]
    # unseen rows from the same formula
    fresh = synthetic_rows(20, seed=99)
    pred = [synthetic_predictor.predict(r.config, r.seq_len) for r in fresh]
    assert mape([r.latency_ms for r in fresh], pred) < 5.0


def test_sessions_timed_at_different_machine_speeds_are_divided_out(tmp_path):
    # The same formula, measured in three sessions while the machine ran at 0.8x, 1x and 1.3x its typical time.
    speed = {"s0": 0.8, "s1": 1.0, "s2": 1.3}
    rows = [replace(r, latency_ms=r.latency_ms * speed[f"s{i % 3}"], session=f"s{i % 3}")
            for i, r in enumerate(synthetic_rows(90, seed=3))]  # fmt: skip
    p = fit_with_holdout(rows, seed=0, members=2, epochs=300)
    assert p.session_speed("s2") / p.session_speed("s0") == pytest.approx(1.3 / 0.8, rel=0.05)
    assert p.session_speed("s1") == pytest.approx(1.0, rel=0.05) and p.session_speed("unknown") == 1.0
    m = p.metrics
    assert m["sessions"] == 3 and m["mape"] < 5.0 and m["kendall_tau"] > 0.95
    assert m["mape_typical_session"] > 10.0  # the same predictions against labels that kept their session's speed
    fresh = synthetic_rows(20, seed=99)  # predictions are for the typical (median) session
    assert mape([r.latency_ms for r in fresh], [p.predict(r.config, r.seq_len) for r in fresh]) < 5.0
    blind = fit_with_holdout([replace(r, session="") for r in rows], seed=0, members=2, epochs=300)
    assert blind.metrics["sessions"] == 0 and blind.metrics["mape"] > 2 * m["mape"]
    again = LatencyPredictor.load(p.save(tmp_path / "p.json"))
    assert again.sessions == pytest.approx(p.sessions)
    # Another split's figures alone (no fit on every row) are what fit_with_holdout reports for that split.
    other = holdout_metrics(rows, [row_features(r) for r in rows], seed=1, members=2, epochs=300)
    assert other == fit_with_holdout(rows, seed=1, members=2, epochs=300).metrics and other["split_seed"] == 1


def test_session_speeds_are_read_off_predictions_that_did_not_see_the_row():
    # Many small sessions and MLPs flexible enough to learn part of each row's session into its
    # architecture: in-sample residuals would shrink the speeds towards 1 (about 0.12 off in log).
    rng = random.Random(1)
    speed = {f"s{k}": math.exp(rng.gauss(0, 0.2)) for k in range(12)}
    rows = [replace(r, latency_ms=r.latency_ms * speed[f"s{i % 12}"], session=f"s{i % 12}")
            for i, r in enumerate(synthetic_rows(96, seed=4))]  # fmt: skip
    p = LatencyPredictor("torch-cpu", rows[0].device, additive=True, alpha=0.01, weight_decay=1.0, members=2).fit(rows)
    true = np.log(list(speed.values()))
    est = np.log([p.session_speed(k) for k in speed])
    assert np.mean(np.abs((est - est.mean()) - (true - true.mean()))) < 0.04


def test_save_load_round_trip_predicts_identically(tmp_path, synthetic_predictor):
    path = synthetic_predictor.save(tmp_path / "p.json")
    doc = json.loads(path.read_text())  # plain JSON
    assert doc["target"] == "torch-cpu" and doc["device"]["threads"] == 1 and doc["xsearch_version"]
    assert doc["metrics"]["mape"] == synthetic_predictor.metrics["mape"] and "kendall_tau" in doc["metrics"]
    loaded = LatencyPredictor.load(path)
    for row in synthetic_rows(5, seed=5):
        assert loaded.predict(row.config, row.seq_len) == synthetic_predictor.predict(row.config, row.seq_len)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        LatencyPredictor.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="malformed JSON"):
        LatencyPredictor.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match="not an xsearch latency predictor"):
        LatencyPredictor.load(tmp_path / "other.json")
    del doc["members"]
    (tmp_path / "cut.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="malformed latency predictor"):
        LatencyPredictor.load(tmp_path / "cut.json")


def test_sweep_resumes_and_latency_fit_writes_a_predictor(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XSEARCH_CACHE_DIR", str(tmp_path / "cache"))
    storage = f"sqlite:///{tmp_path}/lat.db"
    sweep = ["latency", "sweep", *TASK_FLAGS, "--space", "tiny", "--target", "torch-cpu", "--storage", storage,
             "--study", "sw", "--seq-lens", "32,64", "--repeats", "2", "--rounds", "2", "--group", "4",
             "--threads", "1", "--quiet"]  # fmt: skip
    assert main([*sweep, "--samples", "10"]) == 0
    assert main([*sweep, "--samples", "14"]) == 0  # resumes: adds up to the total
    trials = optuna.load_study(study_name="sw", storage=storage).get_trials()
    assert len(trials) == 14 and all(t.state.name == "COMPLETE" for t in trials)
    for t in trials:
        assert {"model_config", "latency", "n_parameters", "device", "seq_len", "batch"} <= set(t.user_attrs)
        assert t.user_attrs["seq_len"] in (32, 64) and t.values[0] == t.user_attrs["latency"]["median_ms"]
    assert len({json.dumps(t.params, sort_keys=True) for t in trials}) > 10  # the resumed part drew new samples
    assert (tmp_path / "cache" / "latency.jsonl").is_file()
    out = tmp_path / "p.json"
    assert main(["latency", "fit", "--storage", storage, "--study", "sw", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "MAPE" in printed and "Kendall tau" in printed
    p = LatencyPredictor.load(out)
    assert p.target == "torch-cpu" and p.data["rows"] == 14 and p.metrics["n_test"] >= 1
    assert p.data["seq_lens"] == [32, 64]
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"model": trials[0].user_attrs["model_config"]}))
    assert main(["latency", "predict", str(out), "--config", str(cfg), "--seq-len", "32"]) == 0
    assert "ms predicted (torch-cpu, seq_len 32" in capsys.readouterr().out


def test_search_prunes_candidates_predicted_over_budget(tmp_path):
    # A predictor that knows one thing: width 64 costs 10 ms, width 32 costs 1 ms.
    rows = [LatencyRow(config(a, VARIANTS[a], d_model=d, n_layers=n), 64, 1, 10.0 if d == 64 else 1.0, "torch-cpu",
                       device_fingerprint("torch-cpu", 1))
            for a in VARIANTS for d in (32, 64) for n in (1, 2)]  # fmt: skip
    path = fit_with_holdout(rows, members=1, epochs=400).save(tmp_path / "p.json")
    s = SearchSettings(
        task="listops", task_options=TASK_OPTS, space="tiny", target="torch-cpu", trials=8, sampler="random",
        storage=f"sqlite:///{tmp_path}/s.db", study="t", train_steps=2, train_seconds=None, batch_size=16,
        latency_repeats=2, threads=1, latency_cache=str(tmp_path / "lat.jsonl"), max_latency_ms=3.0,
        latency_predictor=str(path),
    )  # fmt: skip
    trials = run_search(s, progress=False).get_trials()
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    done = [t for t in trials if t.state.name == "COMPLETE"]
    assert pruned and len(done) == 8  # --trials counts COMPLETE trials; the pruned ones come on top
    for t in pruned:  # never built, measured or trained
        assert t.user_attrs["model_config"]["d_model"] == 64 and t.user_attrs["latency_predicted_ms"] > 3.0
        assert "predicted latency" in t.user_attrs["pruned"]
        assert not {"train_steps", "latency", "n_parameters"} & set(t.user_attrs)
        assert t.constraints == {"latency": t.user_attrs["latency_predicted_ms"] - 3.0}  # infeasible for the sampler
    for t in done:  # trained and measured, both latencies side by side
        assert "median_ms" in t.user_attrs["latency"] and t.user_attrs["train_steps"] == 2
        if t.user_attrs.get("reference"):  # the baseline is never pruned, whatever its prediction
            assert t.number == 0 and t.user_attrs["latency_predicted_ms"] > 3.0
        else:
            assert t.user_attrs["latency_predicted_ms"] <= 3.0 and t.user_attrs["model_config"]["d_model"] == 32


def test_bad_inputs_are_one_line_errors(tmp_path, synthetic_predictor, capsys):
    good = synthetic_predictor.save(tmp_path / "p.json")
    (tmp_path / "bad.json").write_text("{oops")
    search = ["search", *TASK_FLAGS, "--space", "tiny", "--trials", "1", "--train-steps", "1", "--quiet",
              "--storage", f"sqlite:///{tmp_path}/s.db"]  # fmt: skip
    cases = [
        ([*search, "--latency-predictor", str(tmp_path / "missing.json")], "missing.json"),
        ([*search, "--latency-predictor", str(tmp_path / "bad.json")], "malformed JSON"),
        ([*search, "--target", "ort-cpu", "--latency-predictor", str(good)], "for target 'torch-cpu', not 'ort-cpu'"),
        (["latency", "fit", "--storage", f"sqlite:///{tmp_path}/s.db", "--study", "nope", "--out", "x.json"], "'nope'"),
        (["latency", "predict", str(tmp_path / "missing.json"), "--config", str(good)], "missing.json"),
        (["latency", "sweep", *TASK_FLAGS, "--seq-lens", "32,abc"], "--seq-lens"),
        (["latency", "sweep", *TASK_FLAGS, "--seq-len", "65", "--storage", f"sqlite:///{tmp_path}/s.db"], "65"),
    ]  # fmt: skip
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("xsearch")]
        assert len(err) == 1 and needle in err[0], (argv, err)


def test_rows_of_one_target_and_device_are_chosen_or_the_mix_is_named():
    from xsearch.latency.predictor.data import select_rows

    cpu1, cpu2 = device_fingerprint("torch-cpu", 1), device_fingerprint("torch-cpu", 2)
    rows = [LatencyRow(config(), 64, 1, 1.0, "torch-cpu", cpu1), LatencyRow(config(), 64, 1, 2.0, "ort-cpu", cpu1),
            LatencyRow(config(), 64, 1, 3.0, "torch-cpu", cpu2)]  # fmt: skip
    with pytest.raises(ValueError, match="mix targets ort-cpu, torch-cpu; choose one with --target"):
        select_rows(rows)
    assert [r.latency_ms for r in select_rows(rows, target="ort-cpu")] == [2.0]
    with pytest.raises(ValueError, match="mix devices .*1 threads.*2 threads"):
        select_rows(rows, target="torch-cpu")
    assert [r.latency_ms for r in select_rows(rows, target="torch-cpu", threads=2)] == [3.0]
    with pytest.raises(ValueError, match="no trials measured on target 'torch-cuda'"):
        select_rows(rows, target="torch-cuda")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_measure_undisturbed_sets_aside_runs_slowed_by_another_process():
    from xsearch.latency import measure_undisturbed, run_queue_wait_ns

    if run_queue_wait_ns() is None:
        pytest.skip("no /proc/self/task/*/schedstat here")
    model = xsearch.build_model(xsearch.ModelConfig(vocab_size=16, max_len=512, d_model=64, n_layers=2, n_heads=2))
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    # A busy process pinned to the CPU this thread is pinned to: every run (tens of ms, longer
    # than a scheduler time slice) has to wait for it.
    hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.2)
        for _ in range(3):  # the scheduler decides when the hog runs: a loaded machine can spare a whole call
            stats, disturbed = measure_undisturbed(model, "torch-cpu", seq_len=512, threads=1, warmup=1, repeats=4,
                                                   patience=0.5)  # fmt: skip
            if disturbed:
                break
    finally:
        hog.kill()
        hog.wait()
        os.sched_setaffinity(0, before)
    assert disturbed > 0 and stats.repeats == 4
    stats, disturbed = measure_undisturbed(model, "torch-cpu", seq_len=64, threads=1, warmup=1, repeats=3, patience=0)
    assert disturbed == 0 and stats.repeats == 3  # patience 0: every run kept, none judged
