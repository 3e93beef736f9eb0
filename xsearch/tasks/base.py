"""``Task``: splits of encoded data, batching, and what a saved model must know about its task."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from xsearch.errors import XSearchError
from xsearch.tasks.encoding import PAD_ID, Encoding

SPLITS = ("train", "valid", "test")


@dataclass
class Task:
    """A learning problem with train/valid/test splits and its vocabulary.

    ``kind="classify"``: each split is a list of token-id sequences with integer labels.
    ``kind="lm"``: each split is one long token stream; batches are windows of ``max_len``
    tokens predicting the next token.

    Attributes:
        name: task name (``get_task`` name).
        kind: ``"classify"`` or ``"lm"``.
        encoding: turns raw input into ids.
        max_len: longest sequence the task produces (a model needs at least this).
        n_classes: number of labels (classify).
        label_names: label of each class id (classify).
        options: the ``get_task`` options that rebuild this task.
        defaults: ``ModelConfig`` fields that suit the task, taken where neither the user nor the
            search space says otherwise (ListOps: ``pooling="first"``); see ``model_defaults``.
    """

    name: str
    kind: str
    encoding: Encoding
    max_len: int
    n_classes: int | None = None
    label_names: list[str] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    defaults: dict[str, Any] = field(default_factory=dict)
    _chance: dict[str, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def size(self, split: str) -> int:
        """Examples (classify) or tokens (lm) in ``split``."""
        d = self._split(split)
        return len(d[0]) if self.kind == "classify" else int(d.numel())

    def _split(self, split: str):
        if split not in SPLITS:
            raise XSearchError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
        return self.data[split]

    def chance(self, split: str) -> float:
        """The level a model must beat on ``split`` (cached per split).

        ``classify``: the accuracy of always answering the most frequent label of ``split``.
        ``lm``: the bits per byte on ``split`` of a unigram byte model fitted on the train split
        (add-one smoothed over the 256 byte values).
        """
        if split not in self._chance:
            self._chance[split] = self._classify_chance(split) if self.kind == "classify" else self._lm_chance(split)
        return self._chance[split]

    def loss_chance(self, split: str) -> float:
        """The cross-entropy (nats) a model must beat on ``split``: the loss that :func:`chance` is the metric of.

        ``classify``: the entropy of ``split``'s label frequencies, the loss of always answering them (the best
        a model that ignores its input does, as the majority class is for accuracy). ``lm``: the unigram byte
        model's, per byte.
        """
        if self.kind != "classify":
            return self.chance(split) * math.log(2)
        counts = Counter(self._split(split)[1])
        total = sum(counts.values())
        if not total:
            raise XSearchError(f"split {split!r} is empty: it has no chance level")
        return -sum(n / total * math.log(n / total) for n in counts.values())

    def _classify_chance(self, split: str) -> float:
        labels = self._split(split)[1]
        if not len(labels):
            raise XSearchError(f"split {split!r} is empty: it has no chance level")
        return Counter(labels).most_common(1)[0][1] / len(labels)

    def _lm_chance(self, split: str) -> float:
        def byte_counts(stream: torch.Tensor) -> torch.Tensor:
            return torch.bincount(stream, minlength=257)[1:257].double()  # id = byte + 1

        fit = byte_counts(self._split("train"))
        counts = byte_counts(self._split(split))
        if counts.sum() == 0:
            raise XSearchError(f"split {split!r} is empty: it has no chance level")
        log_p = torch.log2((fit + 1) / (fit.sum() + 256))
        return float(-(counts * log_p).sum() / counts.sum())

    def batches(
        self,
        split: str,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        max_batches: int | None = None,
        by_length: bool = False,
        skip: int = 0,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield ``(input_ids long[B, N], mask bool[B, N], labels)`` with padding id 0.

        Labels are ``long[B]`` (classify) or ``long[B, N]`` next tokens (lm). Classification
        batches are padded to their longest member. ``shuffle`` draws a fresh order from
        ``seed``; for lm, the train split yields random windows forever when shuffled.
        ``by_length`` (classify, for scoring) batches the same examples shortest first, so each
        batch pads least: the examples ``max_batches`` would take are chosen before sorting.
        ``skip`` passes over the first batches without building them (a resumed run's); ``max_batches``
        counts the batches after them.
        """
        if batch_size <= 0:
            raise XSearchError(f"batch_size must be > 0, got {batch_size}")
        if skip < 0:
            raise XSearchError(f"skip must be >= 0, got {skip}")
        if skip and by_length:
            raise XSearchError(f"skip={skip} with by_length: a resumed run's batches are not sorted by length")
        g = torch.Generator().manual_seed(seed)
        count = 0
        if self.kind == "classify":
            seqs, labels = self._split(split)
            order = torch.randperm(len(seqs), generator=g).tolist() if shuffle else range(len(seqs))
            order = list(order)
            if by_length:
                if max_batches is not None:
                    order = order[: max_batches * batch_size]
                order.sort(key=lambda i: len(seqs[i]))
            for start in range(skip * batch_size, len(order), batch_size):
                if max_batches is not None and count >= max_batches:
                    return
                idx = order[start : start + batch_size]
                yield (*pad_batch([seqs[i] for i in idx]), torch.tensor([labels[i] for i in idx]))
                count += 1
            return
        stream = self._split(split)
        n = self.max_len
        if len(stream) < n + 1:
            raise XSearchError(f"split {split!r} has {len(stream)} tokens, fewer than max_len + 1 = {n + 1}")
        if shuffle:
            for _ in range(skip):  # (the skipped windows' draws, so the next are the ones a whole run draws)
                torch.randint(0, len(stream) - n, (batch_size,), generator=g)
            while max_batches is None or count < max_batches:
                starts = torch.randint(0, len(stream) - n, (batch_size,), generator=g)
                windows = torch.stack([stream[s : s + n + 1] for s in starts.tolist()])
                yield windows[:, :-1], torch.ones(batch_size, n, dtype=torch.bool), windows[:, 1:]
                count += 1
            return
        n_windows = (len(stream) - 1) // n
        for start in range(skip * batch_size, n_windows, batch_size):
            if max_batches is not None and count >= max_batches:
                return
            ws = range(start, min(start + batch_size, n_windows))
            windows = torch.stack([stream[w * n : w * n + n + 1] for w in ws])
            yield windows[:, :-1], torch.ones(len(ws), n, dtype=torch.bool), windows[:, 1:]
            count += 1

    def encode(self, texts: list[str], *, truncate: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode raw inputs into a padded ``(input_ids, mask)`` batch.

        Raises:
            XSearchError: an input longer than ``max_len`` (unless ``truncate``), or empty.
        """
        seqs = []
        for i, t in enumerate(texts):
            ids = self.encoding.encode(t)
            if len(ids) > self.max_len:
                if not truncate:
                    raise XSearchError(f"input {i} has {len(ids)} tokens, more than max_len={self.max_len}")
                ids = ids[: self.max_len]
            if not ids:
                raise XSearchError(f"input {i} is empty")
            seqs.append(ids)
        return pad_batch(seqs)

    def model_fields(self) -> dict[str, Any]:
        """The ``ModelConfig`` fields this task fixes (vocabulary, length, head)."""
        fields = {"vocab_size": self.encoding.vocab_size, "max_len": self.max_len}
        if self.kind == "lm":
            return {**fields, "head": "lm", "causal": True}
        return {**fields, "head": "classify", "n_classes": self.n_classes}

    def model_defaults(self) -> dict[str, Any]:
        """The ``ModelConfig`` fields this task suggests (a flag, a ``--config`` or a space's value wins)."""
        return dict(self.defaults)

    def describe(self) -> dict[str, Any]:
        """JSON-able description saved with a model (rebuild options, encoding, labels)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "options": self.options,
            "encoding": self.encoding.to_dict(),
            "max_len": self.max_len,
            "n_classes": self.n_classes,
            "label_names": self.label_names,
        }


def pad_batch(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists with 0 into ``(input_ids long[B, N], mask bool[B, N])``."""
    lengths = torch.tensor([len(s) for s in seqs])
    n = int(lengths.max())
    ids = torch.full((len(seqs), n), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return ids, torch.arange(n)[None, :] < lengths[:, None]
