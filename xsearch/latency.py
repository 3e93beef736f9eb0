"""Latency of a model on a target, as robust statistics over repeated runs."""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

TARGETS = ("torch-cpu", "torch-cuda")


@dataclass(frozen=True)
class LatencyStats:
    """Forward latency over ``repeats`` timed runs (after warm-up), in milliseconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    mean_ms: float
    std_ms: float
    repeats: int
    target: str
    device: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_fingerprint(target: str, threads: int | None) -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, threads, GPU and library versions."""
    import torch

    fp: dict[str, Any] = {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "threads": threads,
        "torch": torch.__version__.split("+")[0],
    }
    if target.endswith("cuda"):
        fp["gpu"] = torch.cuda.get_device_name(0)
    return fp


def summarize(samples_ms: list[float], target: str, device: dict[str, Any]) -> LatencyStats:
    """Order statistics of the timed samples."""
    s = sorted(samples_ms)

    def q(p: float) -> float:  # nearest-rank quantile, so p10 <= median <= p90 always holds
        return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]

    return LatencyStats(
        median_ms=statistics.median(s),
        p10_ms=q(0.10),
        p90_ms=q(0.90),
        mean_ms=statistics.fmean(s),
        std_ms=statistics.pstdev(s),
        repeats=len(s),
        target=target,
        device=device,
    )


def require_cuda(target: str) -> None:
    """Raise a clear error (never fall back to the CPU) when CUDA is absent."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"target {target!r} needs a CUDA GPU, and torch sees none on this machine")


def measure(
    model,
    target: str = "torch-cpu",
    *,
    batch: int = 1,
    seq_len: int,
    threads: int | None = None,
    warmup: int = 3,
    repeats: int = 20,
) -> LatencyStats:
    """Time ``model``'s forward on random token ids of shape ``(batch, seq_len)``.

    Args:
        model: an ``XSearchModel``.
        target: ``"torch-cpu"`` or ``"torch-cuda"``.
        threads: intra-op threads (default: torch's current setting), set explicitly.
        warmup: untimed runs first; repeats: timed runs.
    """
    import torch

    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; valid: {', '.join(TARGETS)}")
    if seq_len <= 0 or batch <= 0 or repeats <= 0 or warmup < 0:
        raise ValueError(
            f"need seq_len, batch, repeats > 0 and warmup >= 0 (got {seq_len}, {batch}, {repeats}, {warmup})"
        )
    cfg = model.config
    if seq_len > cfg.max_len:
        raise ValueError(f"seq_len={seq_len} exceeds the model's max_len={cfg.max_len}")
    cuda = target == "torch-cuda"
    if cuda:
        require_cuda(target)
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    dev = torch.device("cuda" if cuda else "cpu")
    model = model.to(dev).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, cfg.vocab_size, (batch, seq_len), generator=g).to(dev)
    mask = torch.ones(batch, seq_len, dtype=torch.bool, device=dev)
    samples = []
    try:
        with torch.inference_mode():
            for _ in range(warmup):
                model(ids, mask)
            for _ in range(repeats):
                if cuda:
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    model(ids, mask)
                    end.record()
                    torch.cuda.synchronize()
                    samples.append(start.elapsed_time(end))
                else:
                    t0 = time.perf_counter()
                    model(ids, mask)
                    samples.append((time.perf_counter() - t0) * 1000.0)
    finally:
        torch.set_num_threads(old_threads)
    return summarize(samples, target, device_fingerprint(target, threads or old_threads))
