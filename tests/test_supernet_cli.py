"""``xsearch supernet train`` (resume after kill -9), ``xsearch search --supernet`` and ``xsearch supernet extract``."""

import json
import os
import signal
import subprocess
import sys
import time
from importlib import resources

import optuna
import pytest
import torch
import yaml

import xsearch
from xsearch.cli import main
from xsearch.supernet import extract_subnet, load_supernet
from xsearch.tasks import get_task

TASK_OPTS = {"n_train": 128, "n_valid": 32, "n_test": 32, "min_len": 8, "max_len": 32}
TASK = ["--task", "listops"] + [a for k, v in TASK_OPTS.items() for a in ("--task-opt", f"{k}={v}")]


def _train(out, steps, every=5):
    return ["supernet", "train", *TASK, "--space", "tiny", "--steps", str(steps), "--checkpoint-every", str(every),
            "--quiet", "--out", str(out)]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("sn") / "sn"
    assert main(_train(out, 20)) == 0
    return out


def test_supernet_training_resumes_after_kill_9_exactly(trained, tmp_path):
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "xsearch.cli", *_train(out, 20, every=2)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "training.json").is_file():
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    state = json.loads((out / "training.json").read_text())
    assert 0 < state["steps"] < 20 and not state["done"], state  # killed part way
    assert main(_train(out, 20, every=2)) == 0  # the same command resumes
    again, whole = load_supernet(out), load_supernet(trained)
    assert json.loads((out / "training.json").read_text())["steps"] == 20
    for name in whole.shapes:  # the same weights as the uninterrupted run
        torch.testing.assert_close(again.tensor(name), whole.tensor(name), atol=1e-6, rtol=0)


def test_search_with_inherited_weights_then_extract(trained, tmp_path, capsys):
    db = f"sqlite:///{tmp_path}/s.db"
    search = ["search", *TASK, "--space", "tiny", "--storage", db, "--study", "one", "--trials", "6",
              "--supernet", str(trained), "--latency-repeats", "2", "--quiet"]  # fmt: skip
    assert main(search) == 0
    study = optuna.load_study(study_name="one", storage=db)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 6 and all(t.user_attrs["train_steps"] == 0 for t in done)
    # the default sampler (auto) of a supernet search is NSGA-II: it marks each trial with its generation
    assert all("NSGAIISampler:generation" in t.system_attrs for t in done[1:])  # (trial 0: the reference)
    sn = load_supernet(trained)
    task = get_task("listops", **TASK_OPTS)
    t = done[-1]
    model = extract_subnet(sn, t.user_attrs["model_config"])
    score = xsearch.evaluate_score(model, task, "valid")  # the trial's scores are the inherited weights'
    assert score.loss == pytest.approx(t.values[0]) and score.metric == pytest.approx(t.user_attrs["accuracy"])
    picked = tmp_path / "picked.json"
    picked.write_text(json.dumps({"model": t.user_attrs["model_config"]}))
    assert main(["supernet", "extract", str(trained), "--config", str(picked), "--out", str(tmp_path / "m")]) == 0
    loaded = xsearch.load_model(tmp_path / "m")
    ids, mask, _ = next(task.batches("valid", 16))
    torch.testing.assert_close(loaded(ids, mask), sn.eval()(ids, mask, subnet=t.user_attrs["model_config"]),
                               atol=1e-5, rtol=0)  # fmt: skip
    # and it fine-tunes from those weights (--init), like any saved model
    assert main(["train", *TASK, "--init", str(tmp_path / "m"), "--steps", "1", "--lr", "1e-9", "--quiet", "--out",
                 str(tmp_path / "ft")]) == 0  # fmt: skip
    tuned = xsearch.load_model(tmp_path / "ft")
    assert tuned.config == loaded.config
    torch.testing.assert_close(tuned(ids, mask), loaded(ids, mask), atol=1e-4, rtol=0)  # (one step at lr 1e-9)
    metrics = json.loads((tmp_path / "ft" / "metrics.json").read_text())
    assert metrics["init"] == str(tmp_path / "m") and metrics["steps"] == 1
    _one_line(capsys, ["train", *TASK, "--init", str(tmp_path / "m"), "--attention", "full", "--steps", "1",
                       "--out", str(tmp_path / "x")], "--init takes the architecture of")  # fmt: skip
    longer = [a.replace("max_len=32", "max_len=48") for a in TASK]
    _one_line(capsys, ["train", *longer, "--init", str(tmp_path / "m"), "--steps", "1", "--out", str(tmp_path / "x")],
              "is a model with max_len=32, but the task needs max_len=48")  # fmt: skip


