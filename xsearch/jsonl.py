"""JSON-lines reading with errors that name the file and line (no torch; the deployment CLI uses it)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any


def parse_jsonl(lines: Iterable[str], source: str) -> Iterator[tuple[int, Any]]:
    """``(line number, object)`` for every non-blank line.

    Raises:
        ValueError: ``"{source}:{line}: malformed JSON (...)"``.
    """
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}:{lineno}: malformed JSON ({e.msg})") from None
