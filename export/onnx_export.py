"""``to_onnx``: one self-contained ONNX file per model, checked against onnxruntime."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from xsearch.attention import standard_ops_only
from xsearch.config import describe_config
from xsearch.errors import XSearchError
from xsearch.export.contrib_ops import custom_translations
from xsearch.export.errors import ExportParityError
from xsearch.export.metadata import INPUTS, OUTPUT, build_metadata, step_path_for

log = logging.getLogger("xsearch.export")
TOLERANCE = 1e-4


@dataclass(frozen=True)
class ExportReport:
    """Result of ``to_onnx``: where, how close to torch, at which lengths, how long, how big."""

    path: str
    max_abs_diff: float | None
    lengths_checked: tuple[int, ...]
    seconds: float
    size_bytes: int


def example_length(max_len: int) -> int:
    """The sequence length traced at export: the largest prime <= max_len.

    torch.export specialises a size that is 0 or 1 in the example, and such a size may be derived:
    a block count of 1 (a length of 17 under blocks of 64) was traced as the constant 1, and the
    graph then failed for longer inputs in a batch of two. A long prime length makes derived block
    counts as large as they get and never a multiple of a block size, so padding paths are traced.
    """
    for n in range(max_len, 2, -1):
        if all(n % d for d in range(2, math.isqrt(n) + 1)):
            return n
    return max_len


def _example(vocab: int, batch: int, n: int, seed: int, padded: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, n), generator=g)
    mask = torch.ones(batch, n, dtype=torch.bool)
    if padded and batch > 1:
        for row in range(1, batch):  # rows of decreasing real length, each >= 1
            real = max(1, n - row * max(1, n // (batch + 1)))
            mask[row, real:] = False
            ids[row, real:] = 0
    return ids, mask


def check_lengths(max_len: int) -> tuple[int, ...]:
    """Two (or three) sequence lengths for the parity check: max_len and shorter odd ones."""
    out = [max_len, max(1, (max_len // 3) | 1)]
    if max_len >= 8:
        out.append(5)
    return tuple(dict.fromkeys(out))


def to_onnx(
    model: torch.nn.Module,
    path: str | os.PathLike,
    *,
    opset: int | None = None,
    check: bool = True,
    task: dict[str, Any] | None = None,
    tolerance: float = TOLERANCE,
    portable: bool = False,
    decoder: bool = False,
) -> ExportReport:
    """Export an ``XSearchModel`` to one ONNX file with dynamic batch and length.

    Inputs ``input_ids`` (int64 [batch, seq]) and ``attention_mask`` (bool [batch, seq]),
    output ``logits``. The file's metadata carries the xsearch version, the model config and
    the task (name, encoding, label names; from ``task`` or the ``task_info`` that
    ``load_model`` attaches), so a ``Predictor`` needs nothing but the file.

    With ``check`` (default) onnxruntime is run against torch at two or more lengths and two
    batch sizes with padding; a difference above ``tolerance`` raises ``ExportParityError``.
    The file is written under a temporary name and renamed, so a failed export leaves nothing.

    Attention without a per-query mask becomes onnxruntime's ``com.microsoft.MultiHeadAttention``
    (a flash kernel on CPU); ``portable=True`` keeps to standard ONNX operators instead, for
    other runtimes, at some speed.

    ``decoder=True`` exports a causal LM for generation instead: its prefill graph at ``path`` and its
    step graph beside it (``m.step.onnx``), the decoding state as named inputs and outputs (see
    ``xsearch.export.decoder``), checked by greedy generation against torch; ``Generator`` runs it.
    """
    from xsearch import __version__

    config = getattr(model, "config", None)
    if config is None:
        raise XSearchError(f"to_onnx needs an xsearch model (with .config), got {type(model).__name__}")
    path = Path(path)
    if path.suffix != ".onnx":
        raise XSearchError(f"output path must end in .onnx, got {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    task = task if task is not None else getattr(model, "task_info", None)
    start = time.perf_counter()
    was_training = model.training
    model.eval()
    if decoder:
        from xsearch.export.decoder import export_decoder

        try:
            diff, lengths = export_decoder(model, path, opset=opset, check=check, task=task, tolerance=tolerance,
                                           portable=portable, version=__version__)  # fmt: skip
        finally:
            model.train(was_training)
        size = path.stat().st_size + step_path_for(path).stat().st_size
        return ExportReport(str(path), diff, lengths, time.perf_counter() - start, size)
    n_example = example_length(config.max_len)
    example = _example(config.vocab_size, 2, n_example, 0, padded=True)
    batch, seq = torch.export.Dim.DYNAMIC, torch.export.Dim.DYNAMIC
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        # no_grad: the inference graph only (variants with gradient-stopped memories would
        # otherwise trace a second, detached projection).
        fusion = standard_ops_only() if portable else contextlib.nullcontext()
        with warnings.catch_warnings(), torch.no_grad(), _quiet_torch_logs(), fusion:
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                model,
                example,
                dynamo=True,
                input_names=list(INPUTS),
                output_names=[OUTPUT],
                opset_version=opset,
                dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}),
                external_data=False,
                verbose=False,
                custom_translation_table=custom_translations(),
            )
        proto = program.model_proto
        # The exporter annotates intermediate values with symbolic shapes that can be wrong (a
        # Sinkhorn mask of (B, 1, nb, nb) annotated (B, 1, nb, 1)); onnxruntime plans buffer re-use
        # from them and fails at lengths the annotation gets wrong. Without them it infers shapes
        # itself. Graph inputs and outputs keep their declared shapes.
        del proto.graph.value_info[:]
        _check_no_randomness(proto)
        for key, value in build_metadata(config.to_dict(), task, __version__).items():
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.save_model(proto, str(tmp))
        diff, lengths = None, ()
        if check:
            diff, lengths = check_parity(model, str(tmp), tolerance=tolerance)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        model.train(was_training)
    return ExportReport(str(path), diff, lengths, time.perf_counter() - start, path.stat().st_size)


@contextlib.contextmanager
def _quiet_torch_logs():
    """The exporter logs chatter at WARNING (torch.onnx about torchvision ops, onnx_ir about the
    empty attribute lists of some ops); keep errors only."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _check_no_randomness(proto: onnx.ModelProto) -> None:
    random_ops = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
    found = sorted({n.op_type for n in proto.graph.node if n.op_type in random_ops})
    if found:
        raise ExportParityError(
            f"the exported graph draws random numbers ({', '.join(found)}): randomness must live in buffers",
            max_abs_diff=float("inf"),
            tolerance=0.0,
            case=(0, 0),
        )


