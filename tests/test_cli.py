import json
import subprocess
import sys

import pytest

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
    trained = json.loads((out / "metrics.json").read_text())["test_accuracy"]
    capsys.readouterr()
    assert main(["eval", str(out), "--task", "listops", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["accuracy"] == pytest.approx(trained)  # same task rebuilt from task.json, same model
    # a config file (as `xsearch pick` writes) plus an override
    assert main(["train", *task, "--config", str(out / "config.json"), "--layers", "2", "--steps", "2", "--quiet",
                 "--out", str(tmp_path / "m2")]) == 0  # fmt: skip
    cfg2 = json.loads((tmp_path / "m2" / "config.json").read_text())["model"]
    assert cfg2["attention"] == "performer" and cfg2["n_layers"] == 2 and cfg2["attention_params"]["nb_features"] == 16


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
