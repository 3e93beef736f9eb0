"""``train_model``: build a model from its config, train it, score it on the test split.

What ``xsearch train`` and the pipeline's ``train`` and ``reference`` stages run, so they cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xsearch.errors import XSearchError
from xsearch.training.loop import TrainResult, evaluate, train
from xsearch.training.settings import TrainSettings


@dataclass
class TrainedModel:
    """What ``train_model`` returns.

    Attributes:
        model: the trained ``XSearchModel`` (in eval mode).
        result: what the training run did (steps, seconds, validation history, best step).
        test_metric: accuracy (or bits per byte for ``lm``) on the test split.
        chance: the task's chance level on the test split (majority class, or a unigram model for ``lm``).
        parameters: distinct parameters.
    """

    model: Any
    result: TrainResult
    test_metric: float
    chance: float
    parameters: int


def train_model(config, task, settings: TrainSettings, *, progress: bool | None = None, init=None) -> TrainedModel:
    """Build ``config`` (a ``ModelConfig`` or its dict) with seed ``settings.seed``, train it on ``task``
    within ``settings``' budget, and score it on the test split.

    ``init``: a model of that config to start from instead of new weights (a subnet extracted from a
    supernet); it is trained in place. The model trains on ``settings.device`` and is handed back where it was
    (a new one on the CPU), also when training raises.
    """
    import torch

    from xsearch.config import ModelConfig
    from xsearch.model import build_model, count_parameters
    from xsearch.training.device import moved_to, resolve_device

    torch.manual_seed(settings.seed)
    if init is None:
        model = build_model(config)
    else:
        wanted = config if isinstance(config, ModelConfig) else ModelConfig.from_dict(dict(config))
        if init.config.to_dict() != wanted.to_dict():
            raise XSearchError("train_model: init is a model of another config")
        model = init
    with moved_to(model, resolve_device(settings.device)):  # trained and scored there, then handed back
        result = train(model, task, progress=progress, **settings.loop_options())
        metric = evaluate(model, task, "test")
    return TrainedModel(model, result, metric, task.chance("test"), count_parameters(model))
