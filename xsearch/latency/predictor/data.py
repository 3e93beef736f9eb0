"""Latency data for the predictor: the measured trials of sweep and search studies, as ``LatencyRow``s.

A sweep trial's latency is read relative to the reference Transformer timed in its group (see
``xsearch.latency.sweep``), so a group timed while the machine was slow does not read as slow
architectures.
"""

from __future__ import annotations

import json
import logging
import statistics
from dataclasses import replace

import optuna

from xsearch.errors import XSearchError
from xsearch.latency.device import describe_device
from xsearch.latency.predictor.features import LatencyRow

log = logging.getLogger("xsearch.latency")


def rows_from_study(study: optuna.Study) -> list[LatencyRow]:
    """The measured trials of a search or sweep study (any state that recorded a latency).

    A sweep trial's latency is scaled by ``typical / latency_reference_ms``, where ``typical`` is
    the median over the study of the reference's latency at that length and batch: the speed of
    the machine while its group was timed is divided out. Each such row names its group as its
    ``session`` (the predictor refines the group's speed from all its rows). Measurements of
    older sweeps that other processes disturbed (``latency_disturbed`` > 0) are left out.
    """
    settings = study.user_attrs.get("settings") or {}
    task = study.user_attrs.get("task") or {}
    rows, references, disturbed = [], [], 0
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        lat, cfg = attrs.get("latency"), attrs.get("model_config")
        if not isinstance(lat, dict) or not isinstance(cfg, dict) or "median_ms" not in lat:
            continue
        if attrs.get("latency_disturbed"):
            disturbed += 1
            continue
        seq_len = attrs.get("seq_len") or settings.get("seq_len") or task.get("max_len") or cfg.get("max_len")
        batch = attrs.get("batch") or settings.get("batch") or 1
        target = lat.get("target") or settings.get("target")
        device = attrs.get("device") or lat.get("device") or {}
        reference = attrs.get("latency_reference_ms")
        # Trials of one sweep group share a reference timing (older sweeps did not record the group).
        session = f"{study.study_name}/{attrs.get('latency_group', reference)}" if reference else ""
        rows.append(LatencyRow(cfg, int(seq_len), int(batch), float(lat["median_ms"]), str(target), device, session))
        references.append(reference)
    if disturbed:
        log.info("study %r: %d measurements disturbed by other processes left out", study.study_name, disturbed)
    typical: dict[tuple[int, int], float] = {}
    for shape in {(r.seq_len, r.batch) for r in rows}:
        refs = [ref for r, ref in zip(rows, references) if (r.seq_len, r.batch) == shape and ref]
        if refs:
            typical[shape] = statistics.median(refs)
    return [
        replace(row, latency_ms=row.latency_ms * typical[(row.seq_len, row.batch)] / ref) if ref else row
        for row, ref in zip(rows, references)
    ]


def load_rows(storage: str, studies: list[str]) -> list[LatencyRow]:
    """The measured trials of every named study in ``storage``."""
    from xsearch.storage import load_study

    rows = []
    for name in studies:
        rows.extend(rows_from_study(load_study(storage, name)))
    return rows


def select_rows(rows: list[LatencyRow], target: str | None = None, threads: int | None = None) -> list[LatencyRow]:
    """The rows of one target and one device.

    Raises:
        ValueError: no rows, or several targets or devices left and no choice given, naming them.
    """
    if not rows:
        raise XSearchError("no measured trials (with a latency) in the given studies")
    if target is not None:
        targets = sorted({r.target for r in rows})
        rows = [r for r in rows if r.target == target]
        if not rows:
            raise XSearchError(f"no trials measured on target {target!r} (targets there: {', '.join(targets)})")
    targets = sorted({r.target for r in rows})
    if len(targets) > 1:
        raise XSearchError(f"the studies mix targets {', '.join(targets)}; choose one with --target")
    if threads is not None:
        have = sorted({str(r.device.get("threads")) for r in rows})
        rows = [r for r in rows if r.device.get("threads") == threads]
        if not rows:
            raise XSearchError(f"no trials measured with {threads} threads (threads there: {', '.join(have)})")
    devices = {json.dumps(r.device, sort_keys=True): r.device for r in rows}
    if len(devices) > 1:
        names = "; ".join(sorted(describe_device(d) for d in devices.values()))
        raise XSearchError(f"the studies mix devices for target {targets[0]!r} ({names}); choose one with --threads")
    return rows
