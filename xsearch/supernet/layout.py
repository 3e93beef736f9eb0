"""Where each weight of a subnet lives in the supernet, and how large the supernet's tensors are.

A subnet is a plain ``XSearchModel``; each of its tensors is a leading slice of one supernet
tensor (``t[:a, :b, ...]``, as HAT slices elastic widths). The name of that supernet tensor is
the subnet's name with ``blocks.<i>`` read as ``layers.<i>``, except the attention's own
parameters (everything of ``blocks.<i>.attn`` but ``q_proj``/``k_proj``/``v_proj``/``out_proj``),
which live once per layer per variant as ``layers.<i>.<variant>.<name>``. So the embedding,
norms, FFNs and each layer's projections are shared by every variant, and Linformer's E/F,
Performer's features, Set's inducing points ... are each variant's own.

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


def inherited_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors a module takes from the supernet: parameters and persistent float buffers (shared ones once)."""
    yield from module.named_parameters()
    persistent = set(module.state_dict(keep_vars=True))
    for name, buf in module.named_buffers():
        if name in persistent and buf.is_floating_point():
            yield name, buf


def leading_slice(tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``tensor[:shape[0], :shape[1], ...]`` (a view)."""
    return tensor[tuple(slice(0, s) for s in shape)]


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
