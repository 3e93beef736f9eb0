"""``xsearch run``: one restartable pipeline from a task to a deployed ONNX model.

>>> from xsearch.pipeline import load_pipeline_config, run_pipeline
>>> summary = run_pipeline(load_pipeline_config("pipeline.yaml"))  # doctest: +SKIP
"""

from __future__ import annotations

import json
import shutil
from typing import Any

from xsearch.errors import XSearchError
from xsearch.pipeline.config import (
    DEFAULT_YAML,
    PipelineConfig,
    PipelineConfigError,
    default_yaml,
    load_pipeline_config,
)
from xsearch.pipeline.runner import RunFolder, RunLockedError

__all__ = [
    "DEFAULT_YAML",
    "PipelineConfig",
    "PipelineConfigError",
    "RunLockedError",
    "default_yaml",
    "load_pipeline_config",
    "run_pipeline",
]


def run_pipeline(
    cfg: PipelineConfig, *, fresh: bool = False, redo_from: str | None = None, progress: bool = True, echo=print
) -> dict[str, Any]:
    """Run (or continue) the pipeline in ``cfg.run_dir``; returns the summary (also in ``summary.json``).

    Args:
        fresh: delete the run folder first and start over.
        redo_from: forget this stage and the later ones first (the search keeps its study and adds trials).
        progress: progress bars for the search and training.
        echo: where the one-line stage reports go.
    """
    from xsearch.pipeline.stages import RunContext, stages_for

    stages = stages_for(cfg)
    names = [s.name for s in stages]
    if redo_from is not None and redo_from not in names:
        raise XSearchError(f"unknown stage {redo_from!r}; stages: {', '.join(names)}")
    run = RunFolder(cfg.run_dir, stages)
    if fresh and run.root.exists():
        run.lock()  # never delete a folder another process is working in
        run.unlock()
        shutil.rmtree(run.root)
    run.lock()
    try:
        if redo_from is not None:
            run.redo_from(redo_from)
        run.check_config(cfg)
        run.run(RunContext(cfg, run, progress=progress, echo=echo), log=echo)
    finally:
        run.unlock()
    return json.loads((run.root / "summary.json").read_text(encoding="utf-8"))
