"""xsearch: hardware-aware search and compression of efficient-attention Transformers.

Public names resolve lazily so that ``import xsearch`` stays light (it does not import
torch); the deployment runtime in ``xsearch.export`` needs only onnxruntime and numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from xsearch.errors import XSearchError as XSearchError

__version__ = "0.1.0"

_LAZY = {
    "list_attentions": "xsearch.attention",
    "attention_spec": "xsearch.attention",
    "build_attention": "xsearch.attention",
    "AttentionSpec": "xsearch.attention",
    "ModelConfig": "xsearch.config",
    "describe_config": "xsearch.config",
    "build_model": "xsearch.model",
    "count_parameters": "xsearch.model",
    "generate": "xsearch.generation",
    "save_model": "xsearch.serialization",
    "load_model": "xsearch.serialization",
    "load_config": "xsearch.serialization",
    "train": "xsearch.training",
    "evaluate": "xsearch.training",
    "evaluate_score": "xsearch.training",
    "TrainingDiverged": "xsearch.training",
    "TrainResult": "xsearch.training",
    "TrainSettings": "xsearch.training",
    "train_model": "xsearch.training",
    "pretrain": "xsearch.training",
    "PretrainSettings": "xsearch.training",
    "init_from_pretrained": "xsearch.training",
}
_SUBMODULES = ("tasks", "attention", "compress", "export", "search_spaces", "latency", "search", "pipeline")

__all__ = sorted([*_LAZY, *_SUBMODULES, "XSearchError", "__version__"])


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"xsearch.{name}")
    raise AttributeError(f"module 'xsearch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover
    from xsearch.attention import AttentionSpec, attention_spec, build_attention, list_attentions  # noqa: F401
    from xsearch.config import ModelConfig, describe_config  # noqa: F401
    from xsearch.generation import generate  # noqa: F401
    from xsearch.model import build_model, count_parameters  # noqa: F401
    from xsearch.serialization import load_config, load_model, save_model  # noqa: F401
    from xsearch.training import (  # noqa: F401
        PretrainSettings,
        TrainingDiverged,
        TrainResult,
        TrainSettings,
        evaluate,
        evaluate_score,
        init_from_pretrained,
        pretrain,
        train,
        train_model,
    )
