"""Torch-side quantization (deployment int8 goes through ``xsearch.export.quantize_onnx``)."""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from xsearch.errors import XSearchError

MODES = ("bf16", "fp16", "dynamic-int8")


def quantize(model, mode: str = "dynamic-int8"):
    """A quantized copy of ``model`` (the input is left unchanged).

    ``bf16`` / ``fp16``: weights and compute in half precision (inputs stay token ids).
    ``dynamic-int8``: ``torch.ao`` dynamic quantization of the ``nn.Linear`` layers that the
    model calls as modules (FFN, ``out_proj``, the head, and ``q/k/v_proj`` of variants that do
    not read their weights directly); int8 weights, activations quantized per batch, CPU only.
    """
    if mode not in MODES:
        raise XSearchError(f"unknown quantization mode {mode!r}; valid: {', '.join(MODES)}")
    out = copy.deepcopy(model).eval()
    if mode in ("bf16", "fp16"):
        return out.to(torch.bfloat16 if mode == "bf16" else torch.float16)
    from torch.ao.quantization import quantize_dynamic

    names = set()
    for name, module in out.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        parent_name, _, leaf = name.rpartition(".")
        parent = out.get_submodule(parent_name) if parent_name else out
        if leaf in ("q_proj", "k_proj", "v_proj") and not getattr(parent, "projections_called_as_modules", True):
            continue
        if leaf == "k_proj" and parent.k_proj.weight is parent.q_proj.weight:
            continue  # shared QK: the tie must survive
        names.add(name)
    with warnings.catch_warnings():  # torch.ao's deprecation notices: the API still works in this torch
        warnings.simplefilter("ignore")
        qconfig = {n: torch.ao.quantization.default_dynamic_qconfig for n in names}
        return quantize_dynamic(out, qconfig, dtype=torch.qint8)
