"""The numerics of the latency predictor (numpy only): ridge regression, non-negative least squares,
small MLPs fitted full-batch, and the three-stage model built from them.

The model, as in HAT (Wang et al., 2020), ends in a small MLP, here an ensemble of them, fitted to
the log of the latency over standardised features, after an additive cost model and a ridge
regression have taken what they can.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import numpy as np

from xsearch.latency.predictor.counting import COUNT_KINDS

MLP_KEYS = ("w1", "b1", "w2", "b2", "w3", "b3")
RIDGE_ALPHAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
WEIGHT_DECAYS = (0.1, 1.0, 10.0)
CV_FOLDS = 4


def _ridge(x: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
    """Least squares with an L2 penalty ``alpha * n * |w|^2`` and an unpenalised intercept."""
    xm, ym = x.mean(axis=0), float(y.mean())
    xc = x - xm
    w = np.linalg.solve(xc.T @ xc + alpha * len(y) * np.eye(x.shape[1]), xc.T @ (y - ym))
    return w, ym - float(xm @ w)


def _mlp_forward(net: dict[str, np.ndarray], x: np.ndarray, keep: bool = False):
    """``relu(relu(x W1 + b1) W2 + b2) W3 + b3`` (two hidden layers, as in HAT's predictor)."""
    a1 = x @ net["w1"] + net["b1"]
    z1 = np.maximum(a1, 0.0)
    a2 = z1 @ net["w2"] + net["b2"]
    z2 = np.maximum(a2, 0.0)
    out = (z2 @ net["w3"] + net["b3"])[:, 0]
    return (out, (a1, z1, a2, z2)) if keep else out


def _fit_mlp(x: np.ndarray, y: np.ndarray, hidden: int, epochs: int, seed: int, weight_decay: float) -> dict:
    """One MLP fitted full-batch to mean squared error with AdamW and a cosine schedule (numpy, seeded)."""
    rng = np.random.default_rng(seed)
    d = x.shape[1]
    net = {
        "w1": rng.normal(0.0, math.sqrt(2.0 / d), (d, hidden)),
        "b1": np.zeros(hidden),
        "w2": rng.normal(0.0, math.sqrt(2.0 / hidden), (hidden, hidden)),
        "b2": np.zeros(hidden),
        "w3": rng.normal(0.0, math.sqrt(1.0 / hidden), (hidden, 1)),
        "b3": np.zeros(1),
    }
    m = {k: np.zeros_like(v) for k, v in net.items()}
    v = {k: np.zeros_like(w) for k, w in net.items()}
    lr, beta1, beta2, eps = 3e-3, 0.9, 0.999, 1e-8
    for step in range(1, epochs + 1):
        out, (a1, z1, a2, z2) = _mlp_forward(net, x, keep=True)
        g_out = (2.0 / len(y)) * (out - y)[:, None]  # d(mean squared error)/d(out)
        g_a2 = (g_out @ net["w3"].T) * (a2 > 0)
        g_a1 = (g_a2 @ net["w2"].T) * (a1 > 0)
        grads = {"w3": z2.T @ g_out, "b3": g_out.sum(0), "w2": z1.T @ g_a2, "b2": g_a2.sum(0), "w1": x.T @ g_a1,
                 "b1": g_a1.sum(0)}  # fmt: skip
        rate = lr * 0.5 * (1.0 + math.cos(math.pi * (step - 1) / epochs))
        for k, g in grads.items():
            m[k] = beta1 * m[k] + (1 - beta1) * g
            v[k] = beta2 * v[k] + (1 - beta2) * g * g
            update = (m[k] / (1 - beta1**step)) / (np.sqrt(v[k] / (1 - beta2**step)) + eps)
            decay = weight_decay * net[k] if k[0] == "w" else 0.0  # weights decay, biases do not
            net[k] = net[k] - rate * (update + decay)
    return net


def grouped_folds(groups: Sequence[str], k: int, seed: int) -> list[np.ndarray]:
    """``k`` test-index arrays that never split a group (an architecture) between two folds."""
    keys = sorted(set(groups))
    random.Random(seed).shuffle(keys)
    fold_of = {key: i % k for i, key in enumerate(keys)}
    return [np.array([i for i, g in enumerate(groups) if fold_of[g] == f]) for f in range(k)]


#: The additive first stage: latency ~ c0 + sum of c_k * count_k over these (non-negative c).
ADDITIVE_TERMS = tuple(f"log10_{kind}" for kind in ("ops", *COUNT_KINDS))


def _nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """``argmin |a x - b|`` subject to ``x >= 0`` (Lawson and Hanson's active-set method)."""
    n = a.shape[1]
    passive = np.zeros(n, dtype=bool)
    x = np.zeros(n)
    for _ in range(max_iter):
        gradient = a.T @ (b - a @ x)
        if passive.all() or gradient[~passive].max() <= 1e-10 * max(1.0, float(np.abs(gradient).max())):
            break
        passive[np.argmax(np.where(passive, -np.inf, gradient))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            blocking = passive & (z <= 0)  # step back to where the first coefficient reaches 0
            x = x + np.min(x[blocking] / (x[blocking] - z[blocking])) * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
    return x


class StagedModel:
    """Log-latency = log of an additive cost model + ridge regression + an MLP ensemble.

    The additive stage prices what one forward pass does (``a``: a constant and the counts of
    ``ADDITIVE_TERMS``, scaled to at most 1) with non-negative costs fitted to relative error,
    so that it extrapolates to bigger or smaller models as sums of work do. The ridge, on the
    standardised features ``x``, corrects it by factors (per variant, per size); the MLPs learn
    what both miss.
    """

    def __init__(self, additive: bool, alpha: float, weight_decay: float | None, members: int, hidden: int,
                 epochs: int, seed: int):  # fmt: skip
        self.additive, self.alpha, self.weight_decay = additive, alpha, weight_decay
        self.members, self.hidden, self.epochs, self.seed = members, hidden, epochs, seed
        self.costs = np.zeros(0)
        self.w, self.b = np.zeros(0), 0.0
        self.scale = 1.0
        self.nets: list[dict[str, np.ndarray]] = []

    def base(self, a: np.ndarray) -> np.ndarray:
        """Log of the additive stage's latency (0 without that stage)."""
        if not self.additive:
            return np.zeros(len(a))
        return np.log(np.maximum(a @ self.costs, 1e-9))

    def fit(self, x: np.ndarray, a: np.ndarray, y: np.ndarray) -> StagedModel:
        if self.additive:
            latency = np.exp(y)
            self.costs = _nnls(a / latency[:, None], np.ones_like(latency))  # relative error: (a c - t) / t
        target = y - self.base(a)
        self.w, self.b = _ridge(x, target, self.alpha)
        residual = target - (x @ self.w + self.b)
        self.scale = float(max(residual.std(), 1e-6))
        if self.weight_decay is not None:
            self.nets = [
                _fit_mlp(x, residual / self.scale, self.hidden, self.epochs, self.seed + i, self.weight_decay)
                for i in range(self.members)
            ]
        return self

    def __call__(self, x: np.ndarray, a: np.ndarray) -> np.ndarray:
        out = self.base(a) + x @ self.w + self.b
        if self.nets:
            out = out + self.scale * np.mean([_mlp_forward(net, x) for net in self.nets], axis=0)
        return out


def cv_error(x, a, y, folds, make) -> float:
    """Mean squared error (log latency) over the folds of models built by ``make()``."""
    errors = []
    for test in folds:
        train = np.setdiff1d(np.arange(len(y)), test)
        errors.append(np.mean((make().fit(x[train], a[train], y[train])(x[test], a[test]) - y[test]) ** 2))
    return float(np.mean(errors))
