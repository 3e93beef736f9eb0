import csv
import dataclasses
import json
import logging

import optuna
import pytest

import xsearch
from xsearch.cli import main
from xsearch.latency import measure, measure_interleaved
from xsearch.search import Objective, SearchSettings, is_feasible, pareto_front, run_search
from xsearch.search.report import pick

TASK_OPTS = {"n_train": 64, "n_valid": 32, "n_test": 16, "min_len": 16, "max_len": 64, "max_depth": 4}


def settings(tmp_path, **kw):
    base = dict(
        task="listops", task_options=TASK_OPTS, space="tiny", target="ort-cpu", trials=3,
        storage=f"sqlite:///{tmp_path}/s.db", study="t", train_steps=4, train_seconds=None, batch_size=16,
        latency_repeats=3, threads=1, latency_cache=str(tmp_path / "lat.jsonl"),
    )  # fmt: skip
    return SearchSettings(**{**base, **kw})


def test_the_auto_sampler_is_tpe_for_trained_trials_and_nsga2_for_a_supernet(tmp_path):
    assert settings(tmp_path).sampler_name() == "tpe"
    inherited = dict(supernet=str(tmp_path / "sn"), train_steps=None)
    assert settings(tmp_path, **inherited).sampler_name() == "nsga2"
    # no training budget is filled in for it, so the settings validate again as they are
    again = dataclasses.replace(settings(tmp_path, **inherited), trials=5)
    assert again.train_steps is None and again.trial_steps() == 0
    for name in ("tpe", "random"):  # a sampler asked for by name is the one used
        assert settings(tmp_path, **inherited, sampler=name).sampler_name() == name


