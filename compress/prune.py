"""Structured pruning: whole attention heads and FFN channels, for every attention variant.

Heads are removed through the shared projection names (``q_proj``/``k_proj``/``v_proj`` rows,
``out_proj`` columns) and each variant's ``prune_head_params`` hook, which slices what else is
tied to the head count (routing centroids, Reformer rotations, Transformer-XL biases, Set
Transformer's inducing projections, ...). A uniform model keeps the same number of heads in
every layer (so one ``n_heads`` describes it) and records its FFN widths, which may differ per
layer, in ``ModelConfig.ffn_dims``; a per-layer model (``ModelConfig.layers``) loses the same
fraction of each layer's heads and records each layer's heads and width in its entry. The
pruned model saves, loads and exports like any other.

Why not torch-pruning's DepGraph: it infers coupling by tracing ops, and the variants' gathers,
sorts, block reshapes and tied weights hide the head structure from it (FIELD_NOTES); an
explicit per-variant head map is exact for all 19.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from xsearch.compress.settings import IMPORTANCE
from xsearch.errors import XSearchError


def _unique(modules: Iterable[nn.Module]) -> list[nn.Module]:
    seen, out = set(), []
    for m in modules:
        if id(m) not in seen:
            seen.add(id(m))
            out.append(m)
    return out


def _grad_scores(model, task, batches: int, batch_size: int) -> None:
    """Accumulate gradients of the task loss (first-order Taylor importance)."""
    from xsearch.training import task_loss

    model.zero_grad(set_to_none=True)
    was = model.training
    model.eval()  # no dropout: the scores measure the deployed function
    n = 0
    for ids, mask, labels in task.batches("train", batch_size, shuffle=True, seed=0, max_batches=batches):
        task_loss(model, ids, mask, labels).backward()
        n += 1
    model.train(was)
    if n == 0:
        raise XSearchError("taylor importance needs task batches, and the train split is empty")


def _score(p: torch.Tensor, importance: str) -> torch.Tensor:
    if importance == "magnitude":
        return p.detach() ** 2
    if p.grad is None:
        return torch.zeros_like(p)
    return (p.detach() * p.grad.detach()).abs()


def head_importance(attn, importance: str = "magnitude") -> torch.Tensor:
    """One score per head: summed over its q/k/v rows and out_proj columns."""
    h, dh = attn.n_heads, attn.head_dim
    total = torch.zeros(h)
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        total += _score(proj.weight, importance).reshape(h, dh, -1).sum(dim=(1, 2))
    total += _score(attn.out_proj.weight, importance).reshape(-1, h, dh).sum(dim=(0, 2))
    return total


def channel_importance(ffn, importance: str = "magnitude") -> torch.Tensor:
    """One score per FFN hidden channel: its fc1 row and fc2 column."""
    return _score(ffn.fc1.weight, importance).sum(dim=1) + _score(ffn.fc2.weight, importance).sum(dim=0)


def prune(
    model,
    *,
    heads: float = 0.25,
    ffn: float = 0.5,
    importance: str = "magnitude",
    task=None,
    batches: int = 8,
    batch_size: int = 32,
):
    """Remove the least important fraction ``heads`` of each layer's attention heads and ``ffn`` of FFN channels.

    Args:
        model: an ``XSearchModel`` (changed in place and returned).
        heads: fraction of heads to remove in every layer (at least one head stays).
        ffn: fraction of each FFN's hidden channels to remove (at least one stays).
        importance: ``"magnitude"`` (squared weights) or ``"taylor"`` (|weight x gradient| of
            the task loss over ``batches`` train batches of ``task``).
        task: the ``Task`` for ``"taylor"``.

    Returns:
        The model, with ``model.config.n_heads`` and ``model.config.ffn_dims`` (or, for a
        per-layer model, each ``model.config.layers`` entry's ``n_heads`` and ``d_ff``) updated.
    """
    if importance not in IMPORTANCE:
        raise XSearchError(f"unknown importance {importance!r}; valid: {', '.join(IMPORTANCE)}")
    for name, frac in (("heads", heads), ("ffn", ffn)):
        if not 0.0 <= frac < 1.0:
            raise XSearchError(f"prune: {name} must be in [0, 1), got {frac}")
    if importance == "taylor":
        if task is None:
            raise XSearchError("prune(importance='taylor') needs task=")
        _grad_scores(model, task, batches, batch_size)
    cfg = model.config
    ffns = _unique(block.ffn for block in model.blocks)
    with torch.no_grad():
        for attn in _unique(block.attn for block in model.blocks):
            n_keep = max(1, attn.n_heads - math.floor(attn.n_heads * heads + 1e-9))
            if n_keep < attn.n_heads:
                attn.prune_heads(torch.topk(head_importance(attn, importance), n_keep).indices)
        for f in ffns:
            width = f.fc1.out_features
            c_keep = max(1, width - math.floor(width * ffn + 1e-9))
            if c_keep < width:
                f.prune_channels(torch.topk(channel_importance(f, importance), c_keep).indices)
    model.zero_grad(set_to_none=True)
    if cfg.layers is not None:
        for entry, layer in zip(cfg.layers, model.layers(), strict=True):
            entry["n_heads"], entry["d_ff"] = layer.attn.n_heads, layer.ffn.fc1.out_features
    else:
        cfg.n_heads = model.layers()[0].attn.n_heads
        cfg.ffn_dims = [layer.ffn.fc1.out_features for layer in model.layers()]
    return model
