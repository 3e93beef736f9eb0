"""``LatencyPredictor``: architecture features -> latency on one target and device, fitted on measured rows.

Everything is saved as JSON; predictions are computed with numpy from the saved numbers, so a
saved and re-loaded predictor predicts exactly the same values.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from xsearch.errors import XSearchError
from xsearch.latency.predictor.features import LatencyRow, architecture_features, architecture_key, row_features
from xsearch.latency.predictor.models import (
    ADDITIVE_TERMS,
    CV_FOLDS,
    MLP_KEYS,
    RIDGE_ALPHAS,
    WEIGHT_DECAYS,
    StagedModel,
    cv_error,
    grouped_folds,
)
from xsearch.settings import show_differences

FORMAT = "xsearch-latency-predictor/2"
# Sessions: a session's speed is estimated from the fit's residuals on its rows, then divided out
# of their labels and the model refitted; sessions with fewer rows are left alone.
MIN_SESSION_ROWS = 5
SESSION_ITERATIONS = 3


class LatencyPredictor:
    """Predicts the latency (ms) of an architecture on the target and device it was fitted for.

    The log of the latency is modelled in three stages: an additive cost model (a non-negative
    price per FLOP of matrix products and of attention, per element of pointwise, reduction,
    data-movement and sort work, per operation, and a constant), a ridge regression on the
    standardised features that corrects it by factors, and an ensemble of MLPs (two hidden ReLU
    layers) fitted to the ridge's residuals. The additive stage carries how latency grows with
    work, and extrapolates like it; the ridge learns each variant's and size's efficiency; the
    MLPs learn what both miss. The two regularisation strengths are
    chosen by cross-validation grouped by architecture on the rows given to ``fit``
    (``"auto"``); a weight decay of None fits no MLP.

    Rows that name their measurement ``session`` (a sweep's group) are fitted with each
    session's speed divided out: a session's speed is the median residual of its rows against
    out-of-fold predictions (by models that did not see their architecture), estimated and
    refitted ``SESSION_ITERATIONS`` times, relative to the median session (``sessions``).
    Predictions are for a typical session.

    Args:
        target: the latency backend the data was measured on.
        device: the device fingerprint of the data.
        additive: whether to fit the additive stage: True, False or ``"auto"``.
        alpha: ridge penalty, or ``"auto"``.
        weight_decay: the MLPs' weight decay, None (no MLPs) or ``"auto"``.
        members: MLPs in the ensemble (their outputs are averaged).
        hidden: width of each MLP's two hidden layers.
        epochs: full-batch training steps per MLP.
        seed: seeds the cross-validation folds and the MLPs' initialisation.
    """

    def __init__(
        self,
        target: str = "",
        device: dict[str, Any] | None = None,
        *,
        additive: bool | str = "auto",
        alpha: float | str = "auto",
        weight_decay: float | str | None = "auto",
        members: int = 5,
        hidden: int = 32,
        epochs: int = 1000,
        seed: int = 0,
    ) -> None:
        self.target, self.device = target, dict(device or {})
        self.hyper: dict[str, Any] = {"additive": additive, "alpha": alpha, "weight_decay": weight_decay,
                                      "members": members, "hidden": hidden, "epochs": epochs, "seed": seed}  # fmt: skip
        self.features: list[str] = []
        self.mean = self.std = np.zeros(0)
        self.additive_scale = np.zeros(0)
        self.model: StagedModel | None = None
        self.sessions: dict[str, float] = {}  # log speed of each measurement session (0: typical)
        self.metrics: dict[str, Any] = {}
        self.data: dict[str, Any] = {}

    @property
    def fitted(self) -> bool:
        return self.model is not None

    def _matrix(self, feats: list[dict[str, float]]) -> np.ndarray:
        x = np.array([[f.get(name, 0.0) for name in self.features] for f in feats], dtype=np.float64)
        return (x - self.mean) / self.std

    def _additive(self, feats: list[dict[str, float]]) -> np.ndarray:
        """The additive stage's inputs: a constant, then each term's count over its scale."""
        counts = np.array([[10.0 ** f.get(name, 0.0) if f.get(name, 0.0) > 0 else 0.0 for name in ADDITIVE_TERMS]
                           for f in feats])  # fmt: skip
        return np.hstack([np.ones((len(feats), 1)), counts / self.additive_scale])

    def _model(
        self, additive: bool, alpha: float, weight_decay: float | None, members: int | None = None
    ) -> StagedModel:
        h = self.hyper
        return StagedModel(additive, alpha, weight_decay, members or h["members"], h["hidden"], h["epochs"], h["seed"])

    def fit(self, rows: Iterable[LatencyRow], features: list[dict[str, float]] | None = None) -> LatencyPredictor:
        """Fit on measured rows (all of them; see ``fit_with_holdout`` for a held-out error).

        Args:
            rows: measured architectures.
            features: their ``architecture_features`` when already computed (same order).

        Returns:
            self.
        """
        rows = list(rows)
        if len(rows) < 2:
            raise XSearchError(f"fitting needs at least two measured rows, got {len(rows)}")
        feats = features if features is not None else [row_features(r) for r in rows]
        self.features = sorted({name for f in feats for name in f})
        raw = np.array([[f.get(name, 0.0) for name in self.features] for f in feats], dtype=np.float64)
        self.mean = raw.mean(axis=0)
        std = raw.std(axis=0)
        self.std = np.where(std > 1e-12, std, 1.0)
        x = self._matrix(feats)
        self.additive_scale = np.ones(len(ADDITIVE_TERMS))
        a = self._additive(feats)  # unscaled counts first: their maxima become the scale
        scale = a[:, 1:].max(axis=0)
        self.additive_scale = np.where(scale > 0, scale, 1.0)
        a[:, 1:] /= self.additive_scale
        y = np.log(np.array([r.latency_ms for r in rows], dtype=np.float64))
        groups = [architecture_key(r.config) for r in rows]
        sessions = [r.session for r in rows]
        requested = dict(self.hyper)
        estimable = {k for k in set(sessions) if k and sessions.count(k) >= MIN_SESSION_ROWS}
        self.sessions = {}
        target = y
        for iteration in range(1 + (SESSION_ITERATIONS if len(estimable) >= 2 else 0)):
            if iteration:  # each session's speed: the median residual of its rows, relative to the median session
                residual = y - self._out_of_fold(x, a, target, groups)
                speed = {k: float(np.median(residual[[s == k for s in sessions]])) for k in sorted(estimable)}
                typical = float(np.median(list(speed.values())))
                self.sessions = {k: v - typical for k, v in speed.items()}
            target = y - np.array([self.sessions.get(k, 0.0) for k in sessions])
            self.hyper = dict(requested)
            selection = self._select(x, a, target, groups)
            self.model = self._model(*(self.hyper[k] for k in ("additive", "alpha", "weight_decay"))).fit(x, a, target)
        self.data = {
            "rows": len(rows),
            "architectures": len(set(groups)),
            "seq_lens": sorted({r.seq_len for r in rows}),
            "batches": sorted({r.batch for r in rows}),
            "latency_ms_range": [min(r.latency_ms for r in rows), max(r.latency_ms for r in rows)],
            "selection": selection,
        }
        return self

    def _out_of_fold(self, x: np.ndarray, a: np.ndarray, y: np.ndarray, groups: list[str]) -> np.ndarray:
        """Predictions of ``y`` for every row by a model that did not see its architecture (grouped folds).

        A session's speed is read off these: in-sample residuals of a flexible model shrink towards
        zero (the MLPs learn part of each row's session into its architecture) and would hide the
        speed they should reveal. One MLP per fold, not the ensemble: the median over a session's
        rows averages out what the ensemble would.
        """
        if len(set(groups)) < CV_FOLDS:
            return self.model(x, a)
        out = np.empty_like(y)
        for test in grouped_folds(groups, CV_FOLDS, self.hyper["seed"]):
            train = np.setdiff1d(np.arange(len(y)), test)
            model = self._model(*(self.hyper[k] for k in ("additive", "alpha", "weight_decay")), members=1)
            out[test] = model.fit(x[train], a[train], y[train])(x[test], a[test])
        return out

    def _select(self, x: np.ndarray, a: np.ndarray, y: np.ndarray, groups: list[str]) -> dict[str, Any]:
        """Choose the ``"auto"`` settings by cross-validation grouped by architecture (into ``self.hyper``)."""
        additive, alpha, decay = self.hyper["additive"], self.hyper["alpha"], self.hyper["weight_decay"]
        selection: dict[str, Any] = {}
        if "auto" in (additive, alpha, decay) and len(set(groups)) >= CV_FOLDS:
            folds = grouped_folds(groups, CV_FOLDS, self.hyper["seed"])
            if additive == "auto" or alpha == "auto":  # chosen together: the ridge corrects the additive stage
                grid = [(ad, r) for ad in ((True, False) if additive == "auto" else (additive,))
                        for r in (RIDGE_ALPHAS if alpha == "auto" else (alpha,))]  # fmt: skip
                errs = {g: cv_error(x, a, y, folds, lambda g=g: self._model(g[0], g[1], None)) for g in grid}
                additive, alpha = min(errs, key=errs.get)
                selection["additive_alpha_cv_mse"] = {f"{ad},{r}": v for (ad, r), v in errs.items()}
            if decay == "auto":
                errs = {d: cv_error(x, a, y, folds, lambda d=d: self._model(additive, alpha, d, members=1))
                        for d in (None, *WEIGHT_DECAYS)}  # fmt: skip
                decay = min(errs, key=errs.get)
                selection["weight_decay_cv_mse"] = {str(k): v for k, v in errs.items()}
        additive = True if additive == "auto" else additive  # too few architectures to cross-validate
        alpha = 0.01 if alpha == "auto" else alpha
        decay = None if decay == "auto" else decay
        self.hyper |= {"additive": additive, "alpha": alpha, "weight_decay": decay}
        return selection

    def predict_features(self, feats: list[dict[str, float]]) -> np.ndarray:
        """Latencies (ms) for precomputed ``architecture_features``."""
        if self.model is None:
            raise XSearchError("this LatencyPredictor is not fitted")
        return np.exp(self.model(self._matrix(feats), self._additive(feats)))

    def session_speed(self, session: str) -> float:
        """How much slower than typical the machine ran in a measurement session the fit saw (1.0 otherwise)."""
        return float(np.exp(self.sessions.get(session, 0.0)))

    def predict(self, config, seq_len: int, batch: int = 1) -> float:
        """Predicted latency in milliseconds of ``config`` (a ``ModelConfig`` or dict) at ``(batch, seq_len)``."""
        return float(self.predict_features([architecture_features(config, seq_len, batch)])[0])

    # -- JSON ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        from xsearch import __version__

        if not self.fitted:
            raise XSearchError("this LatencyPredictor is not fitted")
        return {
            "format": FORMAT,
            "xsearch_version": __version__,
            "target": self.target,
            "device": self.device,
            "model": "log latency = log(additive cost model) + ridge + MLP ensemble on the residuals",
            "hyper": self.hyper,
            "features": self.features,
            "feature_mean": self.mean.tolist(),
            "feature_std": self.std.tolist(),
            "additive": {
                "terms": ["constant", *ADDITIVE_TERMS],
                "scale": [1.0, *self.additive_scale.tolist()],
                "cost": self.model.costs.tolist(),
            },
            "ridge": {"weight": self.model.w.tolist(), "bias": self.model.b},
            "residual_scale": self.model.scale,
            "members": [{k: net[k].tolist() for k in MLP_KEYS} for net in self.model.nets],
            "sessions": self.sessions,
            "metrics": self.metrics,
            "data": self.data,
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write the predictor as JSON (through a temporary name and a rename)."""
        from xsearch.serialization import atomic_write_text

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> LatencyPredictor:
        """Read a predictor written by ``save``.

        Raises:
            FileNotFoundError: no such file.
            ValueError: malformed JSON, or not a latency predictor (naming the file).
        """
        from xsearch.serialization import read_json

        path = Path(path)
        doc = read_json(path)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise XSearchError(f"{path} is not an xsearch latency predictor (format {FORMAT!r})")
        try:
            p = cls(doc["target"], doc["device"], **doc["hyper"])
            p.features = list(doc["features"])
            p.mean = np.array(doc["feature_mean"], dtype=np.float64)
            p.std = np.array(doc["feature_std"], dtype=np.float64)
            p.model = p._model(p.hyper["additive"], p.hyper["alpha"], p.hyper["weight_decay"])
            if doc["additive"]["terms"] != ["constant", *ADDITIVE_TERMS]:
                raise XSearchError(f"additive terms {doc['additive']['terms']} are not this version's")
            p.additive_scale = np.array(doc["additive"]["scale"][1:], dtype=np.float64)
            p.model.costs = np.array(doc["additive"]["cost"], dtype=np.float64)
            p.model.w = np.array(doc["ridge"]["weight"], dtype=np.float64)
            p.model.b = float(doc["ridge"]["bias"])
            p.model.scale = float(doc["residual_scale"])
            p.model.nets = [{k: np.array(m[k], dtype=np.float64) for k in MLP_KEYS} for m in doc["members"]]
            p.metrics, p.data = dict(doc.get("metrics") or {}), dict(doc.get("data") or {})
            p.sessions = {str(k): float(v) for k, v in (doc.get("sessions") or {}).items()}
        except (KeyError, TypeError, ValueError) as e:
            raise XSearchError(f"{path}: a malformed latency predictor ({type(e).__name__}: {e})") from None
        n = len(p.features)
        if (
            len(p.mean) != n
            or len(p.std) != n
            or len(p.model.w) != n
            or any(m["w1"].shape[0] != n for m in p.model.nets)
            or len(p.model.costs) != (1 + len(ADDITIVE_TERMS) if p.model.additive else 0)
            or len(p.additive_scale) != len(ADDITIVE_TERMS)
        ):
            raise XSearchError(f"{path}: a malformed latency predictor (feature sizes do not match)")
        return p


def load_for_target(path: str | os.PathLike, target: str, threads: int | None) -> LatencyPredictor:
    """Load a predictor for use on ``target``; warn (logging) when it was fitted on another device.

    Raises:
        ValueError: a predictor fitted for another target (naming both), or a malformed file.
        FileNotFoundError: no such file.
    """

    from xsearch.latency.timing import device_fingerprint

    predictor = LatencyPredictor.load(path)
    if predictor.target != target:
        raise XSearchError(f"latency predictor {path} was fitted for target {predictor.target!r}, not {target!r}")
    here = device_fingerprint(target, threads)
    if shown := show_differences(predictor.device, here, now_as="here"):
        logging.getLogger("xsearch.search").warning(
            "latency predictor %s was fitted on another device (%s); predictions may be off", path, shown
        )
    return predictor
