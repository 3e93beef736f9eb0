"""Builders of the shipped tasks: ``listops``, ``pathfinder``, ``text`` (JSONL) and ``lm`` (a UTF-8 file).

Each takes the options ``check_task_options`` resolved (see ``xsearch.tasks.options``, where they
are declared) and trusts them. The generated tasks go through the on-disk cache
(``xsearch.tasks.cache``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch

from xsearch.errors import MissingPathError, XSearchError
from xsearch.jsonl import read_jsonl
from xsearch.tasks import cache, listops
from xsearch.tasks.base import Task
from xsearch.tasks.encoding import BYTES


def _three_way(items: list, valid_fraction: float, test_fraction: float, seed: int):
    items = list(items)
    random.Random(seed).shuffle(items)
    n_valid = max(1, round(len(items) * valid_fraction)) if valid_fraction > 0 else 0
    n_test = max(1, round(len(items) * test_fraction)) if test_fraction > 0 else 0
    if len(items) < n_valid + n_test + 1:
        raise XSearchError(f"only {len(items)} examples: too few to split into train/valid/test")
    return items[n_valid + n_test :], items[:n_valid], items[n_valid : n_valid + n_test]


def _consecutive(seqs: list[list[int]], labels: list[int], opts: dict[str, Any]) -> cache.Splits:
    a, b = opts["n_train"], opts["n_train"] + opts["n_valid"]
    return {"train": (seqs[:a], labels[:a]), "valid": (seqs[a:b], labels[a:b]), "test": (seqs[b:], labels[b:])}


# -- generated tasks ------------------------------------------------------------------
GENERATOR_OPTIONS = ("seed", "min_len", "max_len", "max_depth", "max_args", "size", "n_paths", "path_len",
                     "curvature")  # fmt: skip


def _generated(name: str, generator, samples, to_ids, opts: dict[str, Any]) -> dict[str, Any]:
    """The splits of a generated task, from the cache or drawn by ``samples(n, **options)`` (cached then)."""

    def build() -> cache.Splits:
        kwargs = {k: opts[k] for k in GENERATOR_OPTIONS if k in opts}
        drawn = samples(opts["n_train"] + opts["n_valid"] + opts["n_test"], **kwargs)
        return _consecutive([to_ids(x) for x, _ in drawn], [label for _, label in drawn], opts)

    return cache.cached(name, opts, generator.GENERATOR_VERSION, build)


def listops_task(opts: dict[str, Any]) -> Task:
    """Generated ListOps (10 classes); ``opts`` resolved by ``check_task_options``."""
    data = _generated("listops", listops, listops.listops_samples, listops.ENCODING.encode, opts)
    return Task("listops", "classify", listops.ENCODING, opts["max_len"], 10, [str(d) for d in range(10)], opts,
                data, defaults=dict(listops.MODEL_DEFAULTS))  # fmt: skip


def pathfinder_task(opts: dict[str, Any]) -> Task:
    """Generated Pathfinder images (2 classes), pixels as tokens: ``size**2`` tokens each."""
    from xsearch.tasks import pathfinder

    data = _generated("pathfinder", pathfinder, pathfinder.pathfinder_samples, pathfinder.image_to_ids, opts)
    return Task("pathfinder", "classify", pathfinder.ENCODING, opts["size"] ** 2, 2, ["disconnected", "connected"],
                opts, data)  # fmt: skip


# -- text classification from JSONL ----------------------------------------------------
def _shown(value: Any) -> str:
    """A JSON value as the file spells it (shortened)."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def read_examples(path: str | Path) -> list[tuple[str, str]]:
    """``(text, label)`` pairs of a JSONL file of ``{"text": ..., "label": ...}`` objects.

    A label is a string or an integer (turned into its string).

    Raises:
        MissingPathError: no such file.
        XSearchError: a line that is not UTF-8, not JSON, or not such an object (``path:line: ...``).
    """
    out = []
    for lineno, obj in read_jsonl(path):
        where = f"{path}:{lineno}"
        if not isinstance(obj, dict) or "text" not in obj or "label" not in obj:
            raise XSearchError(f'{where}: each line needs {{"text": ..., "label": ...}}, got {_shown(obj)}')
        text, label = obj["text"], obj["label"]
        if not isinstance(text, str) or not text:
            raise XSearchError(f"{where}: 'text' must be a non-empty string, got {_shown(text)}")
        if isinstance(label, bool) or not isinstance(label, (str, int)):
            raise XSearchError(f"{where}: 'label' must be a string or an integer, got {_shown(label)}")
        out.append((text, str(label)))
    if not out:
        raise XSearchError(f"{path}: no examples")
    return out


