"""``to_onnx(..., decoder=True)``: a causal LM as two ONNX graphs, prefill and step, with its decoding
state as named inputs and outputs, checked against torch by greedy generation.

Files: the prefill graph at ``path`` (``m.onnx``) and the step graph beside it (``m.step.onnx``);
each file's metadata names the other (``xsearch_decoder``).

Names (onnxruntime-genai's for KV caches):

========================  =================================  ====================================
graph                     inputs                             outputs
========================  =================================  ====================================
prefill                   ``input_ids`` int64 (B, N),        ``logits`` (B, N, V), ``present_length``
                          ``attention_mask`` bool (B, N)     int64 (B,), the present state
step                      ``input_ids`` int64 (B,),          ``logits`` (B, V), ``present_length``,
                          ``past_length`` int64 (B,),        the present state
                          the past state
========================  =================================  ====================================

A full-attention layer ``i`` carries ``past_key_values.{i}.key/value`` -> ``present.{i}.key/value``
``(B, H, past, Dh)``; any other state tensor ``state.{i}.{name}`` -> ``present_state.{i}.{name}``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from xsearch.attention import standard_ops_only
from xsearch.config import describe_config
from xsearch.errors import XSearchError
from xsearch.export.contrib_ops import custom_translations
from xsearch.export.errors import ExportParityError
from xsearch.export.metadata import INPUTS, KEY_DECODER, OUTPUT, build_metadata, decoder_names, step_path_for

log = logging.getLogger("xsearch.export")
PARITY_STEPS = 24  # greedy tokens compared between torch and onnxruntime


def state_layout(model: nn.Module) -> list[tuple[int, str, bool]]:
    """``(depth, name, is_kv_cache)`` of every state tensor, in graph order."""
    return [
        (i, name, block.attn.kv_cache and name in ("key", "value"))
        for i, block in enumerate(model.layers())
        for name in block.attn.state_names
    ]


class _PrefillGraph(nn.Module):
    def __init__(self, model: nn.Module, layout: list[tuple[int, str, bool]]):
        super().__init__()
        self.model, self.layout = model, layout

    def forward(self, input_ids, attention_mask):
        logits, state = self.model.prefill(input_ids, attention_mask)
        return (logits, state["length"], *[state["layers"][i][name] for i, name, _ in self.layout])


class _StepGraph(nn.Module):
    def __init__(self, model: nn.Module, layout: list[tuple[int, str, bool]]):
        super().__init__()
        self.model, self.layout = model, layout

    def forward(self, input_ids, past_length, *past):
        layers: list[dict[str, torch.Tensor]] = [{} for _ in range(self.model.config.n_layers)]
        for (i, name, _), t in zip(self.layout, past):
            layers[i][name] = t
        logits, state = self.model.step(input_ids, {"length": past_length, "layers": layers})
        return (logits, state["length"], *[state["layers"][i][name] for i, name, _ in self.layout])


def _prompts(vocab: int, lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), n), generator=g)
    mask = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    return ids * mask, mask


def _growing_dims(model: nn.Module, layout, vocab: int) -> list[set[int]]:
    """Per state tensor, the axes whose size follows the context (they differ between two prompts)."""
    with torch.no_grad():
        shapes = []
        for n in (5, 11):
            _, state = model.prefill(*_prompts(vocab, [n, n], 0))
            shapes.append([tuple(state["layers"][i][name].shape) for i, name, _ in layout])
    return [{d for d, (a, b) in enumerate(zip(s1, s2)) if a != b} for s1, s2 in zip(*shapes)]


def export_decoder(
    model: nn.Module,
    path: Path,
    *,
    opset: int | None,
    check: bool,
    task: dict[str, Any] | None,
    tolerance: float,
    portable: bool,
    version: str,
) -> tuple[float | None, tuple[int, ...]]:
    """Write ``path`` (prefill) and its step file atomically; return the parity check's result."""
    config = model.config
    if not (config.causal and config.head == "lm"):
        raise XSearchError(f"a decoder export needs a causal language model (causal=True, head='lm'), got "
                           f"causal={config.causal}, head={config.head!r}")  # fmt: skip
    if config.max_len < 16:
        raise XSearchError(f"a decoder export needs max_len >= 16, got {config.max_len}")
    from xsearch.export.onnx_export import example_length

    layout = state_layout(model)
    names = decoder_names([(i, name, kv) for i, name, kv in layout])
    step_path = step_path_for(path)
    growing = _growing_dims(model, layout, config.vocab_size)
    dyn = torch.export.Dim.DYNAMIC
    # Rows of different lengths, the longest a long prime (as for an encoder, see example_length: no
    # traced size is 0 or 1, derived block counts are as large as they get and padding paths are traced).
    n_example = example_length(config.max_len - 1)
    ids, mask = _prompts(config.vocab_size, [n_example, n_example - 2], 1)
    with torch.no_grad():
        _, state = model.prefill(ids, mask)
    past = [state["layers"][i][name] for i, name, _ in layout]
    step_example = (ids[:, 0], state["length"], *past)
    step_dynamic = {
        "input_ids": {0: dyn},
        "past_length": {0: dyn},
        "past": tuple({0: dyn, **{d: dyn for d in g}} for g in growing),
    }
    decoder = {"prefill_file": path.name, "step_file": step_path.name, **names}
    tmps = {p: p.with_name(f".{p.name}.tmp-{os.getpid()}") for p in (path, step_path)}
    try:
        graphs = [
            (path, _PrefillGraph(model, layout), (ids, mask), ({0: dyn, 1: dyn}, {0: dyn, 1: dyn}),
             list(INPUTS), [OUTPUT, *names["prefill_outputs"]], "prefill"),
            (step_path, _StepGraph(model, layout), step_example, step_dynamic,
             names["step_inputs"], [OUTPUT, *names["step_outputs"]], "step"),
        ]  # fmt: skip
        for target, graph, example, dynamic, inputs, outputs, role in graphs:
            proto = _export(graph, example, dynamic, inputs, outputs, opset=opset, portable=portable)
            meta = build_metadata(config.to_dict(), task, version)
            meta[KEY_DECODER] = json.dumps({**decoder, "role": role}, sort_keys=True)
            for key, value in meta.items():
                proto.metadata_props.add(key=key, value=value)
            onnx.save_model(proto, str(tmps[target]))
        diff, lengths = (None, ())
        if check:
            diff, lengths = check_decoder_parity(model, str(tmps[path]), str(tmps[step_path]), tolerance=tolerance)
        os.replace(tmps[step_path], step_path)
        os.replace(tmps[path], path)
    finally:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
    return diff, lengths


