"""The ``Target`` interface and its registry: where latency is measured.

A target is an engine on a device (``ort-cpu``: onnxruntime on this CPU, ``torch-cuda``: torch
eager on a CUDA GPU, ...). Each kind of target is one module in ``xsearch/latency/targets/``,
found and imported on first use, so a new target (a remote device, another execution provider)
is one file: a ``Target`` subclass decorated with ``@register_target``. Nothing outside
``xsearch.latency`` looks at a target's name: callers ask the target (``runs_exported``,
``deployment()``, ``eager()``, ...).

A target that this machine cannot run (CUDA without a GPU) raises ``UnavailableError`` with the
reason as soon as it is asked to measure; it never falls back to another device.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from xsearch.errors import UnavailableError, XSearchError

_REGISTRY: dict[str, type[Target]] = {}
_LOADED = False


class Target(ABC):
    """Where a model is timed.

    Class attributes:
        name: the registry name (``ort-cpu``).
        engine: ``"onnxruntime"`` or ``"torch"``: what runs the model.
        device: ``"cpu"`` or ``"cuda"``.
        summary: one line for help texts.
        runs_exported: whether the target times ONNX files (a torch model is exported first).
        times_in_child: whether ``time_in_rounds`` times this target's models in a child process
            whose sessions share one thread pool (see ``xsearch.latency.rounds``).
    """

    name: ClassVar[str]
    engine: ClassVar[str]
    device: ClassVar[str]
    summary: ClassVar[str] = ""
    runs_exported: ClassVar[bool] = False
    times_in_child: ClassVar[bool] = False

    def unavailable(self) -> str | None:
        """Why this machine cannot run the target (None when it can)."""
        return None

    def require(self) -> None:
        """Raise ``UnavailableError`` naming the target and the reason when this machine cannot run it."""
        reason = self.unavailable()
        if reason is not None:
            raise UnavailableError(f"target {self.name!r} {reason}")

    @abstractmethod
    def fingerprint(self, threads: int | None) -> dict[str, Any]:
        """What numbers measured here were measured on (CPU, GPU, threads, library versions)."""

    @abstractmethod
    def runner(
        self,
        model_or_path: Any,
        *,
        batch: int,
        seq_len: int,
        threads: int | None,
        shared_pool: bool = False,
        mode: str = "forward",
        context: int | None = None,
    ) -> contextlib.AbstractContextManager[Callable[[], float]]:
        """A context manager yielding ``run() -> milliseconds`` of one call on random tokens: a forward
        pass, a prefill of ``seq_len`` tokens, or one decode step after ``context`` tokens (``mode``,
        see ``LATENCY_MODES``; the state a step starts from is built once, untimed).

        Args:
            model_or_path: what ``prepare`` returns (an ONNX path for ``runs_exported`` targets, the
                torch model otherwise).
            shared_pool: run on a process-wide thread pool set up by the caller (``times_in_child``).
        """

    def prepare(self, model: Any, path: Path, mode: str = "forward") -> Any:
        """What this target times for the torch ``model``: the model itself, or its ONNX file at ``path``
        (a decoder export, prefill and step, for the decoder modes)."""
        if not self.runs_exported:
            return model
        from xsearch.export.onnx_export import to_onnx

        to_onnx(model, path, check=False, decoder=mode != "forward")
        return path

    def deployment(self) -> Target:
        """The onnxruntime target on this target's device: where a model found for it is deployed and checked."""
        return find_target("onnxruntime", self.device)

    def eager(self) -> Target:
        """The torch target on this target's device (``bench --vs`` times the torch model there)."""
        return find_target("torch", self.device)

    def __repr__(self) -> str:
        return f"<target {self.name}>"


def register_target(cls: type[Target]) -> type[Target]:
    """Class decorator: register a ``Target`` subclass under its ``name``."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"target {cls.name!r} is registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _load_all() -> None:
    """Import every module of ``xsearch/latency/targets/`` (one file per kind of target)."""
    global _LOADED
    if _LOADED:
        return
    folder = Path(__file__).with_name("targets")
    for info in pkgutil.iter_modules([str(folder)]):
        if not info.name.startswith("_"):
            importlib.import_module(f"xsearch.latency.targets.{info.name}")
    _LOADED = True


def list_targets() -> list[str]:
    """Names of the registered targets, sorted (imports neither torch nor onnxruntime)."""
    _load_all()
    return sorted(_REGISTRY)


def get_target(name: str | Target) -> Target:
    """The target registered as ``name`` (a ``Target`` is returned as it is).

    Raises:
        XSearchError: an unknown name, naming it and the valid ones.
    """
    if isinstance(name, Target):
        return name
    _load_all()
    cls = _REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise XSearchError(f"unknown target {name!r}; valid: {', '.join(list_targets())}")
    return cls()


def find_target(engine: str, device: str) -> Target:
    """The registered target running ``engine`` on ``device``."""
    _load_all()
    for name in sorted(_REGISTRY):
        cls = _REGISTRY[name]
        if cls.engine == engine and cls.device == device:
            return cls()
    raise XSearchError(f"no target runs {engine} on {device} (targets: {', '.join(list_targets())})")


def random_tokens(vocab: int, batch: int, seq_len: int):
    """The (seeded) token ids and all-true mask every target times: ``(int64[B, N], bool[B, N])`` numpy arrays."""
    import numpy as np

    rng = np.random.default_rng(0)
    ids = rng.integers(1, vocab, size=(batch, seq_len), dtype=np.int64)
    return ids, np.ones((batch, seq_len), dtype=np.bool_)


def check_length(seq_len: int, max_len: int) -> None:
    if seq_len > max_len:
        raise XSearchError(f"seq_len={seq_len} exceeds the model's max_len={max_len}")


#: What a latency measures: ``forward``, a whole sequence of ``seq_len`` tokens (an encoder's call);
#: ``prefill``, a decoder's prompt of ``seq_len`` tokens and the state it leaves; ``decode``, one
#: decoder step (the next token) with ``context`` tokens already in the state.
LATENCY_MODES = ("forward", "prefill", "decode")


def check_mode(mode: str, context: int | None, cfg: dict[str, Any]) -> None:
    """Raise ``XSearchError`` naming the problem unless the model ``cfg`` can be timed in ``mode``."""
    if mode not in LATENCY_MODES:
        raise XSearchError(f"unknown latency mode {mode!r}; valid: {', '.join(LATENCY_MODES)}")
    if mode != "forward" and not (cfg.get("causal") and cfg.get("head") == "lm"):
        raise XSearchError(f"latency mode {mode!r} times a decoder: it needs a causal language model (task lm), "
                           f"got causal={cfg.get('causal')}, head={cfg.get('head')!r}")  # fmt: skip
    if mode == "decode":
        if isinstance(context, bool) or not isinstance(context, int) or context < 1:
            raise XSearchError(f"latency mode 'decode' needs context >= 1 (tokens already in the state), "
                               f"got {context!r}")  # fmt: skip
        if context + 1 > cfg["max_len"]:
            raise XSearchError(f"context={context} plus the timed token exceeds the model's max_len={cfg['max_len']}")


Runner = Iterator[Callable[[], float]]
