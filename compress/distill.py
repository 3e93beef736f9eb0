"""Knowledge distillation: the student learns the task and the teacher's softened outputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xsearch.errors import XSearchError


def distill_loss(student_logits, teacher_logits, labels, mask, *, temperature: float, alpha: float):
    """``alpha * KL(teacher/T || student/T) * T^2 + (1 - alpha) * CE(student, labels)``."""
    if student_logits.dim() == 3:  # lm: real positions only
        student_logits, teacher_logits, labels = student_logits[mask], teacher_logits[mask], labels[mask]
    t = temperature
    kl = F.kl_div(F.log_softmax(student_logits / t, -1), F.log_softmax(teacher_logits / t, -1), log_target=True,
                  reduction="batchmean") * (t * t)  # fmt: skip
    ce = F.cross_entropy(student_logits, labels)
    return alpha * kl + (1.0 - alpha) * ce


def distill(
    student,
    teacher,
    task,
    *,
    steps: int,
    temperature: float = 2.0,
    alpha: float = 0.5,
    hidden: bool = False,
    hidden_weight: float = 1.0,
    **train_kwargs,
):
    """Train ``student`` on ``task`` against ``teacher`` (any saved xsearch model of the task).

    Loss: ``alpha * KL(teacher/T || student/T) * T^2 + (1 - alpha) * CE``; with ``hidden=True`` a
    learned projection maps the student's final hidden states to the teacher's width and adds
    their MSE (over real tokens), weighted by ``hidden_weight``. Other keyword arguments go to
    ``xsearch.train`` (``batch_size``, ``lr``, ``seed``, ...). Returns the student.
    """
    from xsearch.training import train
    from xsearch.training.device import module_device, moved_to, resolve_device

    if not 0.0 <= alpha <= 1.0:
        raise XSearchError(f"alpha must be in [0, 1], got {alpha}")
    if temperature <= 0:
        raise XSearchError(f"temperature must be > 0, got {temperature}")
    if teacher.config.head != student.config.head or teacher.head.out_features != student.head.out_features:
        raise XSearchError("teacher and student must have the same head (task and number of outputs)")
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    proj = nn.Linear(student.config.d_model, teacher.config.d_model) if hidden else None
    if proj is not None:
        student.distill_projection = proj  # trained with the student, removed afterwards

    def loss_fn(model, ids, mask, labels):
        with torch.no_grad():
            t_hidden = teacher.hidden_states(ids, mask)
            t_logits = teacher.head_logits(t_hidden, mask)
        s_hidden = model.hidden_states(ids, mask)
        loss = distill_loss(model.head_logits(s_hidden, mask), t_logits, labels, mask, temperature=temperature,
                            alpha=alpha)  # fmt: skip
        if proj is not None:
            m = mask.unsqueeze(-1).to(s_hidden.dtype)
            err = ((model.distill_projection(s_hidden) - t_hidden) ** 2 * m).sum() / (m.sum() * t_hidden.shape[-1])
            loss = loss + hidden_weight * err
        return loss

    device = train_kwargs.get("device")
    try:
        with moved_to(teacher, resolve_device(device) if device is not None else module_device(student)):
            train(student, task, steps=steps, loss_fn=loss_fn, **train_kwargs)
    finally:
        if proj is not None:
            del student.distill_projection
    return student
