"""``Predictor``: run an exported xsearch model with onnxruntime and numpy only (no torch)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xsearch.errors import MissingPathError, XSearchError
from xsearch.export.metadata import INPUTS, OUTPUT, parse_metadata
from xsearch.tasks.encoding import Encoding


@dataclass(frozen=True)
class Prediction:
    """One input's prediction.

    Attributes:
        label: the class name (classify) or the most likely next token (lm).
        score: its probability.
        top: the ``k`` most likely (label, probability) pairs, best first.
    """

    label: str
    score: float
    top: list[tuple[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "score": self.score, "top": [list(t) for t in self.top]}


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The xsearch metadata (version, config, task) of an exported file, without running it."""
    import onnx

    p = Path(path)
    if not p.is_file():
        raise MissingPathError(f"no such ONNX file: {p}")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError and others for a damaged or foreign file
        raise XSearchError(f"cannot read {p} as an ONNX model ({type(e).__name__}: {e})") from None
    return parse_metadata({e.key: e.value for e in model.metadata_props}, str(p))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class Predictor:
    """An exported model ready to serve.

    Args:
        path: an ``.onnx`` file written by ``to_onnx`` (or ``quantize_onnx``).
        threads: onnxruntime intra-op threads (default: onnxruntime's choice).
        providers: onnxruntime execution providers (default: CPU).
    """

    def __init__(self, path: str | os.PathLike, threads: int | None = None, providers: list[str] | None = None):
        import onnxruntime as ort

        p = Path(path)
        if not p.is_file():
            raise MissingPathError(f"no such ONNX file: {p}")
        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # errors only: a deployment host wants no onnxruntime chatter on stderr
        if threads is not None:
            if threads <= 0:
                raise XSearchError(f"threads must be > 0, got {threads}")
            opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(str(p), opts, providers=providers or ["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types for a bad file
            raise XSearchError(f"cannot load {p} with onnxruntime: {e}") from None
        meta = parse_metadata(self.session.get_modelmeta().custom_metadata_map, str(p))
        self.path = str(p)
        self.version = meta["version"]
        self.config: dict[str, Any] = meta["config"]
        self.task: dict[str, Any] | None = meta["task"]
        self.max_len = int(self.config["max_len"])
        self.vocab_size = int(self.config["vocab_size"])
        self.kind = "lm" if self.config["head"] == "lm" else "classify"
        enc = (self.task or {}).get("encoding")
        self.encoding = Encoding.from_dict(enc) if enc else None
        names = (self.task or {}).get("label_names")
        self.label_names = list(names) if names else None

    def logits(self, input_ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Raw logits: ``[B, n_classes]`` (classify) or ``[B, N, vocab]`` (lm), float32.

        Raises:
            ValueError: wrong dtype or rank, mismatched shapes, an empty batch, a length over
                ``max_len``, or token ids outside the vocabulary.
        """
        ids = np.asarray(input_ids)
        if ids.ndim != 2:
            raise XSearchError(f"input_ids must be 2-D [batch, seq], got shape {ids.shape}")
        if ids.dtype != np.int64:
            raise XSearchError(f"input_ids must be int64, got {ids.dtype}")
        if ids.shape[0] == 0 or ids.shape[1] == 0:
            raise XSearchError(f"empty batch: input_ids has shape {ids.shape}")
        if ids.shape[1] > self.max_len:
            raise XSearchError(f"sequence length {ids.shape[1]} exceeds max_len={self.max_len}")
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise XSearchError(f"token ids must be in [0, {self.vocab_size}), got min {ids.min()}, max {ids.max()}")
        m = (ids != 0) if mask is None else np.asarray(mask)
        if m.dtype != np.bool_:
            raise XSearchError(f"mask must be bool, got {m.dtype}")
        if m.shape != ids.shape:
            raise XSearchError(f"mask shape {m.shape} != input_ids shape {ids.shape}")
        if not m.any(axis=1).all():
            raise XSearchError("every row needs at least one real (unmasked) token")
        return self.session.run([OUTPUT], {INPUTS[0]: ids, INPUTS[1]: m})[0]

    def encode(self, inputs: list[Any], *, truncate: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Raw strings (or token-id lists) into a padded ``(input_ids, mask)`` batch.

        Raises:
            ValueError: an empty list or input, an input neither a string nor a list of integer
                token ids (bools are not ids), an id outside ``[0, vocab_size)``, a symbol outside
                the encoding, or an input over ``max_len`` without ``truncate``.
        """
        if not isinstance(inputs, (list, tuple)) or len(inputs) == 0:
            raise XSearchError("predict needs a non-empty list of inputs")
        seqs = []
        for i, item in enumerate(inputs):
            if isinstance(item, (str, bytes)):
                if self.encoding is None:
                    raise XSearchError(f"{self.path} has no encoding in its metadata; pass token-id lists")
                ids = self.encoding.encode(item)
            elif isinstance(item, (list, tuple)):
                ids = self._token_ids(i, item)
            else:
                raise XSearchError(f"input {i} must be a string or a list of token ids, got {type(item).__name__}")
            if not ids:
                raise XSearchError(f"input {i} is empty")
            if len(ids) > self.max_len:
                if not truncate:
                    raise XSearchError(
                        f"input {i} has {len(ids)} tokens, more than max_len={self.max_len} (pass truncate=True)"
                    )
                ids = ids[-self.max_len :] if self.kind == "lm" else ids[: self.max_len]
            seqs.append(ids)
        n = max(len(s) for s in seqs)
        arr = np.zeros((len(seqs), n), dtype=np.int64)
        mask = np.zeros((len(seqs), n), dtype=np.bool_)
        for i, s in enumerate(seqs):
            arr[i, : len(s)] = s
            mask[i, : len(s)] = True
        return arr, mask

    def _token_ids(self, i: int, item: list[Any] | tuple[Any, ...]) -> list[int]:
        """Input ``i`` given as token ids: integers (never bools) in ``[0, vocab_size)``."""
        ids = []
        for j, t in enumerate(item):
            if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
                raise XSearchError(
                    f"input {i} must be a string or a list of token ids, but its token {j} is a {type(t).__name__}"
                )
            t = int(t)
            if not 0 <= t < self.vocab_size:
                shown = str(t) if abs(t) < 10**12 else f"of about {int(t.bit_length() * 0.30103) + 1} digits"
                raise XSearchError(f"input {i}: token id {shown} (token {j}) is outside [0, {self.vocab_size})")
            ids.append(t)
        return ids

    def predict(
        self, inputs: list[Any], *, truncate: bool = False, top_k: int = 3, batch_size: int = 32
    ) -> list[Prediction]:
        """Predictions for raw inputs (strings) or token-id lists.

        Classify models give the class and its probability; lm models give the most likely
        next token after each input (with the ``top_k`` distribution head).
        """
        if not isinstance(inputs, (list, tuple)) or len(inputs) == 0:
            raise XSearchError("predict needs a non-empty list of inputs")
        for name, value in (("top_k", top_k), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise XSearchError(f"{name} must be an integer >= 1, got {value!r}")
        out: list[Prediction] = []
        for start in range(0, len(inputs), batch_size):
            ids, mask = self.encode(list(inputs[start : start + batch_size]), truncate=truncate)
            logits = self.logits(ids, mask)
            if self.kind == "lm":
                last = mask.sum(axis=1) - 1
                logits = logits[np.arange(len(ids)), last]  # next-token logits after the last real token
            probs = _softmax(logits.astype(np.float64))
            for row in probs:
                order = np.argsort(-row)[:top_k]
                top = [(self._name(int(j)), float(row[j])) for j in order]
                out.append(Prediction(top[0][0], top[0][1], top))
        return out

    def _name(self, j: int) -> str:
        if self.kind == "lm":
            return self.encoding.decode([j]) if self.encoding else str(j)
        return self.label_names[j] if self.label_names else str(j)
