"""onnxruntime targets: ``ort-cpu`` (the deployment engine, the default) and ``ort-cuda``.

A torch model is exported to ONNX first; an exported file is timed as it is. ONNX files are
timed without importing torch.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from xsearch.latency.device import host_fingerprint, nvidia_gpu_name
from xsearch.latency.target import Runner, Target, check_length, check_mode, random_tokens, register_target


class OnnxRuntimeTarget(Target):
    """onnxruntime with one execution provider."""

    engine = "onnxruntime"
    runs_exported = True
    times_in_child = True
    provider = "CPUExecutionProvider"

    def fingerprint(self, threads: int | None) -> dict[str, Any]:
        return host_fingerprint(threads)

    @contextlib.contextmanager
    def runner(self, model_or_path, *, batch, seq_len, threads, shared_pool=False, mode="forward",
               context=None) -> Runner:  # fmt: skip
        import onnxruntime as ort

        from xsearch.export.metadata import INPUTS, OUTPUT
        from xsearch.export.predictor import read_metadata

        cfg = read_metadata(Path(model_or_path))["config"]
        check_length(seq_len, cfg["max_len"])
        check_mode(mode, context, cfg)
        ids, mask = random_tokens(cfg["vocab_size"], batch, seq_len)
        if mode != "forward":
            yield self._decoder_runner(Path(model_or_path), ids, mask, threads, mode, context)
            return
        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # errors only: no onnxruntime chatter amid the timings
        if shared_pool:
            opts.use_per_session_threads = False
        else:
            if threads is not None:
                opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        session = ort.InferenceSession(str(model_or_path), opts, providers=[self.provider])
        feed = {INPUTS[0]: ids, INPUTS[1]: mask}

        def run() -> float:  # run() returns host arrays, so each sample includes the device sync
            t0 = time.perf_counter()
            session.run([OUTPUT], feed)
            return (time.perf_counter() - t0) * 1000.0

        yield run

    def _decoder_runner(self, path: Path, ids, mask, threads, mode: str, context: int | None):
        """``run()`` of a decoder export's prefill graph, or of its step graph from a fixed state."""
        from xsearch.export.generator import Generator

        gen = Generator(path, threads=threads, providers=[self.provider])
        if mode == "prefill":
            call = lambda: gen.prefill(ids, mask)  # noqa: E731
        else:
            ctx_ids, ctx_mask = random_tokens(gen.vocab_size, ids.shape[0], context)
            _, state = gen.prefill(ctx_ids, ctx_mask)
            nxt = ids[:, 0]
            call = lambda: gen.step(nxt, state)  # noqa: E731

        def run() -> float:
            t0 = time.perf_counter()
            call()
            return (time.perf_counter() - t0) * 1000.0

        return run


@register_target
class OrtCpu(OnnxRuntimeTarget):
    name = "ort-cpu"
    device = "cpu"
    summary = "onnxruntime on this CPU (the engine you deploy on)"


@register_target
class OrtCuda(OnnxRuntimeTarget):
    name = "ort-cuda"
    device = "cuda"
    summary = "onnxruntime's CUDA execution provider (onnxruntime-gpu and an NVIDIA GPU)"
    provider = "CUDAExecutionProvider"

    def unavailable(self) -> str | None:
        import onnxruntime as ort

        have = ort.get_available_providers()
        if self.provider in have:
            return None
        return (f"needs onnxruntime's CUDAExecutionProvider (the onnxruntime-gpu package and a CUDA GPU); "
                f"this onnxruntime offers {have}")  # fmt: skip

    def fingerprint(self, threads: int | None) -> dict[str, Any]:
        return {**host_fingerprint(threads), "gpu": nvidia_gpu_name()}
