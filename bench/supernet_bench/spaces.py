"""The spaces the bench draws its subnets from, and the options every supernet over them is built with."""

from __future__ import annotations

import dataclasses
import random

from xsearch.search_spaces import RandomDraw, load_space_for_task
from xsearch.supernet.settings import LAYOUT_DEFAULTS


def load_bench_space(name: str, task, args):
    """The space ``name`` fitted to the task, its models built with ``--pos-encoding`` (a space that sets another
    exits naming it)."""
    space = load_space_for_task(name, task, defaults={"pos_encoding": args.pos_encoding})
    if (own := space.model["pos_encoding"].values()) != [args.pos_encoding]:
        raise SystemExit(f"--pos-encoding {args.pos_encoding}: the space {name!r} sets pos_encoding {own}")
    return space


def draw_subnets(space, task, args) -> list:
    """The ``--subnets`` subnets of ``space`` the ranking is measured on (drawn uniformly with ``--seed``)."""
    rng = random.Random(args.seed)
    return [space.suggest(RandomDraw(rng), task.model_fields()) for _ in range(args.subnets)]


def layout(args) -> dict[str, str]:
    """The supernets' layout options (``build_supernet``'s and ``SupernetTrainSettings``' keywords)."""
    return {key: getattr(args, key) for key in LAYOUT_DEFAULTS}


def model_dims(cfg) -> dict:
    """A config's values of the space's model dimensions (one attention for the whole model)."""
    return {"d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
            "ffn_ratio": cfg.d_ff / cfg.d_model, "weight_sharing": cfg.weight_sharing, "pooling": cfg.pooling,
            "pos_encoding": cfg.pos_encoding, "dropout": cfg.dropout}  # fmt: skip


def sub_space(space, dim: str, value):
    """``space`` with ``dim`` held at ``value`` (its reference too)."""
    from xsearch.search_spaces.dims import Dim

    return dataclasses.replace(space, name=f"{space.name}-{dim}{value}", model={**space.model, dim: Dim((value,))},
                               reference={**space.reference, dim: value})  # fmt: skip