def text_task(opts: dict[str, Any]) -> Task:
    """Byte-level text classification from JSONL (``data=`` one file split by ``seed``, or
    ``train=``/``valid=``/``test=`` files). Labels are sorted and mapped to ids; texts longer
    than ``max_len`` bytes are truncated."""
    vf, tf, seed = opts["valid_fraction"], opts["test_fraction"], opts["seed"]
    if opts["data"] is not None:
        parts = _three_way(read_examples(opts["data"]), vf, tf, seed)
    else:
        tr = read_examples(opts["train"])
        v = read_examples(opts["valid"]) if opts["valid"] else None
        t = read_examples(opts["test"]) if opts["test"] else None
        if v is None or t is None:  # split what is missing off the training file
            tr, v2, t2 = _three_way(tr, vf if v is None else 0.0, tf if t is None else 0.0, seed)
            v, t = v if v is not None else v2, t if t is not None else t2
        parts = (tr, v, t)
    label_names = sorted({label for _, label in parts[0]})
    if len(label_names) < 2:
        raise XSearchError(f"task 'text': the training data has {len(label_names)} label(s); need at least 2")
    index = {name: i for i, name in enumerate(label_names)}
    out = {}
    for split, rows in zip(("train", "valid", "test"), parts):
        seqs, labels = [], []
        for text, label in rows:
            if label not in index:
                raise XSearchError(f"task 'text': label {label!r} in the {split} split does not occur in train")
            seqs.append(BYTES.encode(text)[: opts["max_len"]])
            labels.append(index[label])
        out[split] = (seqs, labels)
    return Task("text", "classify", BYTES, opts["max_len"], len(label_names), label_names, opts, out)


# -- byte-level language modelling -----------------------------------------------------
def default_corpus() -> str:
    """The documentation prose that ships with CPython (``pydoc_data.topics``): offline everywhere."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def read_text(path: str | Path) -> str:
    """A UTF-8 file's text.

    Raises:
        MissingPathError: no such file.
        XSearchError: bytes that are not UTF-8 (naming the line).
    """
    p = Path(path)
    if not p.is_file():
        raise MissingPathError(f"no such text file: {p}")
    data = p.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise XSearchError(f"{p}:{line}: not UTF-8 text (byte {data[e.start]:#04x}: {e.reason})") from None


def lm_task(opts: dict[str, Any]) -> Task:
    """Next-byte prediction on a UTF-8 text file (default: CPython's documentation text).

    The file is split into contiguous train / valid / test parts; the metric is bits per byte.
    """
    max_len = opts["max_len"]
    text = default_corpus() if opts["path"] is None else read_text(opts["path"])
    stream = torch.tensor(BYTES.encode(text), dtype=torch.long)
    n = len(stream)
    n_valid, n_test = int(n * opts["valid_fraction"]), int(n * opts["test_fraction"])
    need = max_len + 1
    if min(n - n_valid - n_test, n_valid, n_test) < need:
        raise XSearchError(
            f"text of {n} bytes is too short to split into train/valid/test parts of at least {need} bytes "
            f"(max_len={max_len}, valid_fraction={opts['valid_fraction']}, test_fraction={opts['test_fraction']})"
        )
    data = {
        "train": stream[: n - n_valid - n_test],
        "valid": stream[n - n_valid - n_test : n - n_test],
        "test": stream[n - n_test :],
    }
    return Task("lm", "lm", BYTES, max_len, options=opts, data=data)
