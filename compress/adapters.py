"""Task adapters: bottleneck (Houlsby) and LoRA, injected by name, saved adapter-only.

``add_adapters`` freezes the base model; only adapter (and head) parameters train.
``save_adapters`` writes those parameters (safetensors) and their description (JSON), so one
base model plus several adapter folders serves several tasks, including tasks with another
number of classes (the head travels with the adapter). ``merge_adapters`` folds LoRA into the
base weights for export; bottleneck adapters export as ordinary modules.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import torch.nn.functional as F
from torch import nn

from xsearch.compress.settings import ADAPTER_KINDS as KINDS
from xsearch.errors import MissingPathError, XSearchError

ADAPTER_FILE = "adapters.safetensors"
ADAPTER_CONFIG = "adapters.json"


class LoRALinear(nn.Module):
    """``base(x) + (alpha / r) * B(A(x))`` with a frozen ``base`` (Hu et al.); B starts at zero.

    ``weight`` returns the effective (merged) weight, so code that reads a projection's weight
    directly (e.g. Linformer folding its length projection) sees the adapted layer too.
    """

    def __init__(self, base: nn.Linear, r: int, alpha: float | None = None):
        super().__init__()
        self.base = base
        self.r = r
        self.scaling = (alpha if alpha is not None else r) / r
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features, device=base.weight.device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r, device=base.weight.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.in_features, self.out_features = base.in_features, base.out_features

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight + self.scaling * (self.lora_B @ self.lora_A)

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scaling * F.linear(F.linear(x, self.lora_A), self.lora_B)

    def merged(self) -> nn.Linear:
        out = nn.Linear(self.in_features, self.out_features, bias=self.base.bias is not None)
        with torch.no_grad():
            out.weight.copy_(self.weight)
            if self.base.bias is not None:
                out.bias.copy_(self.base.bias)
        return out.to(self.base.weight.device)


class Bottleneck(nn.Module):
    """Houlsby adapter after a sub-layer: ``y + up(gelu(down(y)))``; ``up`` starts at zero."""

    def __init__(self, inner: nn.Module, d_model: int, size: int):
        super().__init__()
        self.inner = inner
        self.adapter_down = nn.Linear(d_model, size)
        self.adapter_up = nn.Linear(size, d_model)
        nn.init.zeros_(self.adapter_up.weight)
        nn.init.zeros_(self.adapter_up.bias)

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        y = self.inner(x, *args, **kwargs)
        out = y + self.adapter_up(F.gelu(self.adapter_down(y)))
        mask = args[0] if args else kwargs.get("mask")
        if mask is not None:  # attention zeroes padded positions; keep it that way
            out = out * mask.unsqueeze(-1).to(out.dtype)
        return out

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("inner"), name)


def _set_head(model, n_classes: int | None) -> None:
    cfg = model.config
    if n_classes is None or (cfg.head == "classify" and n_classes == cfg.n_classes):
        return
    if cfg.head != "classify":
        raise XSearchError("n_classes applies to classification models only")
    if n_classes < 2:
        raise XSearchError(f"n_classes must be >= 2, got {n_classes}")
    model.head = nn.Linear(cfg.d_model, n_classes).to(model.head.weight.device)
    cfg.n_classes = n_classes


def add_adapters(
    model,
    *,
    kind: str = "bottleneck",
    size: int = 16,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    alpha: float | None = None,
    n_classes: int | None = None,
):
    """Inject adapters into ``model`` (in place) and freeze everything but adapters and the head.

    Args:
        kind: ``"bottleneck"`` (after every attention and FFN sub-layer; ``targets`` unused) or
            ``"lora"`` (rank ``size`` updates on the projections named in ``targets``).
        size: bottleneck width or LoRA rank.
        alpha: LoRA scaling numerator (default ``size``, i.e. scaling 1).
        n_classes: a new classification head of this size (for a task with other labels).

    Returns:
        The model; ``model.adapter_config`` describes what was added.
    """
    if kind not in KINDS:
        raise XSearchError(f"unknown adapter kind {kind!r}; valid: {', '.join(KINDS)}")
    if size <= 0:
        raise XSearchError(f"adapter size must be > 0, got {size}")
    if getattr(model, "adapter_config", None):
        raise XSearchError("the model already has adapters (merge or reload the base model first)")
    for p in model.parameters():
        p.requires_grad_(False)
    _set_head(model, n_classes)
    d = model.config.d_model
    touched = 0
    blocks = list(dict.fromkeys(model.blocks))
    if kind == "bottleneck":
        done: dict[int, nn.Module] = {}  # shared sub-layers get one shared adapter

        def wrap(m: nn.Module) -> nn.Module:
            if id(m) not in done:
                done[id(m)] = Bottleneck(m, d, size)
            return done[id(m)]

        for block in blocks:
            block.attn = wrap(block.attn)
            block.ffn = wrap(block.ffn)
            touched += 2
    else:
        done = {}
        for block in blocks:
            attn = block.attn
            for name in targets:
                lin = getattr(attn, name, None)
                if not isinstance(lin, nn.Linear):
                    raise XSearchError(f"LoRA target {name!r} is not a Linear layer of attention {attn.spec.name!r}")
                if id(lin) not in done:
                    done[id(lin)] = LoRALinear(lin, size, alpha)
                setattr(attn, name, done[id(lin)])
                touched += 1
    for p in model.head.parameters():
        p.requires_grad_(True)
    for name, p in model.named_parameters():
        if "lora_" in name or "adapter_" in name:
            p.requires_grad_(True)
    n_out = model.config.n_classes if model.config.head == "classify" else None
    model.adapter_config = {"kind": kind, "size": size, "targets": list(targets), "alpha": alpha, "n_classes": n_out}
    return model


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapter and head tensors (what ``save_adapters`` writes)."""
    return {
        n: p.detach().clone().contiguous()
        for n, p in model.state_dict(keep_vars=True).items()
        if "lora_" in n or "adapter_" in n or n.startswith("head.")
    }


