"""Where xsearch keeps what it caches: ``$XSEARCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/xsearch``, else
``~/.cache/xsearch`` (measured latencies, generated tasks, tracebacks of internal errors)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("XSEARCH_CACHE_DIR")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "xsearch"
