"""A cache of measured latencies, keyed by architecture, target, batch, length and device.

An architecture already measured on this device is not measured again (across trials,
studies and processes). Stored as JSON lines, appended (small appends are atomic on POSIX, so
several workers may share one file).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from xsearch.latency.stats import LatencyStats
from xsearch.paths import cache_dir


def default_cache_path() -> Path:
    return cache_dir() / "latency.jsonl"


def cache_key(
    config: dict[str, Any],
    target: str,
    batch: int,
    seq_len: int,
    device: dict[str, Any],
    mode: str = "forward",
    context: int | None = None,
) -> str:
    """Stable hash of what determines a latency (not the weights' values): the architecture, the target,
    the sizes, the device and what is timed (``mode``, and ``context`` for a decode step)."""
    # (a uniform config's "layers": None is left out, and so is the forward mode, so keys from before
    # per-layer models and latency modes still hit)
    arch = {k: v for k, v in config.items() if k != "dropout" and not (k == "layers" and v is None)}
    doc = {"arch": arch, "target": target, "batch": batch, "seq_len": seq_len, "device": device}
    if mode != "forward":
        doc.update(mode=mode, context=context)
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


class LatencyCache:
    """``get(key)`` / ``put(key, stats)`` over a JSON-lines file (None = in memory only)."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path is not None else None
        self._mem: dict[str, dict[str, Any]] = {}
        self._loaded_size = -1

    def _refresh(self) -> None:
        if self.path is None or not self.path.is_file():
            return
        size = self.path.stat().st_size
        if size == self._loaded_size:
            return
        with self.path.open(encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                    self._mem[row["key"]] = row["stats"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn or foreign line: ignore it, the entry is just measured again
        self._loaded_size = size

    def get(self, key: str) -> LatencyStats | None:
        self._refresh()
        row = self._mem.get(key)
        return LatencyStats(**row) if row else None

    def put(self, key: str, stats: LatencyStats) -> None:
        self._mem[key] = stats.to_dict()
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"key": key, "stats": stats.to_dict()}) + "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
