"""``compress_model``: prune, then fine-tune (distilling from a teacher when given).

What ``xsearch compress`` and the pipeline's compress stage run, so they cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from xsearch.compress.settings import CompressSettings


@dataclass
class CompressResult:
    """What ``compress_model`` did: parameters before and after, fine-tuning steps, the teacher's use."""

    parameters_before: int
    parameters: int
    finetune_steps: int
    distilled: bool


def compress_model(model, task, settings: CompressSettings, *, teacher=None, progress: bool | None = None):
    """Prune ``model`` (in place) by ``settings``, then fine-tune it for ``settings.finetune_steps`` steps,
    distilling from ``teacher`` (a model of the same task) when given.

    Returns:
        ``(model, CompressResult)``.
    """
    import torch

    from xsearch.compress.distill import distill
    from xsearch.compress.prune import prune
    from xsearch.model import count_parameters
    from xsearch.training.device import resolve_device
    from xsearch.training.loop import train

    s = settings
    if s.finetune_steps:
        resolve_device(s.device)  # (a device that is not there is refused before the pruning)
    before = count_parameters(model)
    torch.manual_seed(s.seed)
    if s.prune_heads or s.prune_ffn:
        prune(model, heads=s.prune_heads, ffn=s.prune_ffn, importance=s.importance, task=task)
    if s.finetune_steps:
        options = dict(batch_size=s.batch_size, lr=s.lr, seed=s.seed, progress=progress, keep_best=s.keep_best,
                       device=s.device)  # fmt: skip
        if teacher is None:
            train(model, task, steps=s.finetune_steps, **options)
        else:
            distill(model, teacher, task, steps=s.finetune_steps, temperature=s.temperature, alpha=s.alpha, **options)
    return model, CompressResult(before, count_parameters(model), s.finetune_steps, teacher is not None)
