"""Builders of the shipped tasks: ``listops``, ``text`` (JSONL) and ``lm`` (a UTF-8 file)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from xsearch.jsonl import parse_jsonl
from xsearch.tasks import listops
from xsearch.tasks.base import Task
from xsearch.tasks.encoding import BYTES


def _check_options(name: str, options: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"task {name!r} has no option {unknown[0]!r} (valid: {', '.join(sorted(allowed))})")


def _three_way(items: list, valid_fraction: float, test_fraction: float, seed: int):
    for key, f in (("valid_fraction", valid_fraction), ("test_fraction", test_fraction)):
        if not 0.0 <= f < 1.0:
            raise ValueError(f"{key} must be in [0, 1), got {f}")
    items = list(items)
    random.Random(seed).shuffle(items)
    n_valid = max(1, round(len(items) * valid_fraction)) if valid_fraction > 0 else 0
    n_test = max(1, round(len(items) * test_fraction)) if test_fraction > 0 else 0
    if len(items) < n_valid + n_test + 1:
        raise ValueError(f"only {len(items)} examples: too few to split into train/valid/test")
    return items[n_valid + n_test :], items[:n_valid], items[n_valid : n_valid + n_test]


# -- listops ---------------------------------------------------------------------------
LISTOPS_DEFAULTS = {
    "n_train": 2000,
    "n_valid": 200,
    "n_test": 200,
    "min_len": 64,
    "max_len": 256,
    "max_depth": 10,
    "max_args": 10,
    "seed": 0,
}


def listops_task(preset: str | None = None, **options: Any) -> Task:
    """Generated ListOps (10 classes). ``preset="lra"`` gives Long Range Arena's setting."""
    _check_options("listops", options, set(LISTOPS_DEFAULTS))
    if preset not in (None, "lra"):
        raise ValueError(f"unknown listops preset {preset!r}; valid: 'lra'")
    opts = {**LISTOPS_DEFAULTS, **(listops.LRA_PRESET if preset == "lra" else {}), **options}
    total = opts["n_train"] + opts["n_valid"] + opts["n_test"]
    samples = listops.listops_samples(
        total,
        seed=opts["seed"],
        min_len=opts["min_len"],
        max_len=opts["max_len"],
        max_depth=opts["max_depth"],
        max_args=opts["max_args"],
    )
    enc = listops.ENCODING
    seqs = [enc.encode(text) for text, _ in samples]
    labels = [label for _, label in samples]
    a, b = opts["n_train"], opts["n_train"] + opts["n_valid"]
    data = {"train": (seqs[:a], labels[:a]), "valid": (seqs[a:b], labels[a:b]), "test": (seqs[b:], labels[b:])}
    return Task(
        name="listops",
        kind="classify",
        encoding=enc,
        max_len=opts["max_len"],
        n_classes=10,
        label_names=[str(d) for d in range(10)],
        options=opts,
        data=data,
    )


# -- pathfinder -------------------------------------------------------------------------
PATHFINDER_DEFAULTS = {"n_train": 2000, "n_valid": 200, "n_test": 200, "size": 32, "n_paths": 3, "seed": 0}


def pathfinder_task(**options: Any) -> Task:
    """Generated Pathfinder images (2 classes), pixels as tokens: ``size**2`` tokens each."""
    from xsearch.tasks import pathfinder

    _check_options("pathfinder", options, {*PATHFINDER_DEFAULTS, "path_len", "curvature"})
    opts = {**PATHFINDER_DEFAULTS, **options}
    total = opts["n_train"] + opts["n_valid"] + opts["n_test"]
    gen = {k: opts[k] for k in ("size", "n_paths", "path_len", "curvature") if k in opts}
    samples = pathfinder.pathfinder_samples(total, seed=opts["seed"], **gen)
    seqs = [pathfinder.image_to_ids(img) for img, _ in samples]
    labels = [label for _, label in samples]
    a, b = opts["n_train"], opts["n_train"] + opts["n_valid"]
    data = {"train": (seqs[:a], labels[:a]), "valid": (seqs[a:b], labels[a:b]), "test": (seqs[b:], labels[b:])}
    return Task("pathfinder", "classify", pathfinder.ENCODING, opts["size"] ** 2, 2, ["disconnected", "connected"],
                opts, data)  # fmt: skip