def test_search_fine_tunes_each_candidate_from_its_inherited_weights(trained, tmp_path, capsys):
    from xsearch.training import train

    db = f"sqlite:///{tmp_path}/s.db"
    search = ["search", *TASK, "--space", "tiny", "--storage", db, "--study", "ft", "--trials", "3",
              "--supernet", str(trained), "--inherited-finetune-steps", "4", "--lr", "0.002", "--seed", "3",
              "--latency-repeats", "2", "--quiet"]  # fmt: skip
    assert main(search) == 0
    study = optuna.load_study(study_name="ft", storage=db)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 3
    done = [t for t in done if "duplicate_of" not in t.user_attrs]  # (a repeat of an architecture trains nothing)
    assert len(done) >= 2 and all(t.user_attrs["train_steps"] == 4 for t in done)
    assert all(t.user_attrs["inherited_from"] == str(trained) for t in done)
    # a few candidates, each trained: the auto sampler is TPE, not the NSGA-II of inherited scoring
    assert not any("NSGAIISampler:generation" in t.system_attrs for t in done)
    sn, task = load_supernet(trained), get_task("listops", **TASK_OPTS)
    for t in done:  # each trial's score is its subnet's inherited weights trained 4 steps (seed + trial number)
        inherited = extract_subnet(sn, t.user_attrs["model_config"])
        untrained = xsearch.evaluate_score(inherited, task, "valid")
        train(inherited, task, steps=4, batch_size=32, lr=0.002, seed=3 + t.number, progress=False)
        score = xsearch.evaluate_score(inherited, task, "valid")
        assert score.loss == pytest.approx(t.values[0], abs=1e-6) and score.loss != pytest.approx(untrained.loss)
        assert score.metric == pytest.approx(t.user_attrs["accuracy"])
    # (and each trial trained a copy: the supernet the later trials drew from was never changed)
    _one_line(
        capsys,
        ["search", *TASK, "--space", "tiny", "--inherited-finetune-steps", "4"],
        "--inherited-finetune-steps fine-tunes the weights a supernet gives each candidate: give --supernet",
    )
    for budget in (["--train-steps", "4"], ["--train-seconds", "2"]):  # a budget that would go unused is refused
        _one_line(capsys, ["search", *TASK, "--space", "tiny", "--supernet", str(trained), *budget],
                  f"{budget[0]} trains each candidate from new weights, and a search with --supernet trains none: "
                  "give --inherited-finetune-steps")  # fmt: skip


def _one_line(capsys, argv, needle):
    capsys.readouterr()
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip() and not ln.lstrip().startswith("INFO")]
    assert len(err) == 1 and needle in err[0], err


def test_a_supernet_of_another_space_or_task_is_refused(trained, tmp_path, capsys):
    db = f"sqlite:///{tmp_path}/s.db"
    search = ["search", *TASK, "--storage", db, "--trials", "1", "--supernet", str(trained), "--quiet"]
    _one_line(capsys, [*search, "--space", "default"], "was built for space 'tiny', not 'default'")
    other = [a.replace("max_len=32", "max_len=48") for a in search]
    _one_line(capsys, [*other, "--space", "tiny"], "built for another task (max_len 32 there, 48 in this task)")
    _one_line(capsys, [*search, "--space", "tiny", "--supernet", str(tmp_path)], "is not a saved supernet")
    retrain = ["supernet", "train", *TASK, "--space", "per_layer", "--steps", "20", "--quiet", "--out", str(trained)]
    _one_line(capsys, retrain, "was built for space 'tiny', not 'per_layer'")
    # a space is what it holds: a renamed copy with its own description and its variants in another order is
    # the same space; one more FFN ratio is another, and the message names where they part
    tiny = yaml.safe_load(resources.files("xsearch.search_spaces").joinpath("tiny.yaml").read_text())
    copy = {**tiny, "name": "mine", "description": "my copy", "attention": dict(reversed(tiny["attention"].items()))}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(copy))
    assert main([*search, "--space", str(tmp_path / "mine.yaml"), "--study", "mine"]) == 0
    copy["model"]["ffn_ratio"] = [1, 2, 4]
    (tmp_path / "wider.yaml").write_text(yaml.safe_dump(copy))
    _one_line(capsys, [*search, "--space", str(tmp_path / "wider.yaml")], "was built for space 'tiny', not 'mine' "
              "as given (first difference: model.ffn_ratio [1, 2] there, [1, 2, 4] here)")  # fmt: skip


def test_supernet_training_warm_starts_from_a_trained_model(trained, tmp_path, capsys):
    """``--init DIR``: the model's weights are where the supernet's training starts (at a learning rate too small
    to move them, the supernet runs that subnet as the model does); a resumed run keeps to the same --init."""
    ref = ["--attention", "full", "--d-model", "32", "--layers", "2", "--heads", "2", "--d-ff", "64"]
    assert main(["train", *TASK, *ref, "--steps", "3", "--quiet", "--out", str(tmp_path / "ref")]) == 0
    model = xsearch.load_model(tmp_path / "ref")
    out = tmp_path / "warm"
    warm = [*_train(out, 2), "--lr", "1e-12", "--init", str(tmp_path / "ref")]
    assert main(warm) == 0
    sn = load_supernet(out)
    ids, mask, _ = next(get_task("listops", **TASK_OPTS).batches("valid", 16))
    with torch.no_grad():
        torch.testing.assert_close(sn.eval()(ids, mask, subnet=model.config), model(ids, mask), atol=1e-5, rtol=0)
    state = json.loads((out / "training.json").read_text())
    assert state["init"] == xsearch.describe_config(model.config)
    _one_line(capsys, [*_train(out, 2), "--lr", "1e-12"], "warm-started from full() d32 L2")  # (not from nothing)
    other = [a.replace("max_len=32", "max_len=48") for a in TASK]
    assert main(["train", *other, *ref, "--steps", "1", "--quiet", "--out", str(tmp_path / "long")]) == 0
    _one_line(capsys, [*_train(tmp_path / "x", 2), "--init", str(tmp_path / "long")],
              f"--init {tmp_path / 'long'}: subnet max_len=48, but the supernet was built for max_len=32")  # fmt: skip
