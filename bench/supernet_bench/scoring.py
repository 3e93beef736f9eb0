"""A model's validation accuracy and loss, and a subnet trained with the proxy's recipe, then scored by them."""

from __future__ import annotations

import time

import torch

from xsearch.training import evaluate_score
from xsearch.training.recipe import train_model
from xsearch.training.settings import TrainSettings


@torch.no_grad()
def accuracy_and_loss(model, task, split: str) -> tuple[float, float]:
    """``model``'s accuracy on ``split`` and its mean cross-entropy there (nats), from one pass: the loss still tells
    apart models whose predictions, and so whose accuracies, are the same (HAT ranks its SubTransformers by loss)."""
    score = evaluate_score(model, task, split)
    return score.metric, score.loss


def trained_and_scored(cfg, task, steps: int, args, init=None) -> tuple[float, float, float]:
    """``cfg`` trained ``steps`` steps with the proxy's recipe (``--lr``, seed ``--train-seed``) from ``init``'s
    weights (None: new ones), then its validation accuracy and loss, and the seconds both took."""
    t0 = time.perf_counter()
    settings = TrainSettings(steps=steps, lr=args.lr, seed=args.train_seed, device=args.device)
    trained = train_model(cfg, task, settings, progress=False, init=init)
    valid, loss = accuracy_and_loss(trained.model.to(args.device), task, "valid")
    return valid, loss, time.perf_counter() - t0