def save_adapters(model, directory: str | os.PathLike, *, task: dict[str, Any] | None = None) -> Path:
    """Write ``adapters.safetensors`` (adapter + head weights only) and ``adapters.json``."""
    from xsearch.serialization import atomic_write_text

    cfg = getattr(model, "adapter_config", None)
    if not cfg:
        raise XSearchError("the model has no adapters (call add_adapters first)")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{ADAPTER_FILE}.tmp-{os.getpid()}"
    safetensors.torch.save_file(adapter_state(model), str(tmp))
    os.replace(tmp, out / ADAPTER_FILE)
    base = model.config.to_dict()
    doc = {"adapter": cfg, "base_model": base, "task": task if task is not None else getattr(model, "task_info", None)}
    atomic_write_text(out / ADAPTER_CONFIG, json.dumps(doc, indent=2, sort_keys=True, default=str))
    return out


def load_adapters(base_model, directory: str | os.PathLike):
    """Add the adapters saved in ``directory`` to ``base_model`` (in place) and load their weights.

    Raises:
        ValueError: the adapters were trained on a different base architecture.
    """
    from xsearch.serialization import read_json

    path = Path(directory)
    doc = read_json(path / ADAPTER_CONFIG)
    cfg = doc["adapter"]
    saved = dict(doc["base_model"])
    mine = base_model.config.to_dict()
    for key in ("n_classes",):
        saved.pop(key, None)
        mine.pop(key, None)
    if saved != mine:
        diff = sorted(k for k in set(saved) | set(mine) if saved.get(k) != mine.get(k))
        raise XSearchError(f"adapters in {path} belong to another base model (differs in {', '.join(diff)})")
    add_adapters(base_model, kind=cfg["kind"], size=cfg["size"], targets=tuple(cfg["targets"]), alpha=cfg["alpha"],
                 n_classes=cfg["n_classes"])  # fmt: skip
    weights = path / ADAPTER_FILE
    if not weights.is_file():
        raise MissingPathError(f"missing file: {weights}")
    tensors = safetensors.torch.load_file(str(weights))
    missing, unexpected = base_model.load_state_dict(tensors, strict=False)
    expected = set(adapter_state(base_model))
    if set(tensors) != expected:
        raise XSearchError(f"{weights} does not match the adapters described in {ADAPTER_CONFIG}")
    if doc.get("task"):
        base_model.task_info = doc["task"]
    return base_model


def merge_adapters(model):
    """Fold LoRA updates into the base weights (exact); bottleneck adapters stay as modules."""
    # shared QK (reformer, causal routing): k_proj holds q_proj's base parameters; re-tie after
    ties = [
        m for m in model.modules()
        if isinstance(getattr(m, "q_proj", None), LoRALinear) and getattr(m, "k_proj", None) is not None
        and m.k_proj.weight is m.q_proj.base.weight
    ]  # fmt: skip
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                setattr(module, name, child.merged())
    # re-tie shared QK (reformer / causal routing), which merging replaced by two copies
    for m in ties:
        m.k_proj.weight, m.k_proj.bias = m.q_proj.weight, m.q_proj.bias
    for p in model.parameters():
        p.requires_grad_(True)
    if getattr(model, "adapter_config", None) and model.adapter_config["kind"] == "lora":
        model.adapter_config = None
    return model
