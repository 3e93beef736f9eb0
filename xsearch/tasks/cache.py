"""The generated tasks' encoded splits, cached on disk so that a task is generated once per machine.

``get_task("listops", ...)`` and ``get_task("pathfinder", ...)`` keep their splits in
``$XSEARCH_CACHE_DIR/tasks/`` (default ``$XDG_CACHE_HOME/xsearch/tasks``, i.e.
``~/.cache/xsearch/tasks``; ``XSEARCH_CACHE_DIR`` also places the latency cache). A file is named
by the hash of (task name, resolved options, generator version, file format), so changed options
or a new generator never read old data.

Each file is an ``.npz`` written by ``np.savez`` and read with ``allow_pickle=False`` (no
pickle): per split a flat token array, the offsets of its sequences and their labels, each in the
smallest unsigned integer type that holds it, plus ``meta``, a JSON string of the key's parts,
checked on reading. A file is written under a temporary name and renamed into place, so processes
that build the same task at once each leave a whole file. A damaged or foreign file is ignored
(and rewritten); a cache folder that cannot be written only costs a warning.

Set ``XSEARCH_NO_TASK_CACHE=1`` to bypass the cache (nothing read, nothing written).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from xsearch import paths

FORMAT = 1  # the layout of a cache file
SPLITS = ("train", "valid", "test")
log = logging.getLogger("xsearch.tasks")

Splits = dict[str, tuple[list[list[int]], list[int]]]  # split -> (token id lists, labels)


def cache_dir() -> Path:
    """The folder of the task cache."""
    return paths.cache_dir() / "tasks"


def enabled() -> bool:
    """False when ``XSEARCH_NO_TASK_CACHE`` is set to ``1`` (or ``true`` / ``yes``)."""
    return os.environ.get("XSEARCH_NO_TASK_CACHE", "").strip().lower() not in ("1", "true", "yes")


def _meta(name: str, options: dict[str, Any], version: int) -> dict[str, Any]:
    # through JSON, so that what is compared on reading is what was written
    return json.loads(json.dumps({"format": FORMAT, "task": name, "version": version, "options": options}))


def task_key(name: str, options: dict[str, Any], version: int) -> str:
    """Stable hash of what determines a generated task's data."""
    return hashlib.sha256(json.dumps(_meta(name, options, version), sort_keys=True).encode()).hexdigest()[:32]


def cache_path(name: str, options: dict[str, Any], version: int) -> Path:
    return cache_dir() / f"{name}-{task_key(name, options, version)}.npz"


def _smallest(values: list[int] | np.ndarray) -> np.ndarray:
    a = np.asarray(values, dtype=np.int64)
    if a.size and a.min() < 0:
        return a
    return a.astype(np.min_scalar_type(int(a.max()) if a.size else 0))


def _arrays(splits: Splits, meta: dict[str, Any]) -> dict[str, np.ndarray]:
    out = {"meta": np.array(json.dumps(meta, sort_keys=True))}
    for split in SPLITS:
        seqs, labels = splits[split]
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter((t for s in seqs for t in s), dtype=np.int64, count=int(offsets[-1]))
        out[f"{split}_tokens"] = _smallest(flat)
        out[f"{split}_offsets"] = _smallest(offsets)
        out[f"{split}_labels"] = _smallest(labels)
    return out


def load(path: Path, meta: dict[str, Any]) -> Splits | None:
    """The splits in ``path`` if it is a whole cache file of ``meta``; None otherwise (never raises)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            if json.loads(str(f["meta"][()])) != meta:
                return None
            out: Splits = {}
            for split in SPLITS:
                tokens, offsets, labels = (f[f"{split}_{part}"] for part in ("tokens", "offsets", "labels"))
                if not all(a.ndim == 1 and a.dtype.kind in "iu" for a in (tokens, offsets, labels)):
                    return None
                offsets = offsets.astype(np.int64)
                whole = len(offsets) == len(labels) + 1 and offsets[0] == 0 and offsets[-1] == len(tokens)
                if not whole or (np.diff(offsets) < 0).any():
                    return None
                flat, bounds = tokens.tolist(), offsets.tolist()
                out[split] = ([flat[a:b] for a, b in zip(bounds, bounds[1:])], labels.tolist())
            return out
    except FileNotFoundError:
        return None
    except Exception as e:  # damaged, truncated or foreign: rebuilt and rewritten
        log.warning("ignoring the damaged task cache file %s (%s: %s)", path, type(e).__name__, e)
        return None


def store(path: Path, meta: dict[str, Any], splits: Splits) -> None:
    """Write ``splits`` to ``path`` (a temporary file renamed into place); a failure only warns."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **_arrays(splits, meta))
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        log.warning("could not write the task cache file %s: %s", path, e)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def cached(name: str, options: dict[str, Any], version: int, build: Callable[[], Splits]) -> Splits:
    """The splits of task ``name`` with resolved ``options``: read from the cache, or ``build()`` and stored."""
    if not enabled():
        return build()
    meta = _meta(name, options, version)
    path = cache_path(name, options, version)
    splits = load(path, meta)
    if splits is not None:
        log.debug("task %s read from %s", name, path)
        return splits
    splits = build()
    store(path, meta, splits)
    return splits
