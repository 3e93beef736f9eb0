"""Saving and loading a supernet: ``supernet.safetensors`` + ``config.json`` (its space's YAML and task), no pickle."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from xsearch.errors import MissingPathError, XSearchError
from xsearch.serialization import CONFIG_FILE, atomic_write_text, read_json
from xsearch.settings import show_differences
from xsearch.supernet.settings import LAYOUT_DEFAULTS
from xsearch.supernet.supertransformer import SuperTransformer

FORMAT = "xsearch-supernet/1"
WEIGHTS_FILE = "supernet.safetensors"


def save_supernet(sn: SuperTransformer, directory: str | os.PathLike, *, extra: dict[str, Any] | None = None) -> Path:
    """Write ``sn`` to ``directory``: its tensors, then ``config.json`` (space YAML, task fields, seed, layout,
    ``extra``), each through a temporary name and a rename."""
    from xsearch import __version__

    if not isinstance(sn, SuperTransformer):
        raise XSearchError(f"save_supernet needs a SuperTransformer, got {type(sn).__name__}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: sn.tensor(name).detach().contiguous() for name in sn.shapes}
    tmp = out / f".{WEIGHTS_FILE}.tmp-{os.getpid()}"
    safetensors.torch.save_file(tensors, str(tmp), metadata={"format": FORMAT})
    os.replace(tmp, out / WEIGHTS_FILE)
    doc = {"format": FORMAT, "xsearch_version": __version__, "space_name": sn.space.name,
           "space": sn.space.to_yaml(), "task_fields": sn.task_fields, "seed": sn.seed,
           **sn.layout, **(extra or {})}  # fmt: skip
    atomic_write_text(out / CONFIG_FILE, json.dumps(doc, indent=2, sort_keys=True))
    return out


def read_supernet_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` of a saved supernet (errors name the folder)."""
    path = Path(directory)
    if not path.is_dir():
        raise MissingPathError(f"no saved supernet at {path} (not a directory)")
    if not (path / CONFIG_FILE).is_file():
        raise MissingPathError(f"{path} is not a saved supernet (no {CONFIG_FILE})")
    doc = read_json(path / CONFIG_FILE)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else None
        raise XSearchError(f"{path} is not a saved supernet (format {found!r}, expected {FORMAT!r})")
    return doc


def load_supernet(directory: str | os.PathLike) -> SuperTransformer:
    """Rebuild a supernet saved by ``save_supernet`` (its space from the saved YAML, not from today's files)."""
    from xsearch.search_spaces import space_from_yaml

    path = Path(directory)
    doc = read_supernet_config(path)
    fields = doc["task_fields"]
    space = space_from_yaml(doc["space"], source=str(path / CONFIG_FILE), causal=bool(fields.get("causal", False)),
                            max_len=fields["max_len"])  # fmt: skip
    layout = {key: doc.get(key, default) for key, default in LAYOUT_DEFAULTS.items()}  # (saved before the options)
    try:
        sn = SuperTransformer(space, fields, init=False, seed=int(doc.get("seed", 0)), **layout)
    except ValueError as e:
        raise XSearchError(f"{path / CONFIG_FILE}: {e}") from None
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise MissingPathError(f"missing file: {weights}")
    try:
        tensors = safetensors.torch.load_file(str(weights))
    except Exception as e:  # safetensors raises several types for a corrupt header
        raise XSearchError(f"cannot read supernet weights {weights}: {e}") from None
    missing, unexpected = sorted(set(sn.shapes) - set(tensors)), sorted(set(tensors) - set(sn.shapes))
    bad = [n for n in sn.shapes if n in tensors and tuple(tensors[n].shape) != sn.shapes[n]]
    if missing or unexpected or bad:
        raise XSearchError(f"weights in {weights} do not match its config.json (missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}, other shape {bad[:3]})")  # fmt: skip
    with torch.no_grad():
        for name, t in tensors.items():
            sn.tensor(name).copy_(t)
    return sn.eval()


def check_matches(held_space: str, held_task_fields: dict[str, Any], space, task_fields: dict[str, Any], *,
                  where: str) -> None:  # fmt: skip
    """Refuse a supernet built for another space or task, naming the first difference.

    Spaces are compared by what they hold (their dimensions, variants, reference and ``per_layer``), not by
    their text, name or description: a copy of a space under another name, or one an older xsearch wrote with
    its keys in another order, is the same space.

    Args:
        held_space: the YAML of the space the supernet was built for (``SearchSpace.to_yaml()``).
        held_task_fields: the task fields it was built for.
        space, task_fields: what it is used for now.
        where: the supernet's folder, for the message.

    Raises:
        SubnetMismatchError: naming the first difference.
    """
    import yaml

    from xsearch.supernet.supertransformer import SubnetMismatchError

    if shown := show_differences(held_task_fields, task_fields, held_as="there", now_as="in this task"):
        raise SubnetMismatchError(f"supernet {where} was built for another task ({shown})")
    held, now = (yaml.safe_load(text) or {} for text in (held_space, space.to_yaml()))
    if found := first_difference(*({k: v for k, v in doc.items() if k not in UNCOMPARED} for doc in (held, now))):
        key, there, here = found
        raise SubnetMismatchError(f"supernet {where} was built for space {held.get('name')!r}, not {space.name!r} "
                                  f"as given (first difference: {key} {there!r} there, {here!r} here)")  # fmt: skip


#: What a space's YAML holds that does not change which subnets it has.
UNCOMPARED = ("name", "description")
_ABSENT = "(absent)"


def first_difference(held: Any, now: Any, path: tuple[str, ...] = ()) -> tuple[str, Any, Any] | None:
    """The dotted key of the first place two parsed YAML documents differ, and both values there (``"(absent)"``
    for a key one of them lacks); None when they are equal."""
    if isinstance(held, dict) and isinstance(now, dict):
        for key in [*held, *(k for k in now if k not in held)]:
            found = first_difference(held.get(key, _ABSENT), now.get(key, _ABSENT), (*path, str(key)))
            if found:
                return found
        return None
    return None if held == now else (".".join(path), held, now)
