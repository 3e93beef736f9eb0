"""A latency predictor: architecture features -> latency on one target and device.

The features of a ``ModelConfig`` at an input shape are its attention variant (one-hot over
the registry) and that variant's parameters, its sizes, weight sharing, the input shape, its
parameter count, and what one forward pass does, counted while it runs: FLOPs (matrix
products and attention), the number of tensor operations and the elements they write. The
operation counts stand in for the memory traffic and per-operator overhead that dominate
many efficient variants on a CPU, where FLOPs alone mislead.

The model, as in HAT (Wang et al., 2020), is a small MLP, here an ensemble of them, fitted
to the log of the latency over standardised features. Held-out error is measured on
architectures that the fit never saw (``split_by_architecture``). Everything is saved as
JSON; predictions are computed with numpy from the saved numbers, so a saved and re-loaded
predictor predicts exactly the same values.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "xsearch-latency-predictor/2"


@dataclass(frozen=True)
class LatencyRow:
    """One measured architecture: what the predictor learns from.

    Attributes:
        config: the ``ModelConfig`` as a dict.
        seq_len: the sequence length it was measured at.
        batch: the batch size it was measured at.
        latency_ms: the median latency.
        target: the latency backend (``ort-cpu``, ...).
        device: the device fingerprint of the measurement.
        session: the measurement session (a sweep's group) it was timed in; rows of one
            session saw the same machine speed. Empty: unknown (each row on its own).
    """

    config: dict[str, Any]
    seq_len: int
    batch: int
    latency_ms: float
    target: str = ""
    device: dict[str, Any] | None = None
    session: str = ""


# -- features ------------------------------------------------------------------------------------
def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of fused attention: ``Q K^T`` and ``P V`` (the CPU kernel is not in torch's table)."""
    *batch, s_q, d_q = query_shape
    s_k, d_v = key_shape[-2], value_shape[-1]
    return 2 * math.prod(batch) * s_q * s_k * (d_q + d_v)


# What an operation costs is read off its kind: matrix products by their FLOPs, the rest by the
# elements they touch (reductions and sorts by what they read, everything else by what it writes).
# Operators that only build constants from shapes (folded away in an exported graph) are counted
# as operations but touch nothing.
_ATTENTION_OPS = frozenset({
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math", "scaled_dot_product_attention",
})  # fmt: skip
_MATMUL_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "convolution", "einsum"})
_REDUCTION_OPS = frozenset({
    "native_layer_norm", "layer_norm", "_softmax", "softmax", "_log_softmax", "logsumexp", "sum", "mean", "amax",
    "amin", "max", "min", "argmax", "argmin", "linalg_vector_norm", "norm", "any", "all", "var", "std", "prod",
    "cumsum", "cumprod",
})  # fmt: skip
_SORT_OPS = frozenset({"sort", "topk", "argsort", "kthvalue", "median"})
_MOVEMENT_OPS = frozenset({
    "cat", "stack", "clone", "_to_copy", "copy", "copy_", "contiguous", "index", "index_select", "gather", "scatter",
    "scatter_add", "scatter_reduce", "index_put", "index_put_", "index_add", "constant_pad_nd", "embedding",
    "repeat", "roll", "flip", "tril", "triu", "masked_select", "_unsafe_view",
})  # fmt: skip
_CONSTANT_OPS = frozenset({
    "arange", "new_full", "new_zeros", "new_ones", "new_empty", "scalar_tensor", "zeros", "ones", "full", "empty",
    "eye", "zeros_like", "ones_like", "full_like", "empty_like", "_local_scalar_dense", "lift_fresh",
})  # fmt: skip
#: The kinds ``forward_counts`` reports, besides ``flops``, ``ops`` and ``elements``.
COUNT_KINDS = ("flops_matmul", "flops_attention", "elements_attention", "elements_pointwise", "elements_reduction",
               "elements_movement", "elements_sort")  # fmt: skip


def _op_kind(name: str) -> str:
    if name in _CONSTANT_OPS:
        return "constant"
    if name in _REDUCTION_OPS:
        return "elements_reduction"
    if name in _SORT_OPS:
        return "elements_sort"
    if name in _MOVEMENT_OPS:
        return "elements_movement"
    return "elements_pointwise"


