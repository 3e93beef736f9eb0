"""Turning raw input into token ids. Pure Python (no torch), so deployment can use it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xsearch.errors import XSearchError

PAD_ID = 0


@dataclass(frozen=True)
class Encoding:
    """How raw input becomes token ids; id 0 is always padding.

    Attributes:
        kind: ``"tokens"`` (whitespace-separated symbols from ``vocab``) or ``"bytes"``
            (UTF-8 bytes, id = byte + 1).
        vocab: the symbols of a ``"tokens"`` encoding, index = id (``vocab[0]`` is ``"<pad>"``).
    """

    kind: str
    vocab: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.kind not in ("tokens", "bytes"):
            raise XSearchError(f"Encoding.kind must be 'tokens' or 'bytes', got {self.kind!r}")
        if self.kind == "tokens" and (not self.vocab or self.vocab[0] != "<pad>"):
            raise XSearchError("a 'tokens' encoding needs a vocab starting with '<pad>'")

    @property
    def vocab_size(self) -> int:
        return 257 if self.kind == "bytes" else len(self.vocab)

    def encode(self, text: str | bytes) -> list[int]:
        """Token ids of one input.

        Raises:
            XSearchError: a symbol outside the vocabulary, or bytes that are not UTF-8.
        """
        if self.kind == "bytes":
            if isinstance(text, str):
                data = text.encode("utf-8")
            else:
                data = bytes(text)
                try:
                    data.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise XSearchError(f"input is not valid UTF-8: {e}") from None
            return [b + 1 for b in data]
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as e:
                raise XSearchError(f"input is not valid UTF-8: {e}") from None
        index = self._index()
        ids = []
        for tok in text.split():
            if tok not in index:
                raise XSearchError(f"unknown token {tok!r} (vocabulary: {' '.join(self.vocab[1:])})")
            ids.append(index[tok])
        return ids

    def decode(self, ids: list[int]) -> str:
        """Inverse of ``encode`` (padding dropped)."""
        if self.kind == "bytes":
            return bytes(i - 1 for i in ids if i > 0).decode("utf-8", errors="replace")
        return " ".join(self.vocab[i] for i in ids if i > 0)

    def _index(self) -> dict[str, int]:
        cached = self.__dict__.get("_index_cache")
        if cached is None:
            cached = {tok: i for i, tok in enumerate(self.vocab)}
            object.__setattr__(self, "_index_cache", cached)
        return cached

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab": list(self.vocab)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Encoding:
        if not isinstance(data, dict) or "kind" not in data:
            raise XSearchError(f"malformed encoding description: {data!r}")
        return cls(kind=data["kind"], vocab=tuple(data.get("vocab", ())))


BYTES = Encoding("bytes")
