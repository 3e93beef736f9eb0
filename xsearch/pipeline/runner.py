"""The restartable stage runner behind ``xsearch run``.

A run folder holds ``pipeline.yaml`` (the resolved configuration the run was started with) and one
folder per stage, ``NN-<stage>``. A stage works in ``NN-<stage>.partial``, writes ``stage.json``
last and is then renamed into place, so a finished stage folder is complete by construction and
is never touched again. After an interruption (Ctrl-C, kill -9, a crash, a power cut) the same
command skips the finished stages, throws away a half-done ``.partial`` folder and redoes that
stage, except for stages that resume their own work (the search keeps its Optuna study).
A lock file keeps two processes out of one run folder.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from xsearch.errors import XSearchError
from xsearch.pipeline.config import PipelineConfig, PipelineConfigError, over_defaults, validate
from xsearch.serialization import atomic_write_text

STAGE_FILE = "stage.json"
CONFIG_FILE = "pipeline.yaml"


@dataclass(frozen=True)
class Stage:
    """One step of the pipeline: ``run(ctx, workdir) -> dict`` (saved as the stage's ``stage.json``).

    ``resumes`` marks a stage whose half-done work folder is continued rather than redone.
    """

    name: str
    run: Callable[[Any, Path], dict[str, Any]]
    title: str
    resumes: bool = False
    depends: tuple[str, ...] = ()  # configuration keys (dotted prefixes) whose values the stage's result reflects


class RunLockedError(XSearchError, RuntimeError):
    """Another process holds the run folder."""


class RunFolder:
    """The folder of one run: its configuration, stage folders and lock."""

    def __init__(self, root: str | os.PathLike, stages: list[Stage]) -> None:
        self.root = Path(root)
        self.stages = stages
        self._lock_fd: int | None = None

    def folder(self, name: str) -> Path:
        """Final folder of the stage called ``name``."""
        return self.root / f"{self._index(name):02d}-{name}"

    def _index(self, name: str) -> int:
        for i, s in enumerate(self.stages, 1):
            if s.name == name:
                return i
        raise KeyError(f"no stage {name!r}")

    def done(self, name: str) -> bool:
        return (self.folder(name) / STAGE_FILE).is_file()

    def result(self, name: str) -> dict[str, Any]:
        """The ``stage.json`` of a finished stage."""
        path = self.folder(name) / STAGE_FILE
        if not path.is_file():
            raise RuntimeError(f"stage {name!r} has not finished ({path} missing)")
        return json.loads(path.read_text(encoding="utf-8"))

    # -- configuration ---------------------------------------------------------------------
    def check_config(self, cfg: PipelineConfig) -> None:
        """Record the configuration; on a resumed run, refuse changes that a finished stage already reflects.

        A change that only concerns stages still to run is taken (and recorded): a budget that could not be
        met at the pick, say, can be relaxed and the run continued.
        """
        path = self.root / CONFIG_FILE
        if path.exists():
            try:
                saved = validate(over_defaults(yaml.safe_load(path.read_text(encoding="utf-8")), str(path)), str(path))
            except (yaml.YAMLError, PipelineConfigError, AttributeError) as e:
                raise PipelineConfigError(f"{path} is damaged ({e}); start a new run (--name or --fresh)") from None
            where = ("name", "runs_dir")  # the folder may be moved or renamed
            diffs = [d for d in _differences(saved.to_dict(), cfg.to_dict()) if d[0] not in where]
            for stage in self.stages:
                if not self.done(stage.name):
                    break
                hit = [
                    d
                    for d in diffs
                    if any(d[0] == k or d[0].startswith(k + ".") for k in stage.depends)
                    and not d[0].endswith((".device", ".train_device"))
                ]  # (where a stage trained is not what it made)
                if hit:
                    shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in hit[:4])
                    keep = " (the search keeps its trials)" if stage.resumes else ""
                    raise PipelineConfigError(
                        f"{self.root}: stage {stage.name!r} finished with another configuration ({shown}); "
                        f"add --redo-from {stage.name} to redo it and what follows{keep}, or use another --name"
                    )
            if not diffs:
                return
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, cfg.to_yaml())

    def redo_from(self, name: str) -> None:
        """Forget stage ``name`` and every later one (a resuming stage keeps its work folder to continue in)."""
        first = self._index(name)
        for i, stage in enumerate(self.stages, 1):
            if i < first:
                continue
            final = self.folder(stage.name)
            partial = final.with_name(final.name + ".partial")
            if i == first and stage.resumes:
                if final.exists():
                    if partial.exists():
                        shutil.rmtree(partial)
                    (final / STAGE_FILE).unlink()
                    os.replace(final, partial)
                continue
            for path in (final, partial):
                if path.exists():
                    shutil.rmtree(path)
        for leftover in ("summary.md", "summary.json"):
            (self.root / leftover).unlink(missing_ok=True)

    # -- locking ---------------------------------------------------------------------------
    def lock(self) -> None:
        import fcntl

        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunLockedError(f"{self.root} is in use by another xsearch run (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    # -- running ---------------------------------------------------------------------------
    def run(self, ctx: Any, *, log: Callable[[str], None] = print) -> None:
        """Run every unfinished stage in order."""
        total = len(self.stages)
        for i, stage in enumerate(self.stages, 1):
            final = self.folder(stage.name)
            if (final / STAGE_FILE).is_file():
                log(f"[{i}/{total}] {stage.title}: done earlier ({final})")
                continue
            if final.exists():  # a finished folder has stage.json; anything else is not ours to trust
                raise XSearchError(f"{final} exists but has no {STAGE_FILE}; move it away and re-run")
            work = final.with_name(final.name + ".partial")
            if work.exists() and not stage.resumes:
                shutil.rmtree(work)
            resumed = work.exists()
            work.mkdir(parents=True, exist_ok=True)
            log(f"[{i}/{total}] {stage.title}" + (" (resuming)" if resumed else ""))
            start = time.perf_counter()
            info = stage.run(ctx, work) or {}
            info = {**info, "stage": stage.name, "seconds": round(time.perf_counter() - start, 2)}
            atomic_write_text(work / STAGE_FILE, json.dumps(info, indent=2, default=str))
            _fsync_dir(work)
            os.replace(work, final)
            _fsync_dir(self.root)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _differences(a: Any, b: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in list(a) + [k for k in b if k not in a]:
            out += _differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [(prefix.rstrip("."), a, b)]