def test_search_end_to_end_resume_and_report(tmp_path, capsys, caplog):
    s = settings(tmp_path, max_latency_ms=1e9)
    run_search(s, progress=False)
    study = optuna.load_study(study_name="t", storage=s.storage)
    # ranked by the validation loss (the default), the accuracy recorded beside it
    assert [d.name for d in study.directions] == ["MINIMIZE", "MINIMIZE"]
    assert study.metric_names == ["valid_loss", "latency_ms"] and study.user_attrs["metric"] == "valid_loss"
    task = xsearch.tasks.get_task("listops", **TASK_OPTS)
    assert study.user_attrs["chance"]["valid"] == task.loss_chance("valid")
    assert study.user_attrs["chances"]["accuracy"]["valid"] == task.chance("valid")
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
        assert t.values[1] == lat["median_ms"] and t.values[0] == t.user_attrs["valid_loss"] > 0
        assert 0 <= t.user_attrs["accuracy"] <= 1
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
    hover = f"valid_loss {trials[0].values[0]:.4f}, accuracy {trials[0].user_attrs['accuracy']:.4f}"
    assert hover in (out / "pareto.html").read_text()  # a point's hover shows the accuracy beside the loss
    with (out / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5 and rows[0]["reference"] == "True"
    by_number = {t.number: t for t in trials}
    for r in rows:  # the ranked loss with its chance level, and the accuracy with its own
        t = by_number[int(r["number"])]
        assert float(r["metric"]) == t.values[0] and float(r["chance"]) == round(task.loss_chance("valid"), 4)
        assert float(r["accuracy"]) == t.user_attrs["accuracy"]
        assert float(r["accuracy_chance"]) == round(task.chance("valid"), 4)
    front = json.loads((out / "front.json").read_text())["front"]
    assert front and all(xsearch.ModelConfig.from_dict(r["model_config"]) for r in front)
    printed = capsys.readouterr().out
    assert "Pareto front" in printed and "valid_loss" in printed  # and the accuracy beside it, with both chances
    levels = f"valid_loss {task.loss_chance('valid'):.4f}, accuracy {task.chance('valid'):.4f}"
    assert f"chance level (validation) {levels}" in printed
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    # pick, then train the picked config from the CLI
    cfg_path = tmp_path / "config.json"
    assert main(["pick", "--storage", s.storage, "--study", "t", "--out", str(cfg_path)]) == 0
    picked = json.loads(cfg_path.read_text())
    best = min((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: (t.values[0], t.values[1]))
    assert picked["valid_loss"] == best.values[0] and picked["accuracy"] == best.user_attrs["accuracy"]
    assert picked["chance"] == task.loss_chance("valid") and picked["accuracy_chance"] == task.chance("valid")
    assert f"(valid_loss {best.values[0]:.4f}, accuracy {best.user_attrs['accuracy']:.4f}," in capsys.readouterr().out
    args = ["train", "--task", "listops", *sum((["--task-opt", f"{k}={v}"] for k, v in TASK_OPTS.items()), []),
            "--config", str(cfg_path), "--steps", "2", "--quiet", "--out", str(tmp_path / "m")]  # fmt: skip
    assert main(args) == 0
    assert xsearch.load_config(tmp_path / "m").attention == picked["model"]["attention"]


def test_failing_trial_is_recorded_and_study_goes_on(tmp_path, monkeypatch):
    run = Objective._run

    def flaky(self, trial, *rest):
        if trial.number == 1:
            raise RuntimeError("boom in trial 1")
        return run(self, trial, *rest)

    monkeypatch.setattr(Objective, "_run", flaky)
    s = settings(tmp_path, target="torch-cpu")
    run_search(s, progress=False)
    trials = optuna.load_study(study_name="t", storage=s.storage).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]  # 3 COMPLETE in all
    assert trials[1].user_attrs["error"] == "RuntimeError: boom in trial 1"


def test_a_search_whose_trials_keep_failing_for_one_reason_stops_with_it(tmp_path, monkeypatch):
    def broken(self, trial, *rest):
        raise RuntimeError("the same bug every time")

    monkeypatch.setattr(Objective, "_run", broken)
    s = settings(tmp_path, target="torch-cpu", trials=50, max_failures=3)
    with pytest.raises(RuntimeError, match="3 trials in a row failed with RuntimeError: the same bug every time"):
        run_search(s, progress=False)
    trials = optuna.load_study(study_name="t", storage=s.storage).get_trials()
    assert [t.state.name for t in trials] == ["FAIL"] * 3

    def user_error(self, trial, *rest):
        raise xsearch.XSearchError("a candidate the space cannot build")

    monkeypatch.setattr(Objective, "_run", user_error)
    with pytest.raises(xsearch.XSearchError, match="in a row failed with XSearchError: a candidate"):
        run_search(settings(tmp_path, target="torch-cpu", trials=50, study="u"), progress=False)


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


def test_measure_interleaved_mixes_targets(tmp_path):
    from xsearch.export import to_onnx

    cfg = xsearch.ModelConfig(vocab_size=16, max_len=32, d_model=32, n_layers=1, n_heads=2)
    model = xsearch.build_model(cfg).eval()
    to_onnx(model, tmp_path / "m.onnx", check=False)
    models = {"torch": model, "onnx": tmp_path / "m.onnx"}
    stats = measure_interleaved(models, "ort-cpu", seq_len=16, threads=1, warmup=1, repeats=4, rounds=2,
                                targets={"torch": "torch-cpu"})  # fmt: skip
    assert stats["torch"].target == "torch-cpu" and stats["onnx"].target == "ort-cpu"
    assert stats["torch"].repeats == stats["onnx"].repeats == 4
    one = measure_interleaved({"onnx": models["onnx"]}, seq_len=16, threads=1, warmup=0, repeats=2, rounds=3)
    assert one["onnx"].repeats == 2  # no more rounds than runs asked for
    with pytest.raises(ValueError, match="not measured: nope"):
        measure_interleaved(models, seq_len=16, targets={"nope": "torch-cpu"})
    with pytest.raises(ValueError, match="measures a torch model"):  # a path on a torch target
        measure_interleaved(models, "torch-cpu", seq_len=16, repeats=1)


def test_cli_errors(tmp_path):
    assert main(["search", "--task", "listops", "--space", "nope", "--trials", "1"]) == 2
    assert main(["report", "--storage", f"sqlite:///{tmp_path}/x.db", "--study", "nope", "--out", str(tmp_path)]) == 2


def fake_latency(monkeypatch):
    """Latency that grows with the model (deterministic): d_model * n_layers / 64 ms (the reference: 2 ms)."""
    from xsearch.latency import LatencyStats

    def measure(model, target, **kw):
        ms = model.config.d_model * model.config.n_layers / 64
        return LatencyStats(ms, ms, ms, ms, 0.0, 1, target, {"threads": kw.get("threads")})

    monkeypatch.setattr("xsearch.latency.timing.measure", measure)


def test_budgeted_search_prunes_over_budget_before_training_and_stops_weak_trials_early(tmp_path, monkeypatch, capsys):
    fake_latency(monkeypatch)
    should_prune = optuna.trial.Trial.should_prune
    forced = []  # the first trial that trains after the reference is stopped at its first report

    def prune_once(t):
        if t.number > 0 and (not forced or forced == [t.number]):
            forced[:] = [t.number]
            return True
        return should_prune(t)

    monkeypatch.setattr(optuna.trial.Trial, "should_prune", prune_once)
    s = settings(tmp_path, objective="accuracy", max_latency_ms=0.6, trials=3, train_steps=16, sampler="random",
                 rank_by="accuracy")  # fmt: skip
    assert s.pruner == "hyperband"
    study = run_search(s, progress=False)
    assert [d.name for d in study.directions] == ["MAXIMIZE"]
    trials = study.get_trials()
    assert sum(t.state.name == "COMPLETE" for t in trials) == 3
    ref = trials[0]
    # the reference (2 ms) is never pruned: trained fully, kept off the front and out of pick as over budget
    assert ref.user_attrs["reference"] and ref.state.name == "COMPLETE" and not is_feasible(ref)
    assert ref.user_attrs["train_steps"] == 16
    for t in trials:
        lat = t.user_attrs["latency"]["median_ms"]
        if t.state.name == "PRUNED" and t.user_attrs["pruned"].startswith("over budget"):
            assert lat > 0.6 and t.user_attrs["train_steps"] == 0 and not t.intermediate_values
        elif t.state.name == "PRUNED":  # stopped early, by the forced decision or by Hyperband itself
            steps = t.user_attrs["train_steps"]
            assert 0 < steps < 16 and max(t.intermediate_values) == steps and t.number > 0
            assert t.user_attrs["pruned"].startswith(f"stopped early at step {steps}")
        else:
            assert t.state.name == "COMPLETE" and (lat <= 0.6 or t.number == 0)
            assert list(t.intermediate_values) == [2, 4, 6, 8, 10, 12, 14, 16]  # a report every 16 // 8 steps
            assert t.user_attrs["train_steps"] == 16 and t.value == t.user_attrs["accuracy"]
    assert any(t.user_attrs.get("pruned", "").startswith("over budget") for t in trials)
    assert trials[forced[0]].user_attrs["pruned"] == "stopped early at step 2: accuracy " + (
        f"{trials[forced[0]].intermediate_values[2]:.4f}"
    )
    early = sum(t.user_attrs.get("pruned", "").startswith("stopped") for t in trials)
    # pick and report read single-objective studies too
    best = pick(study)
    assert best.number != 0 and best.user_attrs["latency"]["median_ms"] <= 0.6
    assert best.value == max(t.value for t in trials if t.state.name == "COMPLETE" and t.number != 0)
    cfg_path = tmp_path / "picked.json"
    assert main(["pick", "--storage", s.storage, "--study", "t", "--out", str(cfg_path)]) == 0
    doc = json.loads(cfg_path.read_text())
    assert doc["trial"] == best.number and doc["latency_ms"] == best.user_attrs["latency"]["median_ms"]
    out = tmp_path / "report"
    assert main(["report", "--storage", s.storage, "--study", "t", "--out", str(out)]) == 0
    front = json.loads((out / "front.json").read_text())["front"]
    assert best.number in [r["number"] for r in front] and 0 not in [r["number"] for r in front]
    with (out / "trials.csv").open() as f:
        rows = {int(r["number"]): r for r in csv.DictReader(f)}
    assert rows[forced[0]]["pruned"].startswith("stopped early") and rows[forced[0]]["metric"] == ""
    printed = capsys.readouterr().out
    assert f"over budget before training, {early} stopped early" in printed and "Pareto front" in printed
    # a study keeps its kind: resuming it as a two-objective search is an error that says so
    with pytest.raises(ValueError, match="single-objective"):
        run_search(settings(tmp_path, max_latency_ms=1.0, trials=4, rank_by="accuracy"), progress=False)
    # and what it ranks by
    with pytest.raises(ValueError, match=r"\['accuracy'\].*rank_by 'loss'"):
        run_search(settings(tmp_path, objective="accuracy", max_latency_ms=0.6, trials=4), progress=False)


def test_a_study_of_the_same_directions_that_ranks_by_another_metric_is_refused(tmp_path):
    from xsearch.search.study import open_study

    s = settings(tmp_path, objective="accuracy", max_latency_ms=1.0)  # minimizes the validation loss
    assert open_study(s, "classify").metric_names == ["valid_loss"]
    with pytest.raises(ValueError, match="study 't' ranks by 'valid_loss', not 'bits_per_byte'"):
        open_study(s, "lm")  # (bits per byte: minimized too, so the directions alone would not tell)
    assert open_study(s, "classify").metric_names == ["valid_loss"]  # (refused, not renamed)


def test_a_budgeted_search_ranked_by_loss_reports_the_loss_to_its_pruner(tmp_path):
    s = settings(tmp_path, objective="accuracy", max_latency_ms=1e9, trials=2, train_steps=8, pruner="none",
                 target="torch-cpu")  # fmt: skip
    study = run_search(s, progress=False)
    assert [d.name for d in study.directions] == ["MINIMIZE"] and study.metric_names == ["valid_loss"]
    for t in study.get_trials():
        assert t.value == t.user_attrs["valid_loss"] and list(t.intermediate_values) == [1, 2, 3, 4, 5, 6, 7, 8]
        # the last report is the loss of the weights scored (the validation split is one batch of 32)
        assert t.intermediate_values[8] == pytest.approx(t.value)
    assert pick(study).value == min(t.value for t in study.get_trials())


def test_budgeted_search_settings_errors(tmp_path):
    with pytest.raises(ValueError, match="max_latency_ms"):
        settings(tmp_path, objective="accuracy")
    with pytest.raises(ValueError, match="needs objective 'accuracy'"):
        settings(tmp_path, pruner="hyperband")
    with pytest.raises(ValueError, match="equal training steps"):
        settings(tmp_path, objective="accuracy", max_latency_ms=1.0, pruner="median", train_steps=None,
                 train_seconds=1.0)  # fmt: skip
    with pytest.raises(ValueError, match="objective must be one of both, accuracy, got 'speed'"):
        settings(tmp_path, objective="speed")
    assert main(["search", "--task", "listops", "--space", "tiny", "--objective", "accuracy"]) == 2


def test_trial_zero_is_the_reference_and_workers_with_one_seed_draw_different_candidates(tmp_path):
    from xsearch.search.sampling import PerTrialSampler, make_sampler

    url = f"sqlite:///{tmp_path}/w.db"
    workers = [
        optuna.create_study(storage=url, study_name="w", load_if_exists=True,
                            sampler=PerTrialSampler(lambda n: make_sampler("tpe", 0 + n, 10), {"x": 0.5}))
        for _ in range(2)
    ]  # fmt: skip
    asked = [workers[i % 2].ask() for i in range(4)]  # both "workers" start trials at the same time
    xs = [t.suggest_float("x", 0.0, 1.0) for t in asked]
    assert xs[0] == 0.5 and len(set(xs)) == 4
    # the same seed and trial number draw the same candidate: one worker's study is reproducible
    again = optuna.create_study(sampler=PerTrialSampler(lambda n: make_sampler("tpe", 0 + n, 10), {"x": 0.5}))
    assert [again.ask().suggest_float("x", 0.0, 1.0) for _ in range(4)] == xs


SMALL_SPACE = """\
name: two
reference: {attention: full, d_model: 16, n_layers: 1, n_heads: 2, ffn_ratio: 1}
model: {d_model: [16], n_layers: [1], n_heads: [2], ffn_ratio: [1]}
attention:
  full: {}
  local: {block_size: [8]}
"""


def test_a_repeated_candidate_reuses_its_twin_instead_of_training_again(tmp_path, monkeypatch):
    space = tmp_path / "two.yaml"
    space.write_text(SMALL_SPACE)  # two architectures in all: 5 trials must repeat some
    trained = []
    train = Objective._train

    def counting(self, trial, model):
        trained.append(trial.number)
        return train(self, trial, model)

    monkeypatch.setattr(Objective, "_train", counting)
    s = settings(tmp_path, space=str(space), target="torch-cpu", trials=5, max_params=10**9)
    study = run_search(s, progress=False)
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * 5
    configs = {json.dumps(t.user_attrs["model_config"], sort_keys=True) for t in trials}
    assert len(configs) == 2 and len(trained) == 2  # each architecture trained once
    for t in trials:
        twin = t.user_attrs.get("duplicate_of")
        if twin is None:
            assert t.number in trained
            continue
        first = trials[twin]
        assert first.user_attrs.get("duplicate_of") is None and first.user_attrs["model_config"] == t.user_attrs[
            "model_config"]  # fmt: skip
        assert t.values == first.values and t.user_attrs["train_steps"] == 0 and t.user_attrs["latency_cached"]
        assert t.system_attrs.get("constraints") == first.system_attrs.get("constraints")  # the sampler sees them
    assert all(t.user_attrs.get("duplicate_of") is None for t in pareto_front(study))


def test_a_study_reads_well_in_optuna_dashboard(tmp_path):
    """optuna-dashboard shows the objectives by name, and each trial's constraints and user attributes."""
    import io
    from wsgiref.util import setup_testing_defaults

    dashboard = pytest.importorskip("optuna_dashboard")
    s = settings(tmp_path, target="torch-cpu", trials=2, max_params=10**9)
    run_search(s, progress=False)
    app = dashboard.wsgi(s.storage)

    def get(path: str):
        environ: dict = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "wsgi.input": io.BytesIO()}
        setup_testing_defaults(environ)
        status = []
        body = b"".join(app(environ, lambda st, headers, exc=None: status.append(st)))
        assert status[0].startswith("200"), status
        return json.loads(body)

    (summary,) = [x for x in get("/api/studies")["study_summaries"] if x["study_name"] == "t"]
    detail = get(f"/api/studies/{summary['study_id']}")
    assert detail["objective_names"] == ["valid_loss", "latency_ms"]
    trial = detail["trials"][0]
    keys = {a["key"] for a in trial["user_attrs"]}
    assert {"model_config", "latency", "reference", "accuracy", "valid_loss", "n_parameters", "constraints"} <= keys
    shown = json.loads(next(a["value"] for a in trial["user_attrs"] if a["key"] == "constraints"))
    assert list(shown) == ["params"] and shown["params"] <= 0  # the parameter budget, met
    study_keys = {a["key"] for a in detail["user_attrs"]}
    assert {"chance", "metric", "task", "space"} <= study_keys


def test_the_pruner_watches_the_steps_a_trial_trains_and_none_when_it_trains_none():
    from xsearch.search.sampling import make_pruner

    budgeted = dict(objective="accuracy", max_latency_ms=1.0)
    standalone = make_pruner(SearchSettings(**budgeted, train_steps=160))
    finetuned = make_pruner(SearchSettings(**budgeted, supernet="sn", inherited_finetune_steps=40))
    inherited = make_pruner(SearchSettings(**budgeted, supernet="sn"))
    assert isinstance(standalone, optuna.pruners.HyperbandPruner) and standalone._max_resource == 160
    assert isinstance(finetuned, optuna.pruners.HyperbandPruner) and finetuned._max_resource == 40
    assert isinstance(inherited, optuna.pruners.NopPruner)  # (inherited scores report nothing to prune on)