def check_parity(
    model: torch.nn.Module, onnx_path: str, *, tolerance: float = TOLERANCE, threads: int | None = None
) -> tuple[float, tuple[int, ...]]:
    """Largest |torch - onnxruntime| over batch sizes 1 and 3 (padded) at ``check_lengths``."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # errors only: onnxruntime warns about benign buffer re-use
    opts.intra_op_num_threads = threads or torch.get_num_threads()
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
    cfg = model.config
    lengths = check_lengths(cfg.max_len)
    worst = 0.0
    for n in lengths:
        for batch in (1, 3):
            ids, mask = _example(cfg.vocab_size, batch, n, seed=n * 7 + batch, padded=True)
            with torch.no_grad():
                expected = model(ids, mask).numpy()
            got = session.run([OUTPUT], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
            if got.shape != expected.shape:
                raise ExportParityError(
                    f"onnxruntime output shape {got.shape} != torch {expected.shape} at batch {batch}, length {n}",
                    max_abs_diff=float("inf"),
                    tolerance=tolerance,
                    case=(batch, n),
                )
            if cfg.head == "lm":  # padded positions of an LM carry no prediction
                m = mask.numpy()
                got, expected = got[m], expected[m]
            diff = float(np.max(np.abs(got - expected))) if got.size else 0.0
            if not np.isfinite(diff) or diff > tolerance:
                raise ExportParityError(
                    f"ONNX export of {describe_config(cfg)} differs from torch by {diff:.3g} "
                    f"(tolerance {tolerance:g}) at batch {batch}, length {n}",
                    max_abs_diff=diff,
                    tolerance=tolerance,
                    case=(batch, n),
                )
            worst = max(worst, diff)
    log.info("parity ok: max |diff| %.2e over lengths %s", worst, lengths)
    return worst, lengths