def forward_counts(model, seq_len: int, batch: int = 1) -> dict[str, int]:
    """Count what one forward pass of ``model`` on ``(batch, seq_len)`` tokens does.

    FLOPs come from ``torch.utils.flop_counter.FlopCounterMode`` (matrix products,
    convolutions, attention), read off the real operations rather than a per-variant formula
    that would have to follow each of the 19 variants' code. ``ops`` counts the tensor
    operations that are not views; ``elements`` sums the sizes of their outputs. The same work
    is also split by kind (``COUNT_KINDS``): FLOPs of matrix products and of fused attention,
    the attention scores that fused attention computes (an exported graph may hold them in memory),
    and the elements touched by pointwise operations, reductions (layer norm, softmax, sums),
    data movement (concatenation, copies, gathers, scatters) and sorts (Reformer's buckets,
    Routing's top-k), which a CPU runs at very different speeds.

    Returns:
        ``{"flops": ..., "ops": ..., "elements": ..., "flops_matmul": ..., ...}``.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch.utils.flop_counter import FlopCounterMode

    def numel(tree) -> int:
        return sum(t.numel() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))

    class _OpCounter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.counts = dict.fromkeys(("ops", "elements", *COUNT_KINDS), 0)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view:
                name = func.overloadpacket.__name__
                self.counts["ops"] += 1
                self.counts["elements"] += numel(out)
                if name in _ATTENTION_OPS:  # the scores: (..., Sq, Sk), in memory unless the kernel fuses
                    query, key = args[0], args[1]
                    self.counts["elements_attention"] += query.shape[:-1].numel() * key.shape[-2]
                elif name not in _MATMUL_OPS:
                    kind = _op_kind(name)
                    if kind in ("elements_reduction", "elements_sort"):
                        self.counts[kind] += numel((args, kwargs))
                    elif kind != "constant":
                        self.counts[kind] += numel(out)
            return out

    cfg = model.config
    ids = torch.randint(1, cfg.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(batch, seq_len, dtype=torch.bool)
    sdpa_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    model.eval().requires_grad_(False)  # FlopCounterMode's module tracker trips over params needing grad
    with (
        torch.no_grad(),
        FlopCounterMode(display=False, custom_mapping={sdpa_cpu: _sdpa_flops}) as flops,
        _OpCounter() as counter,
    ):
        model(ids, mask)
    by_op = flops.get_flop_counts().get("Global", {})
    attention = sum(int(v) for op, v in by_op.items() if getattr(op, "__name__", str(op)) in _ATTENTION_OPS)
    total = int(flops.get_total_flops())
    return {"flops": total, **counter.counts, "flops_matmul": total - attention, "flops_attention": attention}


def _log2(x: float) -> float:
    return math.log2(max(float(x), 1e-9))


def architecture_features(config, seq_len: int, batch: int = 1) -> dict[str, float]:
    """The features of one architecture at one input shape.

    Args:
        config: a ``ModelConfig`` or its dict.
        seq_len: tokens per sequence.
        batch: sequences per call.

    Returns:
        Feature name -> value: ``attention=<name>`` (0/1 for every registered variant), the
        variant's parameters as ``attention.<name>.<param>`` (integers as ``log2(1 + v)``,
        booleans 0/1, strings one-hot as ``attention.<name>.<param>=<value>``), ``log2_*``
        sizes (d_model, n_layers, n_heads, head_dim, d_ff as the mean of the real FFN widths,
        seq_len, batch), ``sharing=<mode>``, ``log10_parameters``, ``log10_flops``,
        ``log10_ops``, ``log10_elements`` and ``log10_<kind>`` of each of ``COUNT_KINDS`` of one
        forward pass. Deterministic.

    Raises:
        ValueError: an invalid config, or a length over its max_len.
    """
    import torch

    from xsearch.attention import list_attentions
    from xsearch.config import WEIGHT_SHARING, ModelConfig
    from xsearch.model import build_model, count_parameters

    cfg = config if isinstance(config, ModelConfig) else ModelConfig.from_dict(dict(config))
    if not 0 < seq_len <= cfg.max_len or batch <= 0:
        raise ValueError(f"need 0 < seq_len <= max_len={cfg.max_len} and batch > 0, got {seq_len}, {batch}")
    feats: dict[str, float] = {f"attention={name}": float(name == cfg.attention) for name in list_attentions()}
    for key, value in sorted(cfg.attention_params.items()):
        name = f"attention.{cfg.attention}.{key}"
        if isinstance(value, bool):
            feats[name] = float(value)
        elif isinstance(value, int):
            feats[name] = _log2(1 + value)
        elif isinstance(value, float):
            feats[name] = value
        elif value is not None:
            feats[f"{name}={value}"] = 1.0
    ffn = cfg.ffn_dims or [cfg.d_ff] * cfg.n_layers
    feats |= {
        "log2_d_model": _log2(cfg.d_model),
        "log2_n_layers": _log2(cfg.n_layers),
        "log2_n_heads": _log2(cfg.n_heads),
        "log2_head_dim": _log2(cfg.head_dim),
        "log2_d_ff": _log2(sum(ffn) / len(ffn)),
        "causal": float(cfg.causal),
        "log2_seq_len": _log2(seq_len),
        "log2_batch": _log2(batch),
    }
    feats |= {f"sharing={mode}": float(cfg.weight_sharing == mode) for mode in WEIGHT_SHARING}
    with torch.random.fork_rng():  # building draws random weights: leave the caller's RNG alone
        torch.manual_seed(0)
        model = build_model(cfg)
        counts = forward_counts(model, seq_len, batch)
    feats["log10_parameters"] = math.log10(count_parameters(model))
    for key, value in counts.items():
        feats[f"log10_{key}"] = math.log10(max(value, 1))
    return feats


# -- metrics and the split -----------------------------------------------------------------------
def mape(actual: Sequence[float], predicted: Sequence[float]) -> float:
    """Mean absolute percentage error, in percent: ``100 * mean(|p - a| / |a|)``."""
    a, p = np.asarray(actual, dtype=float), np.asarray(predicted, dtype=float)
    if a.shape != p.shape or a.size == 0:
        raise ValueError(f"mape needs two equally long, non-empty sequences, got {a.size} and {p.size}")
    if np.any(a == 0):
        raise ValueError("mape is undefined when an actual value is 0")
    return float(100.0 * np.mean(np.abs(p - a) / np.abs(a)))


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's rank correlation tau-b (ties in either sequence accounted for), in [-1, 1].

    Raises:
        ValueError: sequences of different lengths, fewer than two values, or a constant sequence.
    """
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape or a.size < 2:
        raise ValueError(f"kendall_tau needs two equally long sequences of >= 2 values, got {a.size} and {b.size}")
    i, j = np.triu_indices(a.size, k=1)
    da, db = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
    concordant_minus_discordant = float(np.sum(da * db))
    pairs_a, pairs_b = float(np.count_nonzero(da)), float(np.count_nonzero(db))  # pairs not tied
    if pairs_a == 0 or pairs_b == 0:
        raise ValueError("kendall_tau is undefined for a constant sequence")
    return concordant_minus_discordant / math.sqrt(pairs_a * pairs_b)


