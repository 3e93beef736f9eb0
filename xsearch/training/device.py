"""Where training runs: ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (the settings' ``device``), checked before any
work starts.

CUDA without a GPU that torch sees is the user's to fix and fails with one line naming the device; there is
no silent fallback to the CPU (a run meant for a GPU would take hours there)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from xsearch.errors import XSearchError
from xsearch.training.settings import DEVICES


def resolve_device(name: str | torch.device) -> torch.device:
    """``name`` (``cpu``, ``cuda``, ``cuda:N``) as a ``torch.device``, once it is known to be usable here.

    Raises:
        XSearchError: an unknown device, ``cuda`` where torch sees no CUDA GPU, or a GPU index it does not see.
    """
    shown = str(name)
    if isinstance(name, torch.device):
        name = name.type if name.index is None else f"{name.type}:{name.index}"
    if name not in DEVICES:
        raise XSearchError(f"unknown device {shown!r} (valid: {', '.join(DEVICES)})")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
            raise XSearchError(f"device {shown!r}: torch {torch.__version__} ({build}) sees no CUDA GPU on this "
                               "machine; train with device 'cpu'")  # fmt: skip
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise XSearchError(f"device {shown!r}: torch sees {count} CUDA GPU{'s' if count != 1 else ''} here "
                               f"(cuda:0 to cuda:{count - 1})")  # fmt: skip
    return device


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter or buffer (the CPU for a module that holds none)."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")


@contextlib.contextmanager
def moved_to(module: nn.Module, device: torch.device) -> Iterator[nn.Module]:
    """``module`` on ``device`` for the block, then back where it was, also when the block raises (an
    interrupted training run leaves the caller's model where it found it)."""
    home = module_device(module)
    module.to(device)
    try:
        yield module
    finally:
        module.to(home)


def on_device(batch: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """A batch's tensors on ``device`` (the same tensors where they are there already)."""
    return tuple(t.to(device, non_blocking=True) for t in batch)
