"""JSON-lines reading with errors that name the file and line (no torch; the deployment CLI uses it)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from xsearch.errors import MissingPathError, XSearchError


def parse_jsonl(lines: Iterable[str], source: str) -> Iterator[tuple[int, Any]]:
    """``(line number, object)`` for every non-blank line.

    Raises:
        XSearchError: ``"{source}:{line}: malformed JSON (...)"``.
    """
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as e:
            raise XSearchError(f"{source}:{lineno}: malformed JSON ({e.msg})") from None


def decode_lines(stream: Iterable[bytes], source: str) -> Iterator[str]:
    """The lines of a byte stream decoded as UTF-8 (a byte-order mark on the first line is dropped).

    Raises:
        XSearchError: ``"{source}:{line}: not UTF-8 (...)"``.
    """
    for lineno, raw in enumerate(stream, 1):
        try:
            yield raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise XSearchError(
                f"{source}:{lineno}: not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}: {e.reason})"
            ) from None


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """``(line number, object)`` for every non-blank line of the UTF-8 JSON-lines file ``path``.

    Lines end at ``\\n`` (a ``\\r`` before it is whitespace to JSON). The file is checked when
    this is called and read as the result is iterated.

    Raises:
        MissingPathError: ``path`` does not exist or is not a file (at the call).
        XSearchError: a line that is not UTF-8 or not JSON, as ``"{path}:{line}: ..."`` (on iterating).
    """
    p = Path(path)
    if not p.is_file():
        raise MissingPathError(f"{p} is not a file" if p.exists() else f"no such file: {p}")
    return _read(p, str(path))


def _read(path: Path, source: str) -> Iterator[tuple[int, Any]]:
    with path.open("rb") as f:
        yield from parse_jsonl(decode_lines(f, source), source)
