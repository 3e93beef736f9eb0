import csv
import json
import logging

import optuna
import pytest

import xsearch
from xsearch.cli import main
from xsearch.latency import measure
from xsearch.report import pick
from xsearch.search import Objective, SearchSettings, pareto_front, run_search

TASK_OPTS = {"n_train": 64, "n_valid": 32, "n_test": 16, "min_len": 16, "max_len": 64, "max_depth": 4}


def settings(tmp_path, **kw):
    base = dict(
        task="listops", task_options=TASK_OPTS, space="tiny", target="ort-cpu", trials=3,
        storage=f"sqlite:///{tmp_path}/s.db", study="t", train_steps=4, train_seconds=None, batch_size=16,
        latency_repeats=3, threads=1, latency_cache=str(tmp_path / "lat.jsonl"),
    )  # fmt: skip
    return SearchSettings(**{**base, **kw})


def test_search_end_to_end_resume_and_report(tmp_path, capsys, caplog):
    s = settings(tmp_path, max_latency_ms=1e9)
    run_search(s, progress=False)
    study = optuna.load_study(study_name="t", storage=s.storage)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    trials = study.get_trials()
    assert len(trials) == 3 and all(t.state.name == "COMPLETE" for t in trials)
    first = trials[0]
    assert first.user_attrs["reference"] is True and first.params["attention"] == "full"
    assert first.user_attrs["model_config"]["weight_sharing"] == "none"
    for t in trials:
        for key in ("model_config", "params", "latency", "device", "train_seconds", "n_parameters"):
            assert key in t.user_attrs, key
        cfg = xsearch.ModelConfig.from_dict(t.user_attrs["model_config"])
        assert cfg.max_len == 64 and cfg.n_classes == 10
        lat = t.user_attrs["latency"]
        assert lat["p10_ms"] <= lat["median_ms"] <= lat["p90_ms"] and lat["repeats"] == 3
        assert t.values[1] == lat["median_ms"] and 0 <= t.values[0] <= 1
        assert t.user_attrs["device"]["threads"] == 1
    # --trials is the study's total: re-running the finished study adds nothing and says so
    with caplog.at_level(logging.INFO, logger="xsearch.search"):
        run_search(s, progress=False)
    assert len(optuna.load_study(study_name="t", storage=s.storage).get_trials()) == 3
    assert "already has 3 COMPLETE trials" in caplog.text and "nothing to add" in caplog.text
    # a larger total resumes it up to the new total; the reference is not re-added
    s = settings(tmp_path, max_latency_ms=1e9, trials=5)
    run_search(s, progress=False)
    trials = optuna.load_study(study_name="t", storage=s.storage).get_trials()
    assert len(trials) == 5 and sum(bool(t.user_attrs.get("reference")) for t in trials) == 1
    # report
    out = tmp_path / "report"
    assert main(["report", "--storage", s.storage, "--study", "t", "--out", str(out)]) == 0
    assert {"pareto.html", "pareto.png", "trials.csv", "front.json"} <= {p.name for p in out.iterdir()}
    with (out / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5 and rows[0]["reference"] == "True"
    front = json.loads((out / "front.json").read_text())["front"]
    assert front and all(xsearch.ModelConfig.from_dict(r["model_config"]) for r in front)
    assert "Pareto front" in capsys.readouterr().out
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    # pick, then train the picked config from the CLI
    cfg_path = tmp_path / "config.json"
    assert main(["pick", "--storage", s.storage, "--study", "t", "--out", str(cfg_path)]) == 0
    picked = json.loads(cfg_path.read_text())
    best = max((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: (t.values[0], -t.values[1]))
    assert picked["accuracy"] == best.values[0]
    args = ["train", "--task", "listops", *sum((["--task-opt", f"{k}={v}"] for k, v in TASK_OPTS.items()), []),
            "--config", str(cfg_path), "--steps", "2", "--quiet", "--out", str(tmp_path / "m")]  # fmt: skip
    assert main(args) == 0
    assert xsearch.load_config(tmp_path / "m").attention == picked["model"]["attention"]


def test_failing_trial_is_recorded_and_study_goes_on(tmp_path, monkeypatch):
    run = Objective._run

    def flaky(self, trial):
        if trial.number == 1:
            raise RuntimeError("boom in trial 1")
        return run(self, trial)

    monkeypatch.setattr(Objective, "_run", flaky)
    s = settings(tmp_path, target="torch-cpu")
    run_search(s, progress=False)
    trials = optuna.load_study(study_name="t", storage=s.storage).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]  # 3 COMPLETE in all
    assert trials[1].user_attrs["error"] == "RuntimeError: boom in trial 1"


def test_budgets_are_constraints_and_infeasible_trials_stay_off_the_front(tmp_path):
    s = settings(tmp_path, target="torch-cpu", max_params=1, trials=2)
    study = run_search(s, progress=False)
    trials = study.get_trials()
    assert all(t.state.name == "COMPLETE" for t in trials)  # infeasible trials remain visible
    assert pareto_front(study) == []
    with pytest.raises(ValueError, match="no feasible"):
        pick(study)


def test_latency_cache_skips_remeasuring(tmp_path):
    s = settings(tmp_path, target="torch-cpu", trials=1)
    run_search(s, progress=False)
    s2 = settings(tmp_path, target="torch-cpu", trials=1, study="again")
    run_search(s2, progress=False)  # the reference again: same architecture, same device
    t = optuna.load_study(study_name="again", storage=s2.storage).get_trials()[0]
    assert t.user_attrs["latency_cached"] is True


def test_measure_statistics_and_errors(tmp_path):
    cfg = xsearch.ModelConfig(vocab_size=16, max_len=32, d_model=32, n_layers=1, n_heads=2)
    model = xsearch.build_model(cfg)
    st = measure(model, "torch-cpu", seq_len=32, threads=1, warmup=1, repeats=7)
    assert st.p10_ms <= st.median_ms <= st.p90_ms and st.repeats == 7 and st.device["threads"] == 1
    with pytest.raises(ValueError, match="unknown target 'gpu'"):
        measure(model, "gpu", seq_len=8)
    with pytest.raises(ValueError, match="max_len=32"):
        measure(model, "torch-cpu", seq_len=33)
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            measure(model, "torch-cuda", seq_len=8)
        with pytest.raises(RuntimeError, match="CUDAExecutionProvider"):
            measure(model, "ort-cuda", seq_len=8)


def test_cli_errors(tmp_path):
    assert main(["search", "--task", "listops", "--space", "nope", "--trials", "1"]) == 2
    assert main(["report", "--storage", f"sqlite:///{tmp_path}/x.db", "--study", "nope", "--out", str(tmp_path)]) == 2