def architecture_key(config: dict[str, Any]) -> str:
    """What identifies an architecture (its config without dropout), as a string."""
    return json.dumps({k: v for k, v in config.items() if k != "dropout"}, sort_keys=True)


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
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(architecture_key(row.config), []).append(i)
    keys = sorted(groups)
    if len(keys) < 2:
        raise ValueError(f"a held-out split needs at least two distinct architectures, got {len(keys)}")
    random.Random(seed).shuffle(keys)
    n_test = min(len(keys) - 1, max(1, round(test_fraction * len(keys))))
    test = sorted(i for k in keys[:n_test] for i in groups[k])
    train = sorted(i for k in keys[n_test:] for i in groups[k])
    return train, test


# -- the model -----------------------------------------------------------------------------------
MLP_KEYS = ("w1", "b1", "w2", "b2", "w3", "b3")
RIDGE_ALPHAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
WEIGHT_DECAYS = (0.1, 1.0, 10.0)
CV_FOLDS = 4
# Sessions: a session's speed is estimated from the fit's residuals on its rows, then divided out
# of their labels and the model refitted; sessions with fewer rows are left alone.
MIN_SESSION_ROWS = 5
SESSION_ITERATIONS = 3


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


def _grouped_folds(groups: Sequence[str], k: int, seed: int) -> list[np.ndarray]:
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


class _Model:
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

    def fit(self, x: np.ndarray, a: np.ndarray, y: np.ndarray) -> _Model:
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


