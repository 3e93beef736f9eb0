"""Every ``bash`` block of the README runs as written, in order, in a fresh folder.

A block preceded by ``<!-- readme-test: skip (reason) -->`` is not run here; the reason names what
runs it instead (``make demo``, another test). ``make`` lines are the Makefile's own targets.
The data files the README refers to (``reviews.jsonl``, ``topics.jsonl``, ``notes.txt``) are made
here, as a user would bring theirs.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
SKIP = re.compile(r"<!-- readme-test: skip \((.+?)\) -->\s*$")


def readme_blocks() -> list[tuple[str, str | None]]:
    """``(code, skip_reason)`` for each ```bash block, in order."""
    lines = README.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            prev = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
            m = SKIP.search(prev)
            blocks.append(("\n".join(lines[i + 1 : j]), m.group(1) if m else None))
            i = j
        i += 1
    return blocks


def _write_data(folder: Path) -> None:
    rng = random.Random(0)
    good, bad = ["great", "wonderful", "moving", "sharp", "funny"], ["dull", "awful", "flat", "boring", "clumsy"]
    with (folder / "reviews.jsonl").open("w") as f:
        for _ in range(300):
            label = rng.choice(["positive", "negative"])
            words = rng.sample(good if label == "positive" else bad, 2)
            f.write(json.dumps({"text": f"the film was {words[0]} and {words[1]}, really", "label": label}) + "\n")
    topics = {
        "sports": ["goal", "match", "coach"],
        "tech": ["chip", "code", "cloud"],
        "food": ["soup", "bread", "salt"],
    }
    with (folder / "topics.jsonl").open("w") as f:
        for _ in range(300):
            label = rng.choice(sorted(topics))
            f.write(json.dumps({"text": " ".join(rng.choices(topics[label], k=6)), "label": label}) + "\n")
    (folder / "notes.txt").write_text(
        "".join(f"Note {i}: the quick brown fox jumps over the lazy dog {i % 7} times.\n" for i in range(400))
    )


def test_every_readme_block_is_run_or_names_what_runs_it():
    blocks = readme_blocks()
    assert len(blocks) >= 6
    for code, reason in blocks:
        if reason is not None:
            assert re.search(r"make demo|tests/test_\w+\.py", reason), f"skip reason names no test: {reason!r}"
        else:
            assert code.strip()


def test_readme_commands_run_as_written(tmp_path):
    _write_data(tmp_path)
    bindir = str(Path(sys.executable).parent)  # where the venv's `xsearch` script lives
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ["PATH"], "XSEARCH_CACHE_DIR": str(tmp_path / "c")}
    for n, (code, reason) in enumerate(readme_blocks()):
        if reason is not None:
            continue
        script = "\n".join(ln for ln in code.splitlines() if not ln.startswith("make "))
        if not script.strip():
            continue
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=900)  # fmt: skip
        assert r.returncode == 0, (
            f"README block {n} failed:\n{script}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
        )
    # what the blocks promise exists
    assert (tmp_path / "lo.onnx").exists() and (tmp_path / "runs" / "lo-report" / "pareto.png").exists()
    assert (tmp_path / "runs" / "reviews-topics").is_dir() and (tmp_path / "my_space.yaml").exists()


def test_readme_search_space_example_loads(tmp_path):
    from xsearch.search_spaces import load_space

    text = README.read_text(encoding="utf-8")
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "my_space.yaml"
    path.write_text(example)
    space = load_space(path)
    assert space.name == "my_space" and sorted(space.attention) == ["full", "linformer", "local"]
