"""Held-out error of the latency predictor on architectures the fit never saw: the split, MAPE, Kendall tau."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from xsearch.errors import XSearchError
from xsearch.latency.predictor.features import LatencyRow, architecture_key, row_features
from xsearch.latency.predictor.fit import LatencyPredictor


def mape(actual: Sequence[float], predicted: Sequence[float]) -> float:
    """Mean absolute percentage error, in percent: ``100 * mean(|p - a| / |a|)``."""
    a, p = np.asarray(actual, dtype=float), np.asarray(predicted, dtype=float)
    if a.shape != p.shape or a.size == 0:
        raise XSearchError(f"mape needs two equally long, non-empty sequences, got {a.size} and {p.size}")
    if np.any(a == 0):
        raise XSearchError("mape is undefined when an actual value is 0")
    return float(100.0 * np.mean(np.abs(p - a) / np.abs(a)))


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's rank correlation tau-b (ties in either sequence accounted for), in [-1, 1].

    Raises:
        ValueError: sequences of different lengths, fewer than two values, or a constant sequence.
    """
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape or a.size < 2:
        raise XSearchError(f"kendall_tau needs two equally long sequences of >= 2 values, got {a.size} and {b.size}")
    i, j = np.triu_indices(a.size, k=1)
    da, db = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
    concordant_minus_discordant = float(np.sum(da * db))
    pairs_a, pairs_b = float(np.count_nonzero(da)), float(np.count_nonzero(db))  # pairs not tied
    if pairs_a == 0 or pairs_b == 0:
        raise XSearchError("kendall_tau is undefined for a constant sequence")
    return concordant_minus_discordant / math.sqrt(pairs_a * pairs_b)


def split_by_architecture(
    rows: Sequence[LatencyRow], test_fraction: float = 0.2, seed: int = 0
) -> tuple[list[int], list[int]]:
    """Indices of a train and a test part, never with one architecture on both sides.

    Every row of an architecture (measured at several lengths, or measured twice) goes to the
    same side; the architectures are shuffled with ``seed`` and about ``test_fraction`` of them
    (at least one) go to the test side.

    Raises:
        ValueError: a fraction outside (0, 1), or fewer than two architectures.
    """
    if not 0.0 < test_fraction < 1.0:
        raise XSearchError(f"test_fraction must be in (0, 1), got {test_fraction}")
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(architecture_key(row.config), []).append(i)
    keys = sorted(groups)
    if len(keys) < 2:
        raise XSearchError(f"a held-out split needs at least two distinct architectures, got {len(keys)}")
    random.Random(seed).shuffle(keys)
    n_test = min(len(keys) - 1, max(1, round(test_fraction * len(keys))))
    test = sorted(i for k in keys[:n_test] for i in groups[k])
    train = sorted(i for k in keys[n_test:] for i in groups[k])
    return train, test


def fit_with_holdout(
    rows: Sequence[LatencyRow],
    *,
    test_fraction: float = 0.2,
    seed: int = 0,
    progress=None,
    features: Sequence[dict[str, float]] | None = None,
    **hyper: Any,
) -> LatencyPredictor:
    """Measure the held-out error on unseen architectures, then fit on every row.

    The rows are split by architecture (``split_by_architecture``); a predictor fitted on the
    train part is scored on the test part (MAPE, Kendall tau, worst errors), and the returned
    predictor, fitted the same way on all rows, carries those figures in ``metrics``. A test row
    measured in a session the train part also had is compared with the prediction times that
    session's speed, as estimated from the train rows alone (``mape``, ``kendall_tau``); the
    ``*_typical_session`` figures compare it with the prediction for a typical session.

    Args:
        rows: rows of one target and device (``target`` and ``device`` are taken from the first).
        progress: called as ``progress(done, total)`` while the features are computed.
        features: ``row_features`` of each row, when already computed (several splits of one set).
        hyper: ``LatencyPredictor`` settings (members, hidden, epochs, weight_decay).
    """
    rows = list(rows)
    if features is not None and len(features) != len(rows):
        raise XSearchError(f"features: {len(features)} given for {len(rows)} rows")
    feats = list(features or [])
    if features is None:
        for i, row in enumerate(rows):
            feats.append(row_features(row))
            if progress is not None:
                progress(i + 1, len(rows))
    metrics = holdout_metrics(rows, feats, test_fraction=test_fraction, seed=seed, **hyper)
    final = LatencyPredictor(rows[0].target, rows[0].device, seed=seed, **hyper).fit(rows, feats)
    final.metrics = metrics
    return final


def holdout_metrics(
    rows: Sequence[LatencyRow],
    features: Sequence[dict[str, float]],
    *,
    test_fraction: float = 0.2,
    seed: int = 0,
    **hyper: Any,
) -> dict[str, Any]:
    """The held-out figures of ``fit_with_holdout`` for one split, without the fit on every row
    (several splits of one set of rows; ``features``: their ``row_features``, in order)."""
    rows = list(rows)
    train, test = split_by_architecture(rows, test_fraction, seed)
    held = LatencyPredictor(rows[0].target, rows[0].device, seed=seed, **hyper)
    held.fit([rows[i] for i in train], [features[i] for i in train])
    typical = held.predict_features([features[i] for i in test])
    pred = typical * np.array([held.session_speed(rows[i].session) for i in test])
    actual = np.array([rows[i].latency_ms for i in test])
    errors = np.abs(pred - actual) / actual
    worst = sorted(range(len(test)), key=lambda k: -errors[k])[:5]
    return {
        "mape": mape(actual, pred),
        "kendall_tau": kendall_tau(actual, pred) if len(test) > 1 else None,
        "mape_typical_session": mape(actual, typical),
        "kendall_tau_typical_session": kendall_tau(actual, typical) if len(test) > 1 else None,
        "sessions": len(held.sessions),
        "n_train": len(train),
        "n_test": len(test),
        "n_train_architectures": len({architecture_key(rows[i].config) for i in train}),
        "n_test_architectures": len({architecture_key(rows[i].config) for i in test}),
        "test_fraction": test_fraction,
        "split_seed": seed,
        "worst": [
            {
                "attention": rows[test[k]].config.get("attention"),
                "seq_len": rows[test[k]].seq_len,
                "measured_ms": float(actual[k]),
                "predicted_ms": float(pred[k]),
                "error_pct": float(100 * errors[k]),
            }
            for k in worst
        ],  # fmt: skip
        "test": [
            {
                "attention": rows[i].config.get("attention"),
                "seq_len": rows[i].seq_len,
                "measured_ms": float(a),
                "predicted_ms": float(p),
                "predicted_typical_ms": float(t),
            }
            for i, a, p, t in zip(test, actual, pred, typical)
        ],  # fmt: skip
    }
