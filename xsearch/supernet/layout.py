"""Where each weight of a subnet lives in the supernet, and how large the supernet's tensors are.

A subnet is a plain ``XSearchModel``; each of its tensors is a leading slice of one supernet
tensor (``t[:a, :b, ...]``, as HAT slices elastic widths; ``region_key``). The name of that supernet tensor is
the subnet's name with ``blocks.<i>`` read as ``layers.<i>``, except the attention's own
parameters (everything of ``blocks.<i>.attn`` but ``q_proj``/``k_proj``/``v_proj``/``out_proj``),
which live once per layer per variant as ``layers.<i>.<variant>.<name>``. So the embedding,
norms, FFNs and each layer's projections are shared by every variant, and Linformer's E/F,
Performer's features, Set's inducing points ... are each variant's own.

With ``head_layout="per_head"`` the shared projections are laid out by head instead: the rows of
``q_proj``/``k_proj``/``v_proj`` and the columns of ``out_proj`` hold one block per head, as wide as the
widest head that head index takes in the space, and a subnet's head ``h`` is the leading ``head_dim`` rows
of block ``h`` (``head_rows``). A leading slice would split a d64 subnet's eight 8-wide heads out of what
is one 32-wide head of a d256 subnet with eight heads; by head, head ``h`` of every width is the leading
part of head ``h`` of every wider one, as HAT's and AutoFormer's elastic heads (of one fixed width) are.

Only parameters and persistent floating-point buffers (random features, rotations, centroids) come
from the supernet; integer buffers (BigBird's random block indices, counters) and non-persistent
buffers (position tables) are the subnet's own, built from a seed derived from its config so the
same subnet is always built the same.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


def supernet_name(name: str, attention_of_layer: list[str]) -> str:
    """The supernet tensor that holds subnet tensor ``name`` (its layers' variants ``attention_of_layer``)."""
    parts = name.split(".")
    if parts[0] != "blocks":
        return name
    layer, rest = parts[1], parts[2:]
    if rest[0] == "attn" and rest[1] not in PROJECTIONS:
        return ".".join(["layers", layer, attention_of_layer[int(layer)], *rest[1:]])
    return ".".join(["layers", layer, *rest])


def head_blocks(space) -> list[int]:
    """The width of each head index's block in a ``per_head`` layout: the widest head ``h`` of the space
    (``d_model // n_heads`` over its widths and head counts above ``h``)."""
    sizes = [(d // h, h) for d in space.model["d_model"].values() for h in space.model["n_heads"].values()
             if d % h == 0]  # fmt: skip
    return [max(dim for dim, h in sizes if h > i) for i in range(max(h for _, h in sizes))]


def head_rows(blocks: list[int], n_heads: int, head_dim: int) -> torch.Tensor | None:
    """The rows (of the ``per_head`` layout ``blocks``) holding ``n_heads`` heads of ``head_dim``: the leading
    ``head_dim`` of each of the first ``n_heads`` blocks; None where those heads are not in the layout."""
    if n_heads > len(blocks) or any(head_dim > b for b in blocks[:n_heads]):
        return None
    starts = itertools.accumulate([0, *blocks[: n_heads - 1]])
    return torch.cat([torch.arange(s, s + head_dim) for s in starts])


def projection_dim(name: str) -> int | None:
    """The dimension of a subnet tensor that runs over its heads' rows (``per_head`` layout), or None for a
    tensor that is not a shared projection's head-tied weight or bias."""
    parts = name.split(".")
    if len(parts) < 4 or parts[0] != "blocks" or parts[2] != "attn" or parts[3] not in PROJECTIONS:
        return None
    if parts[3] == "out_proj":
        return 1 if parts[-1] == "weight" else None
    return 0


def inherited_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors a module takes from the supernet: parameters and persistent float buffers (shared ones once)."""
    yield from module.named_parameters()
    persistent = set(module.state_dict(keep_vars=True))
    for name, buf in module.named_buffers():
        if name in persistent and buf.is_floating_point():
            yield name, buf


def region_key(shape: tuple[int, ...], rows: tuple[int, torch.Tensor] | None = None) -> tuple:
    """The index of a part of ``shape`` in a larger tensor: leading slices, but ``rows = (dim, indices)`` at
    ``dim`` (``t[key]`` reads it, a copy that gradients flow through; ``t[key] = x`` writes it)."""
    return tuple(rows[1] if rows is not None and i == rows[0] else slice(0, n) for i, n in enumerate(shape))


def config_seed(config_dict: dict[str, Any]) -> int:
    """A seed from a config's JSON, so a subnet's own random buffers are the same every time it is built."""
    text = json.dumps(config_dict, sort_keys=True)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def _combinations(dims: dict[str, Any]) -> list[dict[str, Any]]:
    names = list(dims)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(dims[n].values() for n in names))]


def _grow(shapes: dict[str, tuple[int, ...]], name: str, shape: tuple[int, ...]) -> None:
    old = shapes.get(name)
    if old is None:
        shapes[name] = shape
    elif len(old) != len(shape):
        raise ValueError(f"supernet: tensor {name} changes rank across the space ({old} vs {shape})")
    else:
        shapes[name] = tuple(max(a, b) for a, b in zip(old, shape, strict=True))


def variant_shapes(space, variant: str, *, causal: bool, max_len: int):
    """``variant``'s own tensors in a supernet layer: the elementwise largest shape of each over the space's
    widths, heads and parameter choices (built on the meta device: no memory), for each the build that reaches
    its largest size (to initialise it from), and which of them are buffers."""
    from xsearch.attention import build_attention

    shapes: dict[str, tuple[int, ...]] = {}
    biggest: dict[str, tuple[int, dict[str, Any]]] = {}
    buffers: set[str] = set()
    for d, h in itertools.product(space.model["d_model"].values(), space.model["n_heads"].values()):
        for params in _combinations(space.attention[variant]):
            with torch.device("meta"):
                attn = build_attention(variant, d, h, causal=causal, max_len=max_len, **params)
            for name, t in inherited_tensors(attn):
                if name.split(".")[0] in PROJECTIONS:
                    continue
                _grow(shapes, name, tuple(t.shape))
                if t.numel() > biggest.get(name, (-1, None))[0]:
                    biggest[name] = (t.numel(), {"d_model": d, "n_heads": h, "params": params})
            buffers |= {name for name, _ in attn.named_buffers()}
    return shapes, {name: build for name, (_, build) in biggest.items()}, buffers
