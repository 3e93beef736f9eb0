"""torch eager targets: ``torch-cpu`` and ``torch-cuda`` (CUDA events around synchronised runs)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from xsearch.errors import XSearchError
from xsearch.latency.device import host_fingerprint
from xsearch.latency.target import Runner, Target, check_length, check_mode, random_tokens, register_target


class TorchTarget(Target):
    """A torch model in eager mode, in inference mode."""

    engine = "torch"

    def fingerprint(self, threads: int | None) -> dict[str, Any]:
        return host_fingerprint(threads)

    @contextlib.contextmanager
    def runner(self, model_or_path, *, batch, seq_len, threads, shared_pool=False, mode="forward",
               context=None) -> Runner:  # fmt: skip
        import torch

        if not isinstance(model_or_path, torch.nn.Module):
            raise XSearchError(f"target {self.name!r} measures a torch model; got {model_or_path!r}")
        model = model_or_path
        cfg = model.config
        check_length(seq_len, cfg.max_len)
        check_mode(mode, context, cfg.to_dict())
        cuda = self.device == "cuda"
        old_threads = torch.get_num_threads()
        if threads is not None:
            torch.set_num_threads(threads)
        dev = torch.device(self.device)
        model = model.to(dev).eval()
        ids_np, mask_np = random_tokens(cfg.vocab_size, batch, seq_len)
        ids, mask = torch.from_numpy(ids_np).to(dev), torch.from_numpy(mask_np).to(dev)
        if mode == "forward":
            call = lambda: model(ids, mask)  # noqa: E731
        elif mode == "prefill":
            call = lambda: model.prefill(ids, mask)  # noqa: E731
        else:  # decode: every timed step starts from the same state of `context` tokens
            ctx_np, ctx_mask_np = random_tokens(cfg.vocab_size, batch, context)
            with torch.inference_mode():
                _, state = model.prefill(torch.from_numpy(ctx_np).to(dev), torch.from_numpy(ctx_mask_np).to(dev))
            nxt = ids[:, 0]
            call = lambda: model.step(nxt, state)  # noqa: E731

        def run() -> float:
            with torch.inference_mode():
                if cuda:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize()
                    start.record()
                    call()
                    end.record()
                    torch.cuda.synchronize()
                    return start.elapsed_time(end)
                t0 = time.perf_counter()
                call()
                return (time.perf_counter() - t0) * 1000.0

        try:
            yield run
        finally:
            torch.set_num_threads(old_threads)


@register_target
class TorchCpu(TorchTarget):
    name = "torch-cpu"
    device = "cpu"
    summary = "torch eager on this CPU"


@register_target
class TorchCuda(TorchTarget):
    name = "torch-cuda"
    device = "cuda"
    summary = "torch eager on a CUDA GPU (a CUDA build of torch), timed with CUDA events"

    def unavailable(self) -> str | None:
        import torch

        return None if torch.cuda.is_available() else "needs a CUDA GPU, and torch sees none on this machine"

    def fingerprint(self, threads: int | None) -> dict[str, Any]:
        import torch

        return {**host_fingerprint(threads), "gpu": torch.cuda.get_device_name(0)}
