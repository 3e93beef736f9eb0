"""``generate``: token-by-token generation from a causal xsearch LM in torch (prefill, then steps)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xsearch.decoding import Sampler, check_options, generate_loop, prompts_of
from xsearch.errors import XSearchError


def generate(
    model: torch.nn.Module,
    prompt_ids: Any,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    stop: int | list[int] | None = None,
) -> list[int] | list[list[int]]:
    """Continue a prompt (or a batch of them) with ``max_new_tokens`` tokens at most.

    Args:
        model: a causal ``XSearchModel`` with an ``lm`` head; it runs in eval mode.
        prompt_ids: token ids: one prompt (a list or 1-D tensor) or a batch (a list of lists,
            possibly of different lengths, or a 2-D tensor).
        max_new_tokens: tokens to generate per prompt; prompt plus these must fit in ``max_len``.
        temperature: 0 = greedy (argmax); otherwise softmax sampling at this temperature.
        top_k: sample among the ``top_k`` most likely tokens only (None = all).
        seed: seeds the draws (numpy PCG64, as ``xsearch.export.Generator`` does).
        stop: a token id (or ids) that ends a row; it is not returned.

    Returns:
        The new token ids: a list for one prompt, a list of lists for a batch.

    Raises:
        ValueError: a model that cannot decode, a bad prompt or option.
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "prefill"):
        raise XSearchError(f"generate needs an xsearch model, got {type(model).__name__}")
    if not (config.causal and config.head == "lm"):
        raise XSearchError(f"generate needs a causal language model (causal=True, head='lm'), got "
                           f"causal={config.causal}, head={config.head!r}")  # fmt: skip
    prompts, single = prompts_of(prompt_ids, config.vocab_size)
    stop_ids = check_options(
        max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, stop=stop,
        longest_prompt=max(len(p) for p in prompts), max_len=config.max_len,
    )  # fmt: skip
    prefill, step = numpy_decoder(model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = generate_loop(prefill, step, prompts, max_new_tokens, Sampler(temperature, top_k, seed), stop_ids)
    finally:
        model.train(was_training)
    return out[0] if single else out


def numpy_decoder(model: torch.nn.Module):
    """``model.prefill`` and ``model.step`` as the numpy functions ``generate_loop`` drives (the
    state stays torch's; logits come back as float32 arrays)."""
    device = next(model.parameters()).device

    def prefill(ids: np.ndarray, mask: np.ndarray):
        logits, state = model.prefill(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device))
        return logits.float().cpu().numpy(), state

    def step(nxt: np.ndarray, state):
        logits, state = model.step(torch.from_numpy(nxt).to(device), state)
        return logits.float().cpu().numpy(), state

    return prefill, step
