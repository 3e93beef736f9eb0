"""Latency of a model on a target, as robust statistics over repeated runs.

Targets: ``ort-cpu`` (the deployment engine, default), ``torch-cpu``, ``torch-cuda`` and
``ort-cuda``. A CUDA target on a machine without CUDA raises a clear error; there is no
silent fallback to the CPU. ONNX files are measured without importing torch.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

TARGETS = ("ort-cpu", "torch-cpu", "torch-cuda", "ort-cuda")


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


def _version(package: str) -> str | None:
    try:
        return metadata.version(package).split("+")[0]
    except metadata.PackageNotFoundError:
        return None


def device_fingerprint(target: str, threads: int | None) -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, threads, GPU and library versions."""
    fp: dict[str, Any] = {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "threads": threads,
        "torch": _version("torch"),
        "onnxruntime": _version("onnxruntime"),
    }
    if target == "torch-cuda":
        import torch

        fp["gpu"] = torch.cuda.get_device_name(0)
    elif target == "ort-cuda":
        fp["gpu"] = _nvidia_gpu_name()
    return fp


def _nvidia_gpu_name() -> str | None:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except OSError:
        return None


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
    """Raise a clear error (never fall back to the CPU) when the target's CUDA is absent."""
    if target == "torch-cuda":
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(f"target {target!r} needs a CUDA GPU, and torch sees none on this machine")
    elif target == "ort-cuda":
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError(
                f"target {target!r} needs onnxruntime's CUDAExecutionProvider (the onnxruntime-gpu package and a "
                f"CUDA GPU); this onnxruntime offers {ort.get_available_providers()}"
            )


def measure(
    model_or_onnx_path,
    target: str = "ort-cpu",
    *,
    batch: int = 1,
    seq_len: int,
    threads: int | None = None,
    warmup: int = 3,
    repeats: int = 20,
) -> LatencyStats:
    """Time a forward pass on random token ids of shape ``(batch, seq_len)``.

    Args:
        model_or_onnx_path: an ``XSearchModel``, or the path of an exported ``.onnx`` file
            (``ort-*`` targets only). A torch model on an ``ort-*`` target is exported first.
        target: one of ``TARGETS``.
        threads: intra-op threads, set explicitly for either engine (default: the engine's own).
        warmup: untimed runs first; repeats: timed runs.

    Raises:
        ValueError: an unknown target, bad sizes, a length over the model's max_len.
        RuntimeError: a CUDA target without CUDA.
    """
    return measure_undisturbed(model_or_onnx_path, target, batch=batch, seq_len=seq_len, threads=threads,
                               warmup=warmup, repeats=repeats, patience=0.0)[0]  # fmt: skip


def measure_undisturbed(
    model_or_onnx_path,
    target: str = "ort-cpu",
    *,
    batch: int = 1,
    seq_len: int,
    threads: int | None = None,
    warmup: int = 3,
    repeats: int = 20,
    patience: float = 60.0,
) -> tuple[LatencyStats, int]:
    """``measure``, keeping only runs that other processes did not slow down, where it can tell.

    On a shared machine a run is slowed when this process's threads are ready to run but wait
    for a CPU held by another process; Linux counts that wait per thread (``schedstat``). Runs
    that waited more than 1% of their time (and 0.05 ms) are set aside, and timing goes on, for
    at most ``patience`` seconds, until ``repeats`` undisturbed runs are in. If time runs out,
    the least disturbed of the other runs fill up the ``repeats``.

    Returns:
        ``(stats, disturbed)``: ``disturbed`` is how many of the kept runs were slowed down (0
        when all were clean, or when the wait cannot be read, as off Linux or with ``patience=0``).
    """
    with contextlib.ExitStack() as stack:
        run = _open_runner(stack, model_or_onnx_path, target, batch, seq_len, threads, warmup, repeats)
        samples, disturbed = _timed_runs(run, warmup, repeats, patience)
    return summarize(samples, target, device_fingerprint(target, threads)), disturbed


def measure_interleaved(
    models: dict[str, Any],
    target: str = "ort-cpu",
    *,
    batch: int = 1,
    seq_len: int,
    threads: int | None = None,
    warmup: int = 3,
    repeats: int = 30,
    rounds: int = 3,
    targets: dict[str, str] | None = None,
) -> dict[str, LatencyStats]:
    """Latency of several models compared with each other: ``rounds`` alternating passes over the models,
    ``repeats`` timed runs per model in all (at most ``repeats`` rounds), so a drift in machine load
    hits every model alike.

    ``targets`` gives some models a target of their own (say a torch model on ``torch-cpu`` beside
    its ONNX file on ``ort-cpu``); the others run on ``target``. Each pass over a model starts with
    ``warmup`` untimed runs, which also absorb the previous model's idle worker threads.
    """
    if rounds <= 0:
        raise ValueError(f"rounds must be > 0, got {rounds}")
    targets = targets or {}
    unknown = sorted(set(targets) - set(models))
    if unknown:
        raise ValueError(f"targets names models that are not measured: {', '.join(unknown)}")
    target_of = {name: targets.get(name, target) for name in models}
    rounds = min(rounds, max(repeats, 1))  # a round times at least one run of each model
    per_round = max(1, -(-repeats // rounds))
    pooled: dict[str, list[float]] = {name: [] for name in models}
    with contextlib.ExitStack() as stack:
        runs = {name: _open_runner(stack, m, target_of[name], batch, seq_len, threads, warmup, repeats)
                for name, m in models.items()}  # fmt: skip
        for _ in range(rounds):
            for name, run in runs.items():
                pooled[name] += _timed_runs(run, warmup, per_round, 0.0)[0]
    return {
        name: summarize(samples, target_of[name], device_fingerprint(target_of[name], threads))
        for name, samples in pooled.items()
    }


def _open_runner(stack: contextlib.ExitStack, model_or_onnx_path, target, batch, seq_len, threads, warmup, repeats):
    """Check the arguments and open a ``run() -> ms`` for the model on the target (closed with ``stack``)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; valid: {', '.join(TARGETS)}")
    if seq_len <= 0 or batch <= 0 or repeats <= 0 or warmup < 0:
        raise ValueError(
            f"need seq_len, batch, repeats > 0 and warmup >= 0; got {seq_len}, {batch}, {repeats}, {warmup}"
        )
    require_cuda(target)
    if target.startswith("ort"):
        path = model_or_onnx_path
        if not isinstance(path, (str, os.PathLike)):
            from xsearch.export.onnx_export import to_onnx

            path = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "model.onnx"
            to_onnx(model_or_onnx_path, path, check=False)
        return stack.enter_context(_ort_runner(Path(path), target, batch, seq_len, threads))
    if isinstance(model_or_onnx_path, (str, os.PathLike)):
        raise ValueError(f"target {target!r} measures a torch model; got a path ({model_or_onnx_path})")
    return stack.enter_context(_torch_runner(model_or_onnx_path, target, batch, seq_len, threads))


def run_queue_wait_ns() -> int | None:
    """Nanoseconds this process's threads have spent ready to run but waiting for a CPU (Linux), or None."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    total = 0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as f:
                total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # a thread that has just exited
    return total


def _timed_runs(run: Callable[[], float], warmup: int, repeats: int, patience: float) -> tuple[list[float], int]:
    """``repeats`` timings of ``run()`` (which returns milliseconds) and how many of them were disturbed."""
    for _ in range(warmup):
        run()
    if patience <= 0 or run_queue_wait_ns() is None:
        return [run() for _ in range(repeats)], 0
    deadline = time.perf_counter() + patience
    clean: list[float] = []
    slowed: list[tuple[int, float]] = []  # (wait ns, ms)
    while len(clean) < repeats and (time.perf_counter() < deadline or len(clean) + len(slowed) < repeats):
        before = run_queue_wait_ns() or 0
        ms = run()
        waited = max(0, (run_queue_wait_ns() or 0) - before)
        if waited <= max(50_000, 0.01 * ms * 1e6):
            clean.append(ms)
        else:
            slowed.append((waited, ms))
            time.sleep(min(1.0, max(0.05, 2e-3 * ms)))  # back off: no point competing for a busy CPU
    missing = repeats - len(clean)
    return clean + [ms for _, ms in sorted(slowed)[:missing]], max(0, missing)


def _random_ids(vocab: int, batch: int, seq_len: int):
    import numpy as np

    rng = np.random.default_rng(0)
    ids = rng.integers(1, vocab, size=(batch, seq_len), dtype=np.int64)
    return ids, np.ones((batch, seq_len), dtype=np.bool_)


@contextlib.contextmanager
def _ort_runner(path: Path, target, batch, seq_len, threads, shared_pool=False) -> Iterator[Callable[[], float]]:
    """``shared_pool``: run on the process-wide thread pool (set up by the caller) instead of one of its own."""
    import onnxruntime as ort

    from xsearch.export.metadata import INPUTS, OUTPUT
    from xsearch.export.predictor import read_metadata

    cfg = read_metadata(path)["config"]
    if seq_len > cfg["max_len"]:
        raise ValueError(f"seq_len={seq_len} exceeds the model's max_len={cfg['max_len']}")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # errors only: no onnxruntime chatter amid the timings
    if shared_pool:
        opts.use_per_session_threads = False
    else:
        if threads is not None:
            opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    providers = ["CUDAExecutionProvider"] if target == "ort-cuda" else ["CPUExecutionProvider"]
    session = ort.InferenceSession(str(path), opts, providers=providers)
    ids, mask = _random_ids(cfg["vocab_size"], batch, seq_len)
    feed = {INPUTS[0]: ids, INPUTS[1]: mask}

    def run() -> float:  # run() returns host arrays, so each sample includes the device sync
        t0 = time.perf_counter()
        session.run([OUTPUT], feed)
        return (time.perf_counter() - t0) * 1000.0

    yield run


@contextlib.contextmanager
def _torch_runner(model, target, batch, seq_len, threads) -> Iterator[Callable[[], float]]:
    import torch

    cfg = model.config
    if seq_len > cfg.max_len:
        raise ValueError(f"seq_len={seq_len} exceeds the model's max_len={cfg.max_len}")
    cuda = target == "torch-cuda"
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    dev = torch.device("cuda" if cuda else "cpu")
    model = model.to(dev).eval()
    ids_np, mask_np = _random_ids(cfg.vocab_size, batch, seq_len)
    ids, mask = torch.from_numpy(ids_np).to(dev), torch.from_numpy(mask_np).to(dev)

    def run() -> float:
        with torch.inference_mode():
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                model(ids, mask)
                end.record()
                torch.cuda.synchronize()
                return start.elapsed_time(end)
            t0 = time.perf_counter()
            model(ids, mask)
            return (time.perf_counter() - t0) * 1000.0

    try:
        yield run
    finally:
        torch.set_num_threads(old_threads)
