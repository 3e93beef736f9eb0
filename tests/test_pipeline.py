"""``xsearch run``: the pipeline.yaml schema, the restartable stage runner, and a whole run killed and resumed."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from xsearch.pipeline import DEFAULT_YAML, PipelineConfigError, RunLockedError, load_pipeline_config
from xsearch.pipeline.runner import RunFolder, Stage


# -- configuration -----------------------------------------------------------------------------
def test_default_config_is_valid_and_printed_config_round_trips(tmp_path):
    cfg = load_pipeline_config()
    assert cfg.task.name == "listops" and cfg.search.space == "tiny" and cfg.target == "ort-cpu"
    out = subprocess.run([sys.executable, "-m", "xsearch.cli", "run", "--print-config"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert out == DEFAULT_YAML
    path = tmp_path / "p.yaml"
    path.write_text(out)
    assert load_pipeline_config(path) == cfg


def test_user_file_states_only_what_it_changes(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("name: mine\nsearch:\n  trials: 30\ntask:\n  options: {max_len: 512}\n")
    cfg = load_pipeline_config(path, {"compress.prune_ffn": 0.25})
    assert (cfg.name, cfg.search.trials, cfg.compress.prune_ffn) == ("mine", 30, 0.25)
    assert cfg.search.space == "tiny"  # untouched keys keep the default
    assert cfg.task.options == {"max_len": 512}  # task options replace the default's as a whole
    assert cfg.run_dir == Path("runs/mine")


def test_a_supernet_search_may_fine_tune_its_candidates_and_only_it():
    cfg = load_pipeline_config(overrides={"search.mode": "supernet", "search.inherited_finetune_steps": 50})
    assert (cfg.search.trial_steps(), cfg.search.sampler_name()) == (50, "tpe")  # each trial trains: few of them
    assert load_pipeline_config(overrides={"search.mode": "supernet"}).search.sampler_name() == "nsga2"
    with pytest.raises(PipelineConfigError, match="search.inherited_finetune_steps .* give search.mode 'supernet'"):
        load_pipeline_config(overrides={"search.inherited_finetune_steps": 50})


def test_a_budget_in_seconds_replaces_the_default_steps_and_null_clears_a_key(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("search:\n  train_seconds: 5\ntrain:\n  seconds: 20\n")
    cfg = load_pipeline_config(path)
    assert (cfg.search.train_steps, cfg.search.train_seconds) == (None, 5.0)
    assert (cfg.train.steps, cfg.train.seconds) == (None, 20.0)
    cfg = load_pipeline_config(overrides={"search.train_seconds": 3, "pick.max_latency_ms": None})
    assert (cfg.search.train_steps, cfg.search.train_seconds, cfg.pick.max_latency_ms) == (None, 3.0, None)
    from xsearch.pipeline.config import validate

    data = yaml.safe_load(DEFAULT_YAML)
    data["search"].update(train_steps=None, train_seconds=None)
    assert validate(data).search.train_steps == 200  # neither: the search's default step budget


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("search:\n  trails: 3\n", "'search.trails' (did you mean 'trials'?)"),
        ("serch: {}\n", "'serch' (did you mean 'search'?)"),
        ("search:\n  trials: ten\n", "search.trials must be an integer, got 'ten'"),
        ("search: 3\n", "search must be a mapping"),
        ("target: tpu\n", "target must be one of ort-cpu, ort-cuda, torch-cpu, torch-cuda, got 'tpu'"),
        ("compress:\n  prune_ffn: 1.5\n", "compress.prune_ffn must be < 1, got 1.5"),
        ("train:\n  steps: 100\n  seconds: 10\n", "give train.steps or train.seconds, not both"),
        ("train:\n  steps: null\n", "give train.steps or train.seconds"),
        ("threads: 0\n", "threads must be > 0, got 0"),
        ("task:\n  name: imagenet\n", "task.name must be one of listops, lm, pathfinder, text, got 'imagenet'"),
        ("task:\n  options: {bogus: 1}\n", "task.options: task 'listops' has no option 'bogus'"),
        ("search:\n  objective: accuracy\n", "give search.max_latency_ms"),
        ("search:\n\ttrials: 3\n", "not valid YAML (line 2)"),
        ("- 1\n- 2\n", "expected a mapping of keys"),
    ],
)
def test_bad_config_names_the_key(tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PipelineConfigError) as e:
        load_pipeline_config(path)
    assert needle in str(e.value)


def test_cli_bad_config_is_one_line_exit_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("search:\n  trails: 3\n")
    for args in (["--config", str(path)], ["--config", str(tmp_path / "missing.yaml")], ["--set", "pick.budget=3"]):
        r = subprocess.run([sys.executable, "-m", "xsearch.cli", "run", "--runs-dir", str(tmp_path), *args],
                           capture_output=True, text=True)  # fmt: skip
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert (
        "search.trails"
        in subprocess.run(
            [sys.executable, "-m", "xsearch.cli", "run", "--config", str(path)], capture_output=True, text=True
        ).stderr
    )


# -- the stage runner ------------------------------------------------------------------------------
class _Boom(Exception):
    pass


def _stages(log: list[str], fail_at: str | None = None):
    def make(name: str):
        def run(ctx, work: Path):
            log.append(name)
            (work / f"{name}.txt").write_text(name)
            if name == fail_at:
                raise _Boom(name)
            return {"n": len(log)}

        return run

    return [Stage(n, make(n), n, resumes=(n == "a")) for n in ("a", "b", "c")]


def test_runner_continues_after_a_failure_without_touching_finished_stages(tmp_path):
    log: list[str] = []
    run = RunFolder(tmp_path / "r", _stages(log, fail_at="b"))
    with pytest.raises(_Boom):
        run.run(None, log=lambda s: None)
    assert run.done("a") and not run.done("b") and not run.folder("b").exists()
    assert (tmp_path / "r" / "02-b.partial" / "b.txt").exists()
    before = (run.folder("a") / "stage.json").stat().st_mtime_ns
    log.clear()
    run = RunFolder(tmp_path / "r", _stages(log))
    run.run(None, log=lambda s: None)
    assert log == ["b", "c"]  # a finished stage is never redone
    assert (run.folder("a") / "stage.json").stat().st_mtime_ns == before
    assert run.result("c")["stage"] == "c" and not list((tmp_path / "r").glob("*.partial"))


def test_runner_redoes_a_partial_stage_from_scratch_unless_it_resumes(tmp_path):
    log: list[str] = []
    root = tmp_path / "r"
    (root / "01-a.partial").mkdir(parents=True)
    (root / "01-a.partial" / "kept.txt").write_text("work so far")
    (root / "02-b.partial").mkdir()
    (root / "02-b.partial" / "stale.txt").write_text("half-written")
    RunFolder(root, _stages(log)).run(None, log=lambda s: None)
    assert (root / "01-a" / "kept.txt").exists()  # a resuming stage continues in its work folder
    assert not (root / "02-b" / "stale.txt").exists()  # any other stage starts over


def test_run_folder_lock_and_config_check(tmp_path):
    first, second = RunFolder(tmp_path / "r", []), RunFolder(tmp_path / "r", [])
    first.lock()
    try:
        with pytest.raises(RunLockedError, match=str(os.getpid())):
            second.lock()
    finally:
        first.unlock()
    second.lock()
    second.unlock()


def test_config_changes_are_refused_only_where_a_finished_stage_reflects_them(tmp_path):
    from xsearch.pipeline.stages import stages_for

    def finish(run: RunFolder, name: str) -> None:
        run.folder(name).mkdir(parents=True)
        (run.folder(name) / "stage.json").write_text("{}")

    run = RunFolder(tmp_path / "r", stages_for(load_pipeline_config()))
    run.check_config(load_pipeline_config())
    finish(run, "search")
    finish(run, "report")
    run.check_config(load_pipeline_config(name="moved"))  # the name/folder may change
    run.check_config(load_pipeline_config(overrides={"pick.min_speedup": 2.0}))  # the pick has not run: taken
    saved = yaml.safe_load((run.root / "pipeline.yaml").read_text())
    assert saved["pick"]["min_speedup"] == 2.0
    with pytest.raises(PipelineConfigError, match=r"stage 'search' .*search.trials: 8 -> 9.*--redo-from search"):
        run.check_config(load_pipeline_config(overrides={"search.trials": 9, "pick.min_speedup": 2.0}))

    # --redo-from search: the search folder goes back to .partial (its study kept), later stages are forgotten
    (run.folder("search") / "study.db").write_text("trials")
    run.redo_from("search")
    assert not run.folder("search").exists() and not run.folder("report").exists()
    assert (run.root / "01-search.partial" / "study.db").read_text() == "trials"
    assert not (run.root / "01-search.partial" / "stage.json").exists()
    run.check_config(load_pipeline_config(overrides={"search.trials": 9, "pick.min_speedup": 2.0}))


def test_where_a_finished_stage_trained_is_not_a_change_of_what_it_made(tmp_path):
    from xsearch.pipeline.stages import stages_for

    run = RunFolder(tmp_path / "r", stages_for(load_pipeline_config()))
    run.check_config(load_pipeline_config())
    for name in ("search", "report", "pick", "train"):
        run.folder(name).mkdir(parents=True)
        (run.folder(name) / "stage.json").write_text("{}")
    gpu = {"train.device": "cuda", "search.train_device": "cuda:1"}
    run.check_config(load_pipeline_config(overrides=gpu))  # resumed on a GPU machine: taken
    saved = yaml.safe_load((run.root / "pipeline.yaml").read_text())
    assert saved["train"]["device"] == "cuda" and saved["search"]["train_device"] == "cuda:1"
    with pytest.raises(PipelineConfigError, match=r"stage 'train' .*train.lr"):
        run.check_config(load_pipeline_config(overrides={"train.lr": 0.01}))


# -- a whole run, killed twice and resumed --------------------------------------------------------
SMALL = {
    "search.trials": 3,
    "search.train_seconds": 1,
    "search.latency_repeats": 3,
    "train.seconds": 4,
    "compress.finetune_steps": 4,
    "verify.latency_repeats": 3,
    "task.options.n_train": 200,
    "task.options.n_valid": 32,
    "task.options.n_test": 64,
    "task.options.max_len": 128,
}


def _snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"  # the lock file holds the pid of the last run
    }


def _trials(db: Path) -> list:
    import optuna

    if not db.exists():
        return []
    try:
        return optuna.load_study(study_name="search", storage=f"sqlite:///{db}").get_trials(deepcopy=False)
    except Exception:  # the study is not created yet
        return []


def _start(tmp_path: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "xsearch.cli", "run", "--runs-dir", str(tmp_path), "--name", "t", "--quiet"]
    for k, v in SMALL.items():
        args += ["--set", f"{k}={v}"]
    env = {**os.environ, "XSEARCH_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _wait(proc: subprocess.Popen, until, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        if proc.poll() is not None:
            raise AssertionError(f"run ended before the kill point: {proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("kill point not reached in time")
        time.sleep(0.1)


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()


def test_killed_run_resumes_without_redoing_or_touching_finished_stages(tmp_path):
    from optuna.trial import TrialState

    from xsearch.export import Predictor

    run = tmp_path / "t"
    db = run / "01-search.partial" / "study.db"

    # 1. kill -9 in the middle of a search trial, after another one has completed
    proc = _start(tmp_path)
    _wait(proc, lambda: (ts := _trials(db)) and any(t.state == TrialState.COMPLETE for t in ts)
          and ts[-1].state == TrialState.RUNNING and "model_config" in ts[-1].user_attrs)  # fmt: skip
    _kill(proc)
    done_before = {t.number: t.values for t in _trials(db) if t.state == TrialState.COMPLETE}

    # 2. resume; kill -9 while the reference Transformer trains (stages 1-4 finished)
    proc = _start(tmp_path)
    _wait(proc, lambda: (run / "05-reference.partial").exists())
    _kill(proc)
    finished = {name: _snapshot(run / name) for name in ("01-search", "02-report", "03-pick", "04-train")}
    trials = _trials(run / "01-search" / "study.db")
    for number, values in done_before.items():  # trials finished before the first kill were kept, not redone
        assert trials[number].state == TrialState.COMPLETE and trials[number].values == values
    interrupted = [t for t in trials if t.user_attrs.get("interrupted")]
    assert len(interrupted) == 1 and interrupted[0].state == TrialState.FAIL
    retried = [t for t in trials if t.user_attrs.get("retry_of") == interrupted[0].number]
    assert len(retried) == 1 and retried[0].params == interrupted[0].params  # the same candidate, run again
    assert sum(t.state == TrialState.COMPLETE for t in trials) == SMALL["search.trials"]

    # 3. resume to the end
    proc = _start(tmp_path)
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out
    assert "done earlier" in out and "[10/10] summary" in out
    for name, snap in finished.items():
        assert _snapshot(run / name) == snap, f"{name} changed on resume"
    assert not list(run.glob("*.partial"))

    summary = json.loads((run / "summary.json").read_text())
    models = summary["models"]
    assert summary["shipped_vs_reference"]["speedup"] == pytest.approx(
        models["reference"]["latency_ms"] / models["shipped"]["latency_ms"]
    )
    assert models["shipped"]["size_bytes"] == (run / models["shipped"]["file"]).stat().st_size
    assert models["shipped"]["parameters"] < models["searched"]["parameters"]  # the FFN was pruned
    assert (run / "summary.md").read_text().count("|") > 20 and (run / "02-report" / "pareto.png").stat().st_size
    assert yaml.safe_load((run / "pipeline.yaml").read_text())["search"]["trials"] == SMALL["search.trials"]

    predictor = Predictor(run / models["shipped"]["file"])  # the shipped file classifies on its own
    preds = predictor.predict(["[MAX 2 9 [MIN 4 7 ] 0 ]", "[SM 1 2 ]"])
    assert len(preds) == 2 and all(p.label in [str(d) for d in range(10)] for p in preds)

    # 4. re-running a finished run redoes nothing and prints the summary again
    everything = _snapshot(run)
    proc = _start(tmp_path)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.count("done earlier") == 10 and "shipped" in out, out
    assert _snapshot(run) == everything


def test_a_model_that_does_not_beat_chance_is_flagged_with_what_to_raise():
    from xsearch.pipeline.summary import beats_chance, chance_margin, chance_warnings

    cfg = load_pipeline_config()
    margin = chance_margin(0.158, 500, higher_is_better=True)
    assert margin == pytest.approx(2 * (0.158 * 0.842 / 500) ** 0.5)  # two standard errors at chance
    models = {"reference": {"test_metric": 0.158, "metric": "accuracy"},
              "searched": {"test_metric": 0.32, "metric": "accuracy"},
              "shipped": {"test_metric": 0.17, "metric": "accuracy"}}  # fmt: skip
    warnings = chance_warnings(models, 0.158, margin, True, cfg)
    assert len(warnings) == 2 and warnings[0].startswith("the reference model's test accuracy 0.1580 does not clearly")
    assert f"raise train.steps (now {cfg.train.steps})" in warnings[0] and "search.train_steps" not in warnings[0]
    assert "the shipped model" in warnings[1] and f"search.train_steps (now {cfg.search.train_steps})" in warnings[1]
    assert not beats_chance(2.1, 2.0, 0.05, higher_is_better=False) and beats_chance(1.9, 2.0, 0.05, False)


def test_supernet_mode_trains_the_supernet_searches_with_it_and_fine_tunes_the_pick(tmp_path):
    import optuna

    from xsearch.pipeline import run_pipeline

    assert "mode: standalone" in DEFAULT_YAML and "\nsupernet:\n" in DEFAULT_YAML
    with pytest.raises(PipelineConfigError, match="search.mode"):
        load_pipeline_config(overrides={"search.mode": "oneshot"})
    with pytest.raises(PipelineConfigError, match="search.supernet"):  # the pipeline sets it itself
        load_pipeline_config(overrides={"search.supernet": "x"})
    small = {**SMALL, "search.mode": "supernet", "supernet.steps": 30, "train.seconds": None, "train.steps": 10}
    small.pop("search.train_seconds")
    cfg = load_pipeline_config(overrides=small, name="sn")
    cfg = type(cfg)(**{**cfg.__dict__, "runs_dir": str(tmp_path)})
    lines = []
    summary = run_pipeline(cfg, progress=False, echo=lines.append)
    run = tmp_path / "sn"
    assert (run / "01-supernet" / "supernet" / "supernet.safetensors").is_file()
    assert json.loads((run / "01-supernet" / "stage.json").read_text())["steps"] == 30
    study = optuna.load_study(study_name="search", storage=f"sqlite:///{run / '02-search' / 'study.db'}")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == SMALL["search.trials"] and all(t.user_attrs["train_steps"] == 0 for t in done)
    assert json.loads((run / "05-train" / "stage.json").read_text())["init"] == "supernet"
    assert summary["search"]["mode"] == "supernet" and summary["train_steps"]["supernet"] == 30
    assert (run / summary["search"]["pareto_png"]).is_file()
    assert any("fine-tuned from its weights in the supernet" in line for line in lines)


def test_pretrain_stage_pretrains_the_pick_and_the_reference_then_fine_tunes_them_with_new_heads(tmp_path):
    from xsearch.pipeline import run_pipeline
    from xsearch.pipeline.stages import stages_for

    assert "\npretrain:\n" in DEFAULT_YAML and "enabled: false" in DEFAULT_YAML
    assert "pretrain" not in [s.name for s in stages_for(load_pipeline_config())]  # off: numbering unchanged
    small = {**SMALL, "pretrain.enabled": True, "pretrain.steps": 12, "train.seconds": None, "train.steps": 6}
    cfg = load_pipeline_config(overrides=small, name="pre")
    cfg = type(cfg)(**{**cfg.__dict__, "runs_dir": str(tmp_path)})
    lines = []
    summary = run_pipeline(cfg, progress=False, echo=lines.append)
    run = tmp_path / "pre"
    stage = json.loads((run / "04-pretrain" / "stage.json").read_text())
    for name in ("picked", "reference"):
        assert stage[name]["steps"] == 12 and stage[name]["valid_loss_after"] < stage[name]["valid_loss_before"]
        assert (run / "04-pretrain" / name / "pretrain.json").is_file()
    for name in ("05-train", "06-reference"):
        assert json.loads((run / name / "stage.json").read_text())["init"] == "pretrained"
    assert summary["train_steps"]["pretrain"] == {"picked": 12, "reference": 12}
    assert "self-pretraining before training: reference 12, searched 12" in (run / "summary.md").read_text()
    assert sum("fine-tuned from its pretraining" in line for line in lines) == 2
