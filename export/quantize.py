"""``quantize_onnx``: int8 (dynamic or static) and fp16 versions of an exported model."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx

from xsearch.errors import MissingPathError, XSearchError
from xsearch.export.metadata import INPUTS, KEY_DECODER, step_path_for

log = logging.getLogger("xsearch.export")
QUANTIZE_MODES = ("dynamic-int8", "static-int8", "fp16")
# QUANTIZE_NOTE: dynamic int8 quantizes weights to 7 bits (``reduce_range``). On a CPU without VNNI (AVX2
# only) onnxruntime's u8 x s8 integer MatMul adds pairs of products in saturating int16, which full-range
# int8 weights overflow: measured on such a CPU (a decoder's prefill logits, d_model 32), an error of 23% of
# the logits' range with 8-bit weights and 0.9% with 7-bit ones. A file is deployed wherever it is copied,
# so it is made safe for either kind of CPU; with VNNI the 7th bit buys no speed and costs little accuracy.


def _copy_metadata(src: onnx.ModelProto, dst_path: Path, mode: str) -> None:
    dst = onnx.load(str(dst_path))
    have = {e.key for e in dst.metadata_props}
    for e in src.metadata_props:
        if e.key not in have:
            dst.metadata_props.add(key=e.key, value=e.value)
    dst.metadata_props.add(key="xsearch_quantization", value=mode)
    onnx.save_model(dst, str(dst_path))


def _decoder_info(proto: onnx.ModelProto) -> dict | None:
    raw = {e.key: e.value for e in proto.metadata_props}.get(KEY_DECODER)
    return None if raw is None else json.loads(raw)


def _quantize_decoder(src: Path, dst: Path, mode: str, decoder: dict) -> Path:
    """Both graphs of a decoder export, each renamed after ``dst`` in the other's metadata; the
    prefill file is written last, so a file that exists names a step file that exists too."""
    if mode == "static-int8":
        raise XSearchError("static-int8 needs calibration inputs a decoder's step graph does not have; use "
                           "dynamic-int8")  # fmt: skip
    if decoder["role"] != "prefill":
        raise XSearchError(f"{src} is a decoder's step graph; quantize its prefill file {decoder['prefill_file']}")
    step_src, step_dst = src.with_name(decoder["step_file"]), step_path_for(dst)
    if not step_src.is_file():
        raise MissingPathError(f"no such ONNX file: {step_src} (the step graph {src} names)")
    names = {**decoder, "prefill_file": dst.name, "step_file": step_dst.name}
    for one_src, one_dst, role in ((step_src, step_dst, "step"), (src, dst, "prefill")):
        tmp = one_dst.with_name(f".{one_dst.name}.q-{os.getpid()}.onnx")
        try:
            quantize_onnx(_without_decoder_info(one_src, tmp), tmp, mode)
            proto = onnx.load(str(tmp))
            proto.metadata_props.add(key=KEY_DECODER, value=json.dumps({**names, "role": role}, sort_keys=True))
            onnx.save_model(proto, str(tmp))
            os.replace(tmp, one_dst)
        finally:
            tmp.unlink(missing_ok=True)
    return dst


def _without_decoder_info(src: Path, dst: Path) -> Path:
    """A copy of ``src`` at ``dst`` without the decoder metadata (so it quantizes as one graph)."""
    proto = onnx.load(str(src))
    keep = [(e.key, e.value) for e in proto.metadata_props if e.key != KEY_DECODER]
    del proto.metadata_props[:]
    for key, value in keep:
        proto.metadata_props.add(key=key, value=value)
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(proto, str(dst))
    return dst


class _Calibration:
    """onnxruntime CalibrationDataReader over ``(input_ids, mask)`` batches."""

    def __init__(self, batches: Iterable[tuple[np.ndarray, np.ndarray]]):
        self._it = iter(batches)

    def get_next(self):
        item = next(self._it, None)
        if item is None:
            return None
        ids, mask = item
        return {INPUTS[0]: np.asarray(ids, dtype=np.int64), INPUTS[1]: np.asarray(mask, dtype=np.bool_)}


def calibration_batches(task, *, batches: int = 8, batch_size: int = 8) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(input_ids, mask)`` numpy pairs from a task's train split, for ``static-int8``."""
    return [
        (ids.numpy(), mask.numpy())
        for ids, mask, _ in task.batches("train", batch_size, shuffle=True, max_batches=batches)
    ]


def quantize_onnx(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    mode: str = "dynamic-int8",
    *,
    calibration: Iterable[tuple[np.ndarray, np.ndarray]] | None = None,
) -> Path:
    """Write a quantized copy of ``src`` to ``dst`` (metadata kept; written atomically).

    Modes:
        ``dynamic-int8``: int8 weights (QInt8) for the MatMuls, activations quantized on the fly;
            the fastest on CPU (see FIELD_NOTES).
        ``static-int8``: QDQ int8 with activation ranges calibrated on ``calibration`` batches
            (``(input_ids, mask)`` numpy pairs, e.g. from the task's train split).
        ``fp16``: float16 weights and compute, float32 inputs/outputs (for GPUs).
    """
    from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

    if mode not in QUANTIZE_MODES:
        raise XSearchError(f"unknown quantization mode {mode!r}; valid: {', '.join(QUANTIZE_MODES)}")
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise MissingPathError(f"no such ONNX file: {src}")
    original = onnx.load(str(src))
    decoder = _decoder_info(original)
    if decoder is not None:
        return _quantize_decoder(src, dst, mode, decoder)
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory() as work:
            pre = Path(work) / "pre.onnx"
            if mode == "fp16":
                from onnxruntime.transformers.float16 import convert_float_to_float16

                half = convert_float_to_float16(original, keep_io_types=True)
                onnx.save_model(half, str(tmp))
            else:
                try:
                    quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
                except Exception as e:  # pre-processing is an optimisation; quantize the original instead
                    log.warning("quant_pre_process failed (%s); quantizing without it", e)
                    pre = src
                if mode == "dynamic-int8":
                    quantize_dynamic(
                        str(pre),
                        str(tmp),
                        weight_type=QuantType.QInt8,
                        reduce_range=True,  # 7-bit weights (QUANTIZE_NOTE above)
                        op_types_to_quantize=["MatMul"],
                        # onnx's shape inference does not type the outputs of onnxruntime's own
                        # operators (MultiHeadAttention); every tensor of an exported model is float32
                        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
                    )
                else:
                    from onnxruntime.quantization import QuantFormat, quantize_static

                    if calibration is None:
                        raise XSearchError("static-int8 needs calibration batches (calibration=[(ids, mask), ...])")
                    quantize_static(
                        str(pre),
                        str(tmp),
                        _Calibration(calibration),
                        quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8,
                        op_types_to_quantize=["MatMul"],
                    )
        _copy_metadata(original, tmp, mode)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst
