"""Latency of a model on a target, as robust statistics over repeated runs.

``measure`` times one model; ``measure_undisturbed`` sets aside runs that other processes slowed
down; ``measure_interleaved`` compares several models in alternating rounds, so a drift in the
machine's load hits them alike. A target this machine cannot run raises ``UnavailableError``:
there is no silent fallback to another device. ONNX files are measured without importing torch.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xsearch.errors import XSearchError
from xsearch.latency.stats import LatencyStats, summarize
from xsearch.latency.target import LATENCY_MODES, Target, get_target, list_targets
from xsearch.settings import Settings, option


def device_fingerprint(target: str | Target, threads: int | None) -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, threads, GPU and library versions."""
    return get_target(target).fingerprint(threads)


def check_sizes(**sizes: int) -> None:
    """Each named size must be >= 1 (``warmup`` >= 0); the error names the first that is not."""
    for name, value in sizes.items():
        low = 0 if name == "warmup" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise XSearchError(f"{name} must be an integer >= {low}, got {value!r}")


def measure(
    model_or_onnx_path,
    target: str | Target = "ort-cpu",
    *,
    batch: int = 1,
    seq_len: int,
    threads: int | None = None,
    warmup: int = 3,
    repeats: int = 20,
    mode: str = "forward",
    context: int | None = None,
) -> LatencyStats:
    """Time a forward pass on random token ids of shape ``(batch, seq_len)`` (or, by ``mode``, a
    decoder's prefill of them, or one decode step with ``context`` tokens in the state).

    Args:
        model_or_onnx_path: an ``XSearchModel``, or the path of an exported ``.onnx`` file (for
            targets that run exported files; a torch model is exported first there).
        target: a name from ``list_targets()`` (or a ``Target``).
        threads: intra-op threads, set explicitly for either engine (default: the engine's own).
        warmup: untimed runs first; repeats: timed runs.

    Raises:
        XSearchError: an unknown target, bad sizes, a length over the model's max_len.
        UnavailableError: a target this machine cannot run (CUDA without CUDA).
    """
    return measure_undisturbed(model_or_onnx_path, target, batch=batch, seq_len=seq_len, threads=threads,
                               warmup=warmup, repeats=repeats, patience=0.0, mode=mode,
                               context=context)[0]  # fmt: skip


def measure_undisturbed(
    model_or_onnx_path,
    target: str | Target = "ort-cpu",
    *,
    batch: int = 1,
    seq_len: int,
    threads: int | None = None,
    warmup: int = 3,
    repeats: int = 20,
    patience: float = 60.0,
    mode: str = "forward",
    context: int | None = None,
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
    t = get_target(target)
    with contextlib.ExitStack() as stack:
        run = open_runner(stack, model_or_onnx_path, t, batch, seq_len, threads, warmup, repeats, mode, context)
        samples, disturbed = timed_runs(run, warmup, repeats, patience)
    return summarize(samples, t.name, t.fingerprint(threads)), disturbed


def measure_interleaved(
    models: dict[str, Any],
    target: str | Target = "ort-cpu",
    *,
    batch: int = 1,
    seq_len: int,
    threads: int | None = None,
    warmup: int = 3,
    repeats: int = 30,
    rounds: int = 3,
    targets: dict[str, str | Target] | None = None,
    mode: str = "forward",
    context: int | None = None,
) -> dict[str, LatencyStats]:
    """Latency of several models compared with each other: ``rounds`` alternating passes over the models,
    ``repeats`` timed runs per model in all (at most ``repeats`` rounds), so a drift in machine load
    hits every model alike.

    ``targets`` gives some models a target of their own (say a torch model on ``torch-cpu`` beside
    its ONNX file on ``ort-cpu``); the others run on ``target``. Each pass over a model starts with
    ``warmup`` untimed runs, which also absorb the previous model's idle worker threads.
    """
    check_sizes(rounds=rounds)
    targets = targets or {}
    unknown = sorted(set(targets) - set(models))
    if unknown:
        raise XSearchError(f"targets names models that are not measured: {', '.join(unknown)}")
    target_of = {name: get_target(targets.get(name, target)) for name in models}
    rounds = min(rounds, max(repeats, 1))  # a round times at least one run of each model
    per_round = max(1, -(-repeats // rounds))
    pooled: dict[str, list[float]] = {name: [] for name in models}
    with contextlib.ExitStack() as stack:
        runs = {name: open_runner(stack, m, target_of[name], batch, seq_len, threads, warmup, repeats, mode, context)
                for name, m in models.items()}  # fmt: skip
        for _ in range(rounds):
            for name, run in runs.items():
                pooled[name] += timed_runs(run, warmup, per_round, 0.0)[0]
    return {
        name: summarize(samples, target_of[name].name, target_of[name].fingerprint(threads))
        for name, samples in pooled.items()
    }


def open_runner(
    stack: contextlib.ExitStack,
    model_or_onnx_path,
    target: Target,
    batch,
    seq_len,
    threads,
    warmup,
    repeats,
    mode: str = "forward",
    context: int | None = None,
) -> Callable[[], float]:
    """Check the arguments and open a ``run() -> ms`` for the model on the target (closed with ``stack``)."""
    check_sizes(seq_len=seq_len, batch=batch, repeats=repeats, warmup=warmup)
    if threads is not None:
        check_sizes(threads=threads)
    target.require()
    is_path = isinstance(model_or_onnx_path, (str, os.PathLike))
    if target.runs_exported:
        path = model_or_onnx_path
        if not is_path:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            path = target.prepare(model_or_onnx_path, folder / "m.onnx", mode)
        model_or_onnx_path = Path(path)
    elif is_path:
        raise XSearchError(f"target {target.name!r} measures a torch model; got a path ({model_or_onnx_path})")
    return stack.enter_context(target.runner(model_or_onnx_path, batch=batch, seq_len=seq_len, threads=threads,
                                             mode=mode, context=context))  # fmt: skip


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


def timed_runs(run: Callable[[], float], warmup: int, repeats: int, patience: float) -> tuple[list[float], int]:
    """``repeats`` timings of ``run()`` (which returns milliseconds) and how many of them were disturbed.

    With ``patience`` > 0 (seconds), runs that waited for a CPU are set aside as ``measure_undisturbed``
    describes; with 0, every run counts.
    """
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


@dataclass
class MeasureSettings(Settings):
    """How one latency is measured (``xsearch bench``)."""

    seq_len: int = option(help="sequence length to time at", gt=0)
    target: str = option("ort-cpu", "where to time", choices=list_targets)
    batch: int = option(1, "sequences per call", ge=1)
    threads: int | None = option(None, "intra-op threads (default: the engine's own)", gt=0)
    repeats: int = option(20, "timed runs", ge=1)
    warmup: int = option(3, "untimed runs first", ge=0)
    latency_mode: str = option(
        "forward", "forward: a whole sequence; prefill: a decoder's prompt of seq_len tokens; decode: one "
        "decoder step with --context tokens in the state", choices=LATENCY_MODES,
    )  # fmt: skip
    context: int | None = option(None, "decode mode: tokens already in the state (default: seq_len - 1)", gt=0)

    @property
    def decode_context(self) -> int | None:
        """The context a decode step is timed at (None outside decode mode)."""
        return (self.context or max(1, self.seq_len - 1)) if self.latency_mode == "decode" else None
