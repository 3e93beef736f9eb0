"""Saving and loading models as ``config.json`` + ``model.safetensors`` (no pickle)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import safetensors.torch
from torch import nn

from xsearch.config import ModelConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TASK_FILE = "task.json"
FORMAT = "xsearch-model/1"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary name and a rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def save_model(model: nn.Module, directory: str | os.PathLike, *, task: dict[str, Any] | None = None) -> Path:
    """Save ``model`` (an ``XSearchModel``) to ``directory``.

    Writes ``model.safetensors`` then ``config.json`` (and ``task.json`` when ``task``, the
    task's ``describe()`` dict, is given), each through a temporary name and a rename, so
    an interrupted save never leaves a half-written file under the final name.

    Returns:
        The directory path.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        raise ValueError(f"save_model needs an xsearch model with a ModelConfig, got {type(model).__name__}")
    from xsearch import __version__

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    weights = out / WEIGHTS_FILE
    tmp = weights.with_name(f".{WEIGHTS_FILE}.tmp-{os.getpid()}")
    # save_model (not save_file) de-duplicates shared tensors (weight sharing across layers).
    safetensors.torch.save_model(model, str(tmp), metadata={"format": FORMAT})
    os.replace(tmp, weights)
    if task is not None:
        atomic_write_text(out / TASK_FILE, json.dumps(task, indent=2, sort_keys=True))
    doc = {"format": FORMAT, "xsearch_version": __version__, "model": config.to_dict()}
    atomic_write_text(out / CONFIG_FILE, json.dumps(doc, indent=2, sort_keys=True))
    return out


def read_json(path: Path) -> Any:
    """Parse a JSON file with errors that name it."""
    if not path.is_file():
        raise FileNotFoundError(f"missing file: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"malformed JSON in {path}: {e}") from None


def load_config(directory: str | os.PathLike) -> ModelConfig:
    """The ``ModelConfig`` stored in a saved model folder."""
    path = Path(directory)
    if not path.is_dir():
        raise FileNotFoundError(f"no saved model at {path} (not a directory)")
    doc = read_json(path / CONFIG_FILE)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or "model" not in doc:
        raise ValueError(f"{path / CONFIG_FILE} is not an xsearch model config (format {FORMAT!r})")
    return ModelConfig.from_dict(doc["model"])


def load_model(directory: str | os.PathLike) -> nn.Module:
    """Rebuild a model saved by ``save_model``, in eval mode, with identical outputs."""
    from xsearch.model import build_model

    path = Path(directory)
    model = build_model(load_config(path))
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"missing file: {weights}")
    try:
        missing, unexpected = safetensors.torch.load_model(model, str(weights), strict=False)
    except Exception as e:  # safetensors raises several types for a corrupt header
        raise ValueError(f"cannot read weights {weights}: {e}") from None
    if missing or unexpected:
        raise ValueError(
            f"weights in {weights} do not match config.json (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]})"
        )
    model.task_info = load_task_info(path)  # travels on into an ONNX export's metadata
    return model.eval()


def load_task_info(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The task description saved with a model, or None when there is none."""
    path = Path(directory) / TASK_FILE
    return read_json(path) if path.is_file() else None
