import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xsearch.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "xsearch.cli", *args], capture_output=True, text=True)


def test_train_eval_round_trip(tmp_path, capsys):
    out = tmp_path / "m"
    task = ["--task", "listops", "--task-opt", "n_train=64", "--task-opt", "n_valid=16", "--task-opt", "n_test=16",
            "--task-opt", "min_len=16", "--max-len", "48"]  # fmt: skip
    rc = main(["train", *task, "--attention", "performer", "--set", "nb_features=16", "--d-model", "32",
               "--layers", "1", "--heads", "2", "--steps", "5", "--quiet", "--out", str(out)])  # fmt: skip
    assert rc == 0
    assert {"config.json", "model.safetensors", "task.json", "metrics.json"} <= {p.name for p in out.iterdir()}
    cfg = json.loads((out / "config.json").read_text())["model"]
    assert cfg["attention"] == "performer" and cfg["attention_params"]["nb_features"] == 16 and cfg["max_len"] == 48
    assert cfg["pooling"] == "first"  # ListOps' default where no flag or --config says otherwise
    trained = json.loads((out / "metrics.json").read_text())["test_accuracy"]
    capsys.readouterr()
    assert main(["eval", str(out), "--task", "listops", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["accuracy"] == pytest.approx(trained)  # same task rebuilt from task.json, same model
    # a config file (as `xsearch pick` writes) plus an override
    assert main(["train", *task, "--config", str(out / "config.json"), "--layers", "2", "--pooling", "mean",
                 "--steps", "2", "--quiet", "--out", str(tmp_path / "m2")]) == 0  # fmt: skip
    cfg2 = json.loads((tmp_path / "m2" / "config.json").read_text())["model"]
    assert cfg2["attention"] == "performer" and cfg2["n_layers"] == 2 and cfg2["attention_params"]["nb_features"] == 16
    assert cfg2["pooling"] == "mean"


@pytest.mark.parametrize(
    "args,needle",
    [
        (
            ["train", "--task", "listops", "--attention", "nope", "--steps", "1", "--out", "x"],
            "unknown attention 'nope'",
        ),
        (
            ["train", "--task", "listops", "--attention", "local", "--set", "block_size", "--steps", "1", "--out", "x"],
            "KEY=VALUE",
        ),
        (["train", "--task", "listops", "--d-model", "abc", "--out", "x"], "invalid int value: 'abc'"),
        (["eval", "/no/such/model"], "/no/such/model"),
        (["frobnicate"], "invalid choice"),
        (["train", "--task", "text", "--data", "/no/such.jsonl", "--steps", "1", "--out", "x"], "/no/such.jsonl"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle):
    r = run_cli(*args)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("INFO")]
    assert len(lines) == 1, r.stderr
    assert needle in lines[0]
    assert "Traceback" not in r.stderr


def test_list_markdown_matches_registry():
    import xsearch

    r = run_cli("list", "--markdown")
    assert r.returncode == 0
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| `")]
    assert [ln.split("`")[1] for ln in rows] == xsearch.list_attentions()


def test_readme_variant_table_is_generated_from_the_registry():
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    table = readme.split("<!-- variants:start -->\n")[1].split("<!-- variants:end -->")[0]
    assert table == run_cli("list", "--markdown").stdout, "regenerate with: xsearch list --markdown"


# -- bad input: checked before any work, one line, exit 2; a bug is exit 1 ------------------------------------
TINY = ["--task", "listops", "--task-opt", "n_train=64", "--task-opt", "n_valid=16", "--task-opt", "n_test=16",
        "--max-len", "32"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A trained tiny model folder and its ONNX file."""
    d = tmp_path_factory.mktemp("tiny")
    assert main(["train", *TINY, "--attention", "local", "--set", "block_size=8", "--d-model", "16", "--layers",
                 "1", "--heads", "2", "--steps", "2", "--quiet", "--out", str(d / "m")]) == 0  # fmt: skip
    assert main(["export", str(d / "m"), "--out", str(d / "m.onnx"), "--no-check"]) == 0
    return d


def _one_line_error(capsys, argv, needle, code=2):
    capsys.readouterr()
    assert main(argv) == code
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert needle in err[0], err[0]
    return err[0]


def test_budgets_and_limits_are_checked_before_any_work(tmp_path, capsys, monkeypatch, tiny):
    import xsearch.tasks

    def no_task(*a, **k):  # nothing below may get as far as building a task
        raise AssertionError("a task was built before the arguments were checked")

    monkeypatch.setattr(xsearch.tasks, "get_task", no_task)
    search = ["search", *TINY, "--space", "tiny", "--storage", f"sqlite:///{tmp_path}/s.db"]
    _one_line_error(capsys, [*search, "--train-steps", "0"], "--train-steps must be > 0, got 0")
    _one_line_error(capsys, [*search, "--train-steps", "-3"], "--train-steps must be > 0, got -3")
    _one_line_error(capsys, [*search, "--train-seconds", "0"], "--train-seconds must be > 0, got 0")
    _one_line_error(capsys, [*search, "--train-steps", "5", "--train-seconds", "5"],
                    "give --train-steps or --train-seconds, not both")  # fmt: skip
    _one_line_error(capsys, [*search, "--task-opt", "n_trian=3"], "has no option 'n_trian'")
    pg = "postgresql+psycopg://me:hunter2@127.0.0.1:1/db?password=hunter2"
    line = _one_line_error(capsys, ["search", *TINY, "--space", "tiny", "--storage", pg], "cannot open storage")
    assert "hunter2" not in line and "***" in line
    (tmp_path / "afile").write_text("x")
    train = ["train", *TINY, "--attention", "local", "--steps", "1"]
    _one_line_error(capsys, [*train, "--out", str(tmp_path / "afile")], "exists and is a file")
    _one_line_error(capsys, [*train, "--steps", "0", "--out", str(tmp_path / "m")], "--steps must be > 0")
    _one_line_error(capsys, [*train, "--set", "window=3", "--out", str(tmp_path / "m")], "has no parameter 'window'")
    compress = ["compress", str(tiny / "m"), "--out", str(tmp_path / "c")]
    _one_line_error(capsys, [*compress, "--prune-heads", "1.5"], "--prune-heads must be < 1, got 1.5")
    _one_line_error(capsys, [*compress, "--prune-ffn", "-0.5"], "--prune-ffn must be >= 0, got -0.5")
    _one_line_error(capsys, [*compress, "--finetune-steps", "-1"], "--finetune-steps must be >= 0, got -1")
    _one_line_error(capsys, [*compress, "--distill-from", str(tiny / "m")], "--distill-from needs --finetune-steps")
    _one_line_error(capsys, [*compress, "--distill-from", str(tmp_path / "nope"), "--finetune-steps", "1"],
                    str(tmp_path / "nope"))  # fmt: skip
    if not torch.cuda.is_available():  # a GPU that is not there: refused before any work, by name
        for argv in ([*train, "--device", "cuda", "--out", str(tmp_path / "m")],
                     ["pretrain", *TINY, "--attention", "local", "--steps", "1", "--device", "cuda:0", "--out",
                      str(tmp_path / "m")],
                     [*search, "--train-device", "cuda"],
                     [*compress, "--finetune-steps", "1", "--device", "cuda:1"],
                     ["adapt", str(tiny / "m"), *TINY[:2], "--device", "cuda", "--out", str(tmp_path / "m")],
                     ["supernet", "train", *TINY, "--space", "tiny", "--steps", "1", "--device", "cuda",
                      "--out", str(tmp_path / "m")]):  # fmt: skip
            device = argv[argv.index("--device" if "--device" in argv else "--train-device") + 1]
            _one_line_error(capsys, argv, f"device '{device}': torch")
    assert not (tmp_path / "c").exists() and not (tmp_path / "m").exists()  # nothing left behind
    _one_line_error(capsys, ["serve", str(tiny / "m.onnx"), "--port", "70000"], "--port must be <= 65535, got 70000")
    _one_line_error(capsys, ["serve", str(tiny / "m.onnx"), "--max-batch", "0"], "--max-batch must be >= 1, got 0")
    _one_line_error(capsys, ["serve", str(tiny / "m.onnx"), "--max-body", "-5"], "--max-body must be >= 1, got -5")
    for k in ("0", "-3"):
        _one_line_error(capsys, ["predict", str(tiny / "m.onnx"), "--input", "-", "--top-k", k], "--top-k")
    _one_line_error(capsys, ["bench", str(tiny / "m.onnx"), "--seq-len", "8", "--threads", "0"],
                    "--threads must be > 0, got 0")  # fmt: skip


def test_pipeline_with_a_bad_task_option_starts_nothing(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text("task:\n  options: {max_len: 64, n_trian: 3}\n")
    _one_line_error(capsys, ["run", "--config", str(path), "--runs-dir", str(tmp_path / "runs")],
                    "task.options: task 'listops' has no option 'n_trian'")  # fmt: skip
    assert not (tmp_path / "runs").exists()


def test_bad_files_and_mismatched_models_are_one_line(tmp_path, capsys, tiny):
    blob = (tiny / "m.onnx").read_bytes()
    (tmp_path / "cut.onnx").write_bytes(blob[: len(blob) // 2])
    _one_line_error(capsys, ["bench", str(tmp_path / "cut.onnx"), "--seq-len", "8"], "cut.onnx")
    _one_line_error(capsys, ["predict", str(tmp_path / "cut.onnx"), "--input", "-"], "cut.onnx")
    other = tmp_path / "other"
    assert main(["train", "--task", "listops", "--task-opt", "n_train=64", "--task-opt", "n_valid=16", "--task-opt",
                 "n_test=16", "--max-len", "48", "--attention", "local", "--set", "block_size=8", "--d-model", "16",
                 "--layers", "1", "--heads", "2", "--steps", "1", "--quiet", "--out", str(other)]) == 0  # fmt: skip
    _one_line_error(capsys, ["bench", str(tiny / "m.onnx"), "--seq-len", "8", "--vs", str(other)],
                    "m.onnx, 48 in --vs")  # fmt: skip
    _one_line_error(capsys, ["train", *TINY, "--attention", "local", "--set", "block_size=100000", "--steps", "1",
                             "--out", str(tmp_path / "big")],
                    "block_size=100000 exceeds the longest sequence (max_len=32); use at most 128")  # fmt: skip
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'"[MAX 1 2 ]"\n"\xff\xfe"\n')
    _one_line_error(capsys, ["predict", str(tiny / "m.onnx"), "--input", str(bad)], "bad.jsonl:2")
    bad.write_text('"[MAX 1 2 ]"\n[true, 2]\n')
    _one_line_error(capsys, ["predict", str(tiny / "m.onnx"), "--input", str(bad)], "input 1 must be a string or")


def test_a_bug_is_exit_1_with_the_traceback_kept(tmp_path, capsys, monkeypatch):
    import xsearch.cli.catalog

    def broken(args):
        return 1 / 0

    monkeypatch.setattr(xsearch.cli.catalog, "cmd_list", broken)
    line = _one_line_error(capsys, ["list"], "internal error (a bug in xsearch, not in your input): ZeroDivisionError",
                           code=1)  # fmt: skip
    path = line.rsplit("traceback: ", 1)[1].rstrip(")")
    assert "ZeroDivisionError" in Path(path).read_text(encoding="utf-8")