def _cv_error(x, a, y, folds, make) -> float:
    """Mean squared error (log latency) over the folds of models built by ``make()``."""
    errors = []
    for test in folds:
        train = np.setdiff1d(np.arange(len(y)), test)
        errors.append(np.mean((make().fit(x[train], a[train], y[train])(x[test], a[test]) - y[test]) ** 2))
    return float(np.mean(errors))


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
        self.model: _Model | None = None
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

    def _model(self, additive: bool, alpha: float, weight_decay: float | None, members: int | None = None) -> _Model:
        h = self.hyper
        return _Model(additive, alpha, weight_decay, members or h["members"], h["hidden"], h["epochs"], h["seed"])

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
            raise ValueError(f"fitting needs at least two measured rows, got {len(rows)}")
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
        for test in _grouped_folds(groups, CV_FOLDS, self.hyper["seed"]):
            train = np.setdiff1d(np.arange(len(y)), test)
            model = self._model(*(self.hyper[k] for k in ("additive", "alpha", "weight_decay")), members=1)
            out[test] = model.fit(x[train], a[train], y[train])(x[test], a[test])
        return out

    def _select(self, x: np.ndarray, a: np.ndarray, y: np.ndarray, groups: list[str]) -> dict[str, Any]:
        """Choose the ``"auto"`` settings by cross-validation grouped by architecture (into ``self.hyper``)."""
        additive, alpha, decay = self.hyper["additive"], self.hyper["alpha"], self.hyper["weight_decay"]
        selection: dict[str, Any] = {}
        if "auto" in (additive, alpha, decay) and len(set(groups)) >= CV_FOLDS:
            folds = _grouped_folds(groups, CV_FOLDS, self.hyper["seed"])
            if additive == "auto" or alpha == "auto":  # chosen together: the ridge corrects the additive stage
                grid = [(ad, r) for ad in ((True, False) if additive == "auto" else (additive,))
                        for r in (RIDGE_ALPHAS if alpha == "auto" else (alpha,))]  # fmt: skip
                errs = {g: _cv_error(x, a, y, folds, lambda g=g: self._model(g[0], g[1], None)) for g in grid}
                additive, alpha = min(errs, key=errs.get)
                selection["additive_alpha_cv_mse"] = {f"{ad},{r}": v for (ad, r), v in errs.items()}
            if decay == "auto":
                errs = {d: _cv_error(x, a, y, folds, lambda d=d: self._model(additive, alpha, d, members=1))
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
            raise ValueError("this LatencyPredictor is not fitted")
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
            raise ValueError("this LatencyPredictor is not fitted")
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
            raise ValueError(f"{path} is not an xsearch latency predictor (format {FORMAT!r})")
        try:
            p = cls(doc["target"], doc["device"], **doc["hyper"])
            p.features = list(doc["features"])
            p.mean = np.array(doc["feature_mean"], dtype=np.float64)
            p.std = np.array(doc["feature_std"], dtype=np.float64)
            p.model = p._model(p.hyper["additive"], p.hyper["alpha"], p.hyper["weight_decay"])
            if doc["additive"]["terms"] != ["constant", *ADDITIVE_TERMS]:
                raise ValueError(f"additive terms {doc['additive']['terms']} are not this version's")
            p.additive_scale = np.array(doc["additive"]["scale"][1:], dtype=np.float64)
            p.model.costs = np.array(doc["additive"]["cost"], dtype=np.float64)
            p.model.w = np.array(doc["ridge"]["weight"], dtype=np.float64)
            p.model.b = float(doc["ridge"]["bias"])
            p.model.scale = float(doc["residual_scale"])
            p.model.nets = [{k: np.array(m[k], dtype=np.float64) for k in MLP_KEYS} for m in doc["members"]]
            p.metrics, p.data = dict(doc.get("metrics") or {}), dict(doc.get("data") or {})
            p.sessions = {str(k): float(v) for k, v in (doc.get("sessions") or {}).items()}
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: a malformed latency predictor ({type(e).__name__}: {e})") from None
        n = len(p.features)
        if (
            len(p.mean) != n
            or len(p.std) != n
            or len(p.model.w) != n
            or any(m["w1"].shape[0] != n for m in p.model.nets)
            or len(p.model.costs) != (1 + len(ADDITIVE_TERMS) if p.model.additive else 0)
            or len(p.additive_scale) != len(ADDITIVE_TERMS)
        ):
            raise ValueError(f"{path}: a malformed latency predictor (feature sizes do not match)")
        return p


def row_features(row: LatencyRow) -> dict[str, float]:
    """``architecture_features`` of a measured row."""
    return architecture_features(row.config, row.seq_len, row.batch)


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
        raise ValueError(f"features: {len(features)} given for {len(rows)} rows")
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


def load_for_target(path: str | os.PathLike, target: str, threads: int | None) -> LatencyPredictor:
    """Load a predictor for use on ``target``; warn (logging) when it was fitted on another device.

    Raises:
        ValueError: a predictor fitted for another target (naming both), or a malformed file.
        FileNotFoundError: no such file.
    """
    import logging

    from xsearch.latency import device_fingerprint

    predictor = LatencyPredictor.load(path)
    if predictor.target != target:
        raise ValueError(f"latency predictor {path} was fitted for target {predictor.target!r}, not {target!r}")
    here = device_fingerprint(target, threads)
    differ = sorted(k for k in set(here) | set(predictor.device) if here.get(k) != predictor.device.get(k))
    if differ:
        logging.getLogger("xsearch.search").warning(
            "latency predictor %s was fitted on another device (%s differ: %s here, %s there); predictions may be off",
            path, ", ".join(differ), {k: here.get(k) for k in differ}, {k: predictor.device.get(k) for k in differ},
        )  # fmt: skip
    return predictor
