"""The generation loop and its sampling rule, shared by torch (``xsearch.generate``) and onnxruntime
(``xsearch.export.Generator``). numpy only: a deployment host imports it without torch.

Both runtimes feed the same loop, so a seed draws the same tokens from either (up to logits that
differ by more than float noise), and greedy decoding (``temperature=0``) matches token for token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from xsearch.errors import XSearchError

#: ``prefill(ids int64 (B, N), mask bool (B, N)) -> (logits (B, N, V), state)``
Prefill = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, Any]]
#: ``step(next_ids int64 (B,), state) -> (logits (B, V), state)``
Step = Callable[[np.ndarray, Any], tuple[np.ndarray, Any]]


def prompts_of(prompt_ids: Any, vocab_size: int) -> tuple[list[list[int]], bool]:
    """One prompt (a list of token ids, a 1-D array) or a batch (a list of lists, a 2-D array) as
    lists of ints, and whether a single prompt was given.

    Raises:
        ValueError: an empty prompt, a non-integer token, or an id outside ``[0, vocab_size)``.
    """
    if hasattr(prompt_ids, "tolist"):  # numpy arrays and torch tensors alike
        prompt_ids = prompt_ids.tolist()
    if not isinstance(prompt_ids, (list, tuple)) or len(prompt_ids) == 0:
        raise XSearchError(f"prompt_ids must be a non-empty list of token ids (or of such lists), got {prompt_ids!r}")
    single = not isinstance(prompt_ids[0], (list, tuple))
    prompts = [list(prompt_ids)] if single else [list(p) for p in prompt_ids]
    for i, p in enumerate(prompts):
        if not p:
            raise XSearchError(f"prompt {i} is empty")
        for t in p:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise XSearchError(f"prompt {i}: token {t!r} is not an integer id")
            if not 0 <= t < vocab_size:
                raise XSearchError(f"prompt {i}: token id {t} is outside the vocabulary [0, {vocab_size})")
    return [[int(t) for t in p] for p in prompts], single


def check_options(
    *, max_new_tokens: Any, temperature: Any, top_k: Any, stop: Any, longest_prompt: int, max_len: int
) -> set[int]:
    """Validate the generation options; return the stop ids (an int, an iterable of ints, or None).

    Raises:
        ValueError: naming the bad option, or a prompt plus ``max_new_tokens`` over ``max_len``.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise XSearchError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise XSearchError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1):
        raise XSearchError(f"top_k must be an integer >= 1 or None, got {top_k!r}")
    if longest_prompt + max_new_tokens > max_len:
        raise XSearchError(
            f"a prompt of {longest_prompt} tokens plus max_new_tokens={max_new_tokens} exceeds the model's "
            f"max_len={max_len}"
        )
    if stop is None:
        return set()
    ids = [stop] if isinstance(stop, (int, np.integer)) else stop
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise XSearchError(f"stop must be a token id or a list of them, got {stop!r}")
    ids = list(ids)
    if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) for t in ids):
        raise XSearchError(f"stop must be a token id or a list of them, got {stop!r}")
    return {int(t) for t in ids}


class Sampler:
    """The next token from logits: greedy at temperature 0, else softmax(logits / T) over the
    ``top_k`` largest (all when None), drawn with numpy's PCG64 seeded by ``seed``."""

    def __init__(self, temperature: float = 1.0, top_k: int | None = None, seed: int = 0):
        self.temperature = float(temperature)
        self.top_k = top_k
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        """``(B, V)`` logits -> ``int64 (B,)`` token ids (one uniform draw per row when sampling)."""
        logits = np.asarray(logits, dtype=np.float64)
        if self.temperature == 0.0:
            return logits.argmax(axis=-1).astype(np.int64)
        z = logits / self.temperature
        if self.top_k is not None and self.top_k < z.shape[-1]:
            kth = np.sort(z, axis=-1)[:, -self.top_k][:, None]
            z = np.where(z >= kth, z, -np.inf)
        p = np.exp(z - z.max(axis=-1, keepdims=True))
        cdf = np.cumsum(p / p.sum(axis=-1, keepdims=True), axis=-1)
        u = self.rng.random(len(z))[:, None]
        return np.minimum((cdf < u).sum(axis=-1), z.shape[-1] - 1).astype(np.int64)


def generate_loop(
    prefill: Prefill, step: Step, prompts: list[list[int]], max_new_tokens: int, sampler: Sampler, stop: set[int]
) -> list[list[int]]:
    """New tokens for each prompt: prefill the right-padded batch, then one step per token.

    A row ends at ``max_new_tokens`` or at a token in ``stop`` (not returned); the batch ends when
    every row has.
    """
    n = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), n), dtype=np.int64)
    mask = np.zeros((len(prompts), n), dtype=np.bool_)
    for i, p in enumerate(prompts):
        ids[i, : len(p)], mask[i, : len(p)] = p, True
    logits, state = prefill(ids, mask)
    last = np.asarray(logits)[np.arange(len(prompts)), mask.sum(axis=1) - 1]  # (B, V)
    out: list[list[int]] = [[] for _ in prompts]
    done = np.zeros(len(prompts), dtype=np.bool_)
    for t in range(max_new_tokens):
        nxt = sampler(last)
        for i, tok in enumerate(nxt.tolist()):
            if not done[i]:
                if tok in stop:
                    done[i] = True
                else:
                    out[i].append(tok)
        if t == max_new_tokens - 1 or done.all():
            break
        logits, state = step(nxt, state)
        last = np.asarray(logits)
    return out