def _export(graph, example, dynamic, inputs, outputs, *, opset, portable) -> onnx.ModelProto:
    from xsearch.export.onnx_export import _check_no_randomness, _quiet_torch_logs  # (one module imports the other)

    fusion = standard_ops_only() if portable else contextlib.nullcontext()
    with warnings.catch_warnings(), torch.no_grad(), _quiet_torch_logs(), fusion:
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            graph,
            example,
            dynamo=True,
            input_names=inputs,
            output_names=outputs,
            opset_version=opset,
            dynamic_shapes=dynamic,
            external_data=False,
            verbose=False,
            custom_translation_table=custom_translations(),
        )
    proto = program.model_proto
    del proto.graph.value_info[:]  # see to_onnx: the exporter's intermediate shape annotations can be wrong
    _check_no_randomness(proto)
    return proto


def check_decoder_parity(
    model: nn.Module, prefill_path: str, step_path: str, *, tolerance: float
) -> tuple[float, tuple[int, ...]]:
    """Largest |torch - onnxruntime| over the logits of prefill and ``PARITY_STEPS`` greedy steps, for a
    batch of one and a batch of two prompts of different lengths; the greedy tokens must be equal."""
    from xsearch.decoding import Sampler, generate_loop
    from xsearch.export.generator import Generator
    from xsearch.generation import numpy_decoder

    ort_model = Generator(prefill_path, step_path=step_path, threads=torch.get_num_threads())
    cfg = model.config
    steps = min(PARITY_STEPS, cfg.max_len // 2)
    longest = cfg.max_len - steps
    cases = [[max(1, longest // 3)], [longest, max(1, longest // 5)]]
    worst = 0.0

    torch_prefill, torch_step = numpy_decoder(model)
    for lengths in cases:
        ids, mask = _prompts(cfg.vocab_size, lengths, sum(lengths))
        prompts = [ids[i, :n].tolist() for i, n in enumerate(lengths)]
        seen: dict[str, list[np.ndarray]] = {"torch": [], "ort": []}
        with torch.no_grad():
            want = generate_loop(_Recorded(torch_prefill, seen["torch"]), _Recorded(torch_step, seen["torch"]),
                                 prompts, steps, Sampler(0.0), set())  # fmt: skip
        got = generate_loop(_Recorded(ort_model.prefill, seen["ort"]), _Recorded(ort_model.step, seen["ort"]),
                            prompts, steps, Sampler(0.0), set())  # fmt: skip
        for j, (a, b) in enumerate(zip(seen["torch"], seen["ort"])):
            if j == 0:  # prefill: padded positions carry no prediction
                m = mask.numpy()
                a, b = a[m], b[m]
            diff = float(np.max(np.abs(a - b))) if a.size else 0.0
            if not np.isfinite(diff) or diff > tolerance:
                where = "prefill" if j == 0 else f"step {j}"
                raise ExportParityError(
                    f"decoder export of {describe_config(cfg)} differs from torch by {diff:.3g} (tolerance "
                    f"{tolerance:g}) at {where}, prompt lengths {lengths}",
                    max_abs_diff=diff,
                    tolerance=tolerance,
                    case=(len(lengths), max(lengths)),
                )
            worst = max(worst, diff)
        if got != want:
            raise ExportParityError(
                f"decoder export of {describe_config(cfg)}: greedy tokens differ from torch's for prompt "
                f"lengths {lengths} ({got} vs {want})",
                max_abs_diff=worst,
                tolerance=tolerance,
                case=(len(lengths), max(lengths)),
            )
    log.info("decoder parity ok: max |diff| %.2e over %d greedy steps", worst, steps)
    return worst, tuple(sorted({n for c in cases for n in c}))


class _Recorded:
    """A prefill or step function that also appends the logits it returns to ``log``."""

    def __init__(self, fn, log: list[np.ndarray]):
        self.fn, self.log = fn, log

    def __call__(self, *args):
        logits, state = self.fn(*args)
        self.log.append(np.asarray(logits))
        return logits, state
