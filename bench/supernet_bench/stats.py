"""The statistics a ranking is judged by: Kendall's tau, its permutation p, a paired bootstrap of two taus'
difference, and the tau the ground truth's own noise leaves as a ceiling."""

from __future__ import annotations

import functools

import numpy as np

from xsearch.errors import XSearchError
from xsearch.latency.predictor.holdout import kendall_tau


def tau(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b, or NaN where one side is constant (every proxy tied)."""
    try:
        return kendall_tau(x, y)
    except XSearchError:
        return float("nan")


def permutation_p(x: list[float], y: list[float], draws: int = 5000, seed: int = 0) -> float:
    """One-sided permutation p-value of ``tau(x, y)``: the share of random orders of ``x`` (its ties kept) that
    rank ``y`` at least as well. What chance alone gives a signal with no information about ``y``; NaN where
    the tau is undefined. (Kept per scores: every supernet's ranking asks it again of the same proxy.)"""
    return _permutation_p(tuple(x), tuple(y), draws, seed)


@functools.lru_cache(maxsize=256)
def _permutation_p(x: tuple[float, ...], y: tuple[float, ...], draws: int, seed: int) -> float:
    observed = tau(list(x), list(y))
    if observed != observed:
        return float("nan")
    rng = np.random.default_rng(seed)
    hits = sum(kendall_tau(rng.permutation(x), y) >= observed - 1e-12 for _ in range(draws))
    return (hits + 1) / (draws + 1)


def paired_difference(
    a: list[float], b: list[float], truth: list[float], draws: int = 2000, seed: int = 0
) -> dict[str, float]:
    """``tau(a, truth) - tau(b, truth)`` and its 90% interval over the subnets resampled with replacement (a
    paired bootstrap: both signals ranked on each draw's subnets; draws where either tau is undefined are
    left out): whether one signal ranks better than the other beyond the luck of which subnets were drawn."""
    rng = np.random.default_rng(seed)
    a_, b_, t_ = np.asarray(a), np.asarray(b), np.asarray(truth)
    diffs = []
    for _ in range(draws):
        i = rng.integers(0, len(t_), len(t_))
        diff = tau(list(a_[i]), list(t_[i])) - tau(list(b_[i]), list(t_[i]))
        if not np.isnan(diff):
            diffs.append(diff)
    lo, hi = np.percentile(diffs, [5, 95]) if diffs else (float("nan"), float("nan"))
    return {"difference": tau(a, truth) - tau(b, truth), "low": float(lo), "high": float(hi)}


def noise_ceiling(values: list[float], noise_sd: float, draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """The tau a perfect ranker would reach against ground-truth figures ``values`` measured with noise ``noise_sd``.

    Each figure is the subnet's expected accuracy plus noise (the test split's sampling, a training seed's
    luck). The expected accuracies are taken as ``values`` shrunk toward their mean to the spread the noise
    leaves (variance of ``values`` less ``noise_sd``²); each draw adds new noise and ranks the noisy figures
    against the expected ones. Returns the mean tau and its 5th and 95th percentiles; 0 where the figures
    spread no more than the noise (a ranking of them is a ranking of noise).
    """
    v = np.asarray(values, dtype=float)
    spread = float(v.var(ddof=1)) - noise_sd**2
    if spread <= 0:
        return 0.0, 0.0, 0.0
    expected = v.mean() + (v - v.mean()) * np.sqrt(spread / v.var(ddof=1))
    rng = np.random.default_rng(seed)
    taus = np.sort([kendall_tau(expected, expected + rng.normal(0.0, noise_sd, v.size)) for _ in range(draws)])
    return float(taus.mean()), float(taus[int(0.05 * draws)]), float(taus[int(0.95 * draws)])