# -- text classification from JSONL ----------------------------------------------------
def read_jsonl(path: str | Path) -> list[tuple[str, str]]:
    """``(text, label)`` pairs of a JSONL file of ``{"text": ..., "label": ...}`` objects."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such data file: {p}")
    out = []
    with p.open(encoding="utf-8") as f:
        for lineno, obj in parse_jsonl(f, str(p)):
            if not isinstance(obj, dict) or "text" not in obj or "label" not in obj:
                raise ValueError(f'{p}:{lineno}: each line needs {{"text": ..., "label": ...}}')
            if not isinstance(obj["text"], str) or not obj["text"]:
                raise ValueError(f"{p}:{lineno}: 'text' must be a non-empty string")
            out.append((obj["text"], str(obj["label"])))
    if not out:
        raise ValueError(f"{p}: no examples")
    return out


def text_task(
    data: str | None = None,
    *,
    train: str | None = None,
    valid: str | None = None,
    test: str | None = None,
    max_len: int = 512,
    valid_fraction: float = 0.1,
    test_fraction: float = 0.1,
    seed: int = 0,
) -> Task:
    """Byte-level text classification from JSONL (``data=`` one file split by ``seed``, or
    ``train=``/``valid=``/``test=`` files). Labels are sorted and mapped to ids; texts longer
    than ``max_len`` bytes are truncated."""
    if data is None and train is None:
        raise ValueError("task 'text' needs data=PATH (one JSONL file) or train=PATH")
    if data is not None and train is not None:
        raise ValueError("task 'text': give data= or train=/valid=/test=, not both")
    if data is not None:
        parts = _three_way(read_jsonl(data), valid_fraction, test_fraction, seed)
    else:
        tr = read_jsonl(train)
        v = read_jsonl(valid) if valid else None
        t = read_jsonl(test) if test else None
        if v is None or t is None:  # split what is missing off the training file
            vf = valid_fraction if v is None else 0.0
            tf = test_fraction if t is None else 0.0
            tr, v2, t2 = _three_way(tr, vf, tf, seed)
            v, t = v if v is not None else v2, t if t is not None else t2
        parts = (tr, v, t)
    label_names = sorted({label for _, label in parts[0]})
    if len(label_names) < 2:
        raise ValueError(f"task 'text': the training data has {len(label_names)} label(s); need at least 2")
    index = {name: i for i, name in enumerate(label_names)}
    out = {}
    for split, rows in zip(("train", "valid", "test"), parts):
        seqs, labels = [], []
        for text, label in rows:
            if label not in index:
                raise ValueError(f"task 'text': label {label!r} in the {split} split does not occur in train")
            seqs.append(BYTES.encode(text)[:max_len])
            labels.append(index[label])
        out[split] = (seqs, labels)
    opts = {
        "data": None if data is None else str(data),
        "train": None if train is None else str(train),
        "valid": None if valid is None else str(valid),
        "test": None if test is None else str(test),
        "max_len": max_len,
        "valid_fraction": valid_fraction,
        "test_fraction": test_fraction,
        "seed": seed,
    }
    return Task("text", "classify", BYTES, max_len, len(label_names), label_names, opts, out)


# -- byte-level language modelling -----------------------------------------------------
def default_corpus() -> str:
    """The documentation prose that ships with CPython (``pydoc_data.topics``): offline everywhere."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def lm_task(
    path: str | None = None,
    *,
    max_len: int = 256,
    valid_fraction: float = 0.05,
    test_fraction: float = 0.05,
) -> Task:
    """Next-byte prediction on a UTF-8 text file (default: CPython's documentation text).

    The file is split into contiguous train / valid / test parts; the metric is bits per byte.
    """
    if path is None:
        text = default_corpus()
    else:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"no such text file: {p}")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{p} is not UTF-8 text: {e}") from None
    stream = torch.tensor(BYTES.encode(text), dtype=torch.long)
    n = len(stream)
    n_valid, n_test = int(n * valid_fraction), int(n * test_fraction)
    need = max_len + 1
    if min(n - n_valid - n_test, n_valid, n_test) < need:
        raise ValueError(f"text of {n} bytes is too short to split into windows of {need} bytes")
    data = {
        "train": stream[: n - n_valid - n_test],
        "valid": stream[n - n_valid - n_test : n - n_test],
        "test": stream[n - n_test :],
    }
    opts = {"path": path, "max_len": max_len, "valid_fraction": valid_fraction, "test_fraction": test_fraction}
    return Task("lm", "lm", BYTES, max_len, options=opts, data=data)
