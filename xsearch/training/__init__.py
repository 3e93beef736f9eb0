"""Training and evaluation: the loop (AdamW, warmup + cosine decay, clipping, validation, progress),
``TrainSettings`` (every option of a training run, defined once), ``train_model`` (build, train,
score: what ``xsearch train`` and the pipeline's train stages run), and self-pretraining (``pretrain``,
``PretrainSettings``, ``init_from_pretrained``: what ``xsearch pretrain`` and ``train --init`` run).

``import xsearch.training`` is light; torch is imported when a name that needs it is used.
"""

from __future__ import annotations

from xsearch._lazy import by_module, lazy_names

_LAZY = by_module(
    {
        "xsearch.training.loop": "train evaluate evaluate_score evaluate_onnx score_logits score_split Score task_loss "
        "TrainResult TrainingDiverged",
        "xsearch.training.settings": "TrainSettings PretrainSettings",
        "xsearch.training.pretrain": "pretrain init_from_pretrained",
        "xsearch.training.recipe": "train_model TrainedModel",
    }
)
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
