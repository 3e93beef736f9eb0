"""Saving and loading models as ``config.json`` + ``model.safetensors`` (no pickle)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import safetensors.torch
from torch import nn

from xsearch.config import ModelConfig
from xsearch.errors import MissingPathError, XSearchError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TASK_FILE = "task.json"
FORMAT = "xsearch-model/1"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary name and a rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_checkpoint(path: Path, tensors: dict[str, Any], state: dict[str, Any]) -> None:
    """One safetensors file holding ``tensors`` and, in its metadata, the JSON of ``state``; written under a
    temporary name and renamed, so a kill at any moment leaves the previous whole checkpoint. Tensors that
    share memory (tied weights) must come as copies: safetensors refuses shared storage."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    safetensors.torch.save_file(tensors, str(tmp), metadata={"state": json.dumps(state, sort_keys=True)})
    os.replace(tmp, path)


def read_checkpoint(path: Path, what: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(state, tensors)`` of a ``write_checkpoint`` file, or None when there is none.

    Raises:
        XSearchError: the file cannot be read (its path and ``what`` it is named, with how to start over).
    """
    import safetensors

    if not path.is_file():
        return None
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            state = json.loads(f.metadata()["state"])
        return state, safetensors.torch.load_file(str(path))
    except Exception as e:  # safetensors raises several types for a corrupt file
        raise XSearchError(f"cannot read the {what} {path}: {e}; remove it to start over") from None


def check_output_dir(path: Path, what: str = "output folder") -> Path:
    """Check, before any work, that ``path`` can become an output folder: it is not a file, and it is new,
    empty, or a folder xsearch wrote (it holds a ``config.json`` of ours), which is then replaced.

    Raises:
        XSearchError: naming ``what`` and the path.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise XSearchError(f"{what} {path} exists and is a file, not a folder")
    if path.is_dir() and any(path.iterdir()) and not _ours(path):
        raise XSearchError(f"{what} {path} is a folder xsearch did not write (no xsearch config.json); "
                           "choose a new path")  # fmt: skip
    if not path.exists() and path.parent.exists() and not os.access(path.parent, os.W_OK):
        raise XSearchError(f"{what} {path}: cannot write into {path.parent}")
    return path


def _ours(path: Path) -> bool:
    if (path / "adapters.json").is_file():  # xsearch.compress.save_adapters
        return True
    try:
        doc = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and str(doc.get("format", "")).startswith("xsearch-")


@contextlib.contextmanager
def staged_directory(path: str | os.PathLike) -> Iterator[Path]:
    """A fresh folder to write an output into; on success it replaces ``path`` whole, on failure it is removed,
    so ``path`` is never half-written and a failed command leaves nothing behind."""
    final = check_output_dir(Path(path))
    final.parent.mkdir(parents=True, exist_ok=True)
    stage = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir()
    try:
        yield stage
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        if final.exists():
            os.replace(final, old)
        os.replace(stage, final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


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
        raise XSearchError(f"save_model needs an xsearch model with a ModelConfig, got {type(model).__name__}")
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
        raise MissingPathError(f"missing file: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise XSearchError(f"malformed JSON in {path}: {e}") from None


def load_config(directory: str | os.PathLike) -> ModelConfig:
    """The ``ModelConfig`` stored in a saved model folder."""
    path = Path(directory)
    if not path.is_dir():
        raise MissingPathError(f"no saved model at {path} (not a directory)")
    doc = read_json(path / CONFIG_FILE)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or "model" not in doc:
        raise XSearchError(f"{path / CONFIG_FILE} is not an xsearch model config (format {FORMAT!r})")
    return ModelConfig.from_dict(doc["model"])


def load_model(directory: str | os.PathLike) -> nn.Module:
    """Rebuild a model saved by ``save_model``, in eval mode, with identical outputs."""
    from xsearch.model import build_model

    path = Path(directory)
    model = build_model(load_config(path))
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise MissingPathError(f"missing file: {weights}")
    try:
        missing, unexpected = safetensors.torch.load_model(model, str(weights), strict=False)
    except Exception as e:  # safetensors raises several types for a corrupt header
        raise XSearchError(f"cannot read weights {weights}: {e}") from None
    if missing or unexpected:
        raise XSearchError(
            f"weights in {weights} do not match config.json (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]})"
        )
    model.task_info = load_task_info(path)  # travels on into an ONNX export's metadata
    return model.eval()


def load_task_info(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The task description saved with a model, or None when there is none."""
    path = Path(directory) / TASK_FILE
    return read_json(path) if path.is_file() else None
