"""Latency of many models at once, on one scale: round-robin rounds with the machine's speed divided out.

On a shared virtual machine the speed of the CPU moves in steps, by up to 2x, for seconds to
minutes at a time, with nothing to see from inside (no steal time, no other process). A model
timed alone gets whatever speed the machine had at that moment; two timings of one model minutes
apart differ by 15-20 % on average here. ``time_in_rounds`` times every model in ``rounds``
passes (a fresh shuffled order each), ``per_round`` runs each after ``warmup``, and fits
``round median[model, round] = latency[model] x speed[round]`` (a median polish on ratios): each
round's speed is the median over the models of how much slower they ran in it, and a model's
latency is the median of its round timings divided by those speeds. Speeds are scaled so that
their median is 1, so latencies read as milliseconds at the typical speed of the session.

onnxruntime models are timed in a fresh child process (no torch loaded) whose sessions all share
one intra-op thread pool: with a pool per session, the pool of the model timed just before keeps
spinning on a core while the next one runs, and which model follows which then decides its time
(mean test-retest deviation of 41 architectures: 14.6 % with a pool per session, 4-5 % shared).
torch models run in this process, on torch's own (single) pool.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xsearch.errors import XSearchError
from xsearch.latency.stats import LatencyStats, summarize
from xsearch.latency.target import Target, get_target
from xsearch.latency.timing import check_sizes, timed_runs

_POLISH_ITERATIONS = 10


@dataclass(frozen=True)
class RoundTimings:
    """What ``time_in_rounds`` found.

    Attributes:
        stats: per model, the statistics of its timings divided by their round's speed.
        round_speed: per round, how slow the machine ran relative to the median round
            (1.3: every model took about 30 % longer than typical).
    """

    stats: dict[str, LatencyStats]
    round_speed: list[float]


def median_polish(samples: dict[str, list[list[float]]]) -> tuple[dict[str, list[float]], list[float]]:
    """Divide each round's machine speed out of the timings.

    Args:
        samples: per model, per round, the timed runs (every model has the same number of rounds).

    Returns:
        ``(normalized, speed)``: each model's runs divided by the speed of their round, pooled
        over rounds, and the per-round speeds (median 1).
    """
    names = list(samples)
    if not names:
        return {}, []
    n_rounds = len(samples[names[0]])
    if any(len(samples[n]) != n_rounds or not all(samples[n]) for n in names):
        raise ValueError("median_polish needs every model timed at least once in every round")
    med = {n: [statistics.median(runs) for runs in samples[n]] for n in names}
    label = {n: statistics.median(med[n]) for n in names}
    speed = [1.0] * n_rounds
    for _ in range(_POLISH_ITERATIONS):
        speed = [statistics.median(med[n][r] / label[n] for n in names) for r in range(n_rounds)]
        typical = statistics.median(speed)
        speed = [s / typical for s in speed]
        label = {n: statistics.median(m / s for m, s in zip(med[n], speed)) for n in names}
    normalized = {n: [x / speed[r] for r, runs in enumerate(samples[n]) for x in runs] for n in names}
    return normalized, speed


def round_robin(runs: dict[str, Any], *, warmup: int, per_round: int, rounds: int, seed: int = 0):
    """Time ``run()`` (milliseconds) of every model in ``rounds`` shuffled passes: ``{name: [[ms, ...], ...]}``."""
    samples: dict[str, list[list[float]]] = {name: [] for name in runs}
    for r in range(rounds):
        order = list(runs)
        random.Random(seed * 100_003 + r).shuffle(order)
        for name in order:
            samples[name].append(timed_runs(runs[name], warmup, per_round, 0.0)[0])
    return samples


def time_in_rounds(
    models: dict[str, Any],
    target: str = "ort-cpu",
    *,
    batch: int = 1,
    seq_len: int,
    threads: int | None = None,
    warmup: int = 2,
    per_round: int = 3,
    rounds: int = 10,
    seed: int = 0,
) -> RoundTimings:
    """Time every model in ``rounds`` round-robin passes and divide each round's speed out.

    Args:
        models: name -> ``XSearchModel`` or ``.onnx`` path (``ort-*`` targets export torch models
            first); all on ``target``.
        warmup: untimed runs before each model's turn in a round; per_round: timed runs per turn.

    Raises:
        ValueError: no models, an unknown target, bad counts or sizes (naming the value).
        RuntimeError: a CUDA target without CUDA, or the timing process failed (with its error).
    """
    if not models:
        raise XSearchError("time_in_rounds needs at least one model")
    t = get_target(target)
    check_sizes(rounds=rounds, per_round=per_round, warmup=warmup, seq_len=seq_len, batch=batch)
    t.require()
    plan = {"warmup": warmup, "per_round": per_round, "rounds": rounds, "seed": seed}
    with tempfile.TemporaryDirectory() as tmp:
        prepared = {name: _prepared(t, m, Path(tmp) / f"{i}.onnx") for i, (name, m) in enumerate(models.items())}
        if t.times_in_child:
            spec = {"paths": {n: str(p) for n, p in prepared.items()}, "target": t.name, "batch": batch,
                    "seq_len": seq_len, "threads": threads, **plan}  # fmt: skip
            samples = _time_in_child(spec)
        else:
            with contextlib.ExitStack() as stack:
                runs = {name: stack.enter_context(t.runner(m, batch=batch, seq_len=seq_len, threads=threads))
                        for name, m in prepared.items()}  # fmt: skip
                samples = round_robin(runs, **plan)
    normalized, speed = median_polish(samples)
    device = t.fingerprint(threads)
    return RoundTimings({n: summarize(normalized[n], t.name, device) for n in models}, speed)


def _prepared(target: Target, model_or_path, path: Path):
    """What ``target`` times for one model: an ONNX file given as a path is checked, a torch model prepared."""
    if isinstance(model_or_path, (str, os.PathLike)):
        if not target.runs_exported:
            raise XSearchError(f"target {target.name!r} measures torch models; got a path ({model_or_path})")
        if not Path(model_or_path).is_file():
            raise XSearchError(f"no ONNX file at {model_or_path}")
        return Path(model_or_path)
    return target.prepare(model_or_path, path)


def _time_in_child(spec: dict[str, Any]) -> dict[str, list[list[float]]]:
    """Run ``python -m xsearch.latency.rounds`` on ``spec`` (JSON on stdin) and read its timings."""
    proc = subprocess.run([sys.executable, "-m", "xsearch.latency.rounds"], input=json.dumps(spec),
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"timing process failed (exit {proc.returncode}): {last}")
    return json.loads(proc.stdout)["samples"]


def _child_main() -> None:
    """The child: one shared onnxruntime thread pool, every model's session open, timed in rounds."""
    import onnxruntime.capi._pybind_state as ort_state

    spec = json.load(sys.stdin)
    target = get_target(spec["target"])
    # Before any session exists: the process-wide pool every session below runs on (0: onnxruntime's default).
    ort_state.set_global_thread_pool_sizes(spec["threads"] or 0, 1)
    with contextlib.ExitStack() as stack:
        runs = {
            name: stack.enter_context(
                target.runner(Path(path), batch=spec["batch"], seq_len=spec["seq_len"], threads=None, shared_pool=True)
            )
            for name, path in spec["paths"].items()
        }
        samples = round_robin(runs, warmup=spec["warmup"], per_round=spec["per_round"], rounds=spec["rounds"],
                              seed=spec["seed"])  # fmt: skip
    json.dump({"samples": samples}, sys.stdout)


if __name__ == "__main__":
    _child_main()
