"""Where training runs: ``"cpu"`` or ``"cuda"`` (the settings' ``device``), checked before any work starts.

CUDA without a GPU that torch sees is the user's to fix and fails with one line naming the device; there is
no silent fallback to the CPU (a run meant for a GPU would take hours there)."""

from __future__ import annotations

import torch
from torch import nn

from xsearch.errors import XSearchError
from xsearch.training.settings import DEVICES


def resolve_device(name: str | torch.device) -> torch.device:
    """``name`` as a ``torch.device``, once it is known to be usable here.

    Raises:
        XSearchError: an unknown device, or ``cuda`` where torch sees no CUDA GPU.
    """
    kind = torch.device(name).type if isinstance(name, torch.device) else str(name)
    if kind not in DEVICES:
        raise XSearchError(f"unknown device {name!r} (valid: {', '.join(DEVICES)})")
    if kind == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise XSearchError(f"device 'cuda': torch {torch.__version__} ({build}) sees no CUDA GPU on this machine; "
                           "train with device 'cpu'")  # fmt: skip
    return torch.device(name)


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter or buffer (the CPU for a module that holds none)."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")


def on_device(batch: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """A batch's tensors on ``device`` (the same tensors where they are there already)."""
    return tuple(t.to(device, non_blocking=True) for t in batch)
