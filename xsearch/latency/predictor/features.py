"""The features of an architecture at an input shape, and ``LatencyRow``: one measured architecture."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from xsearch.errors import XSearchError
from xsearch.latency.predictor.counting import forward_counts


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


def _log2(x: float) -> float:
    return math.log2(max(float(x), 1e-9))


def architecture_features(config, seq_len: int, batch: int = 1) -> dict[str, float]:
    """The features of one architecture at one input shape.

    Args:
        config: a ``ModelConfig`` or its dict.
        seq_len: tokens per sequence.
        batch: sequences per call.

    Returns:
        Feature name -> value: ``attention=<name>`` (the fraction of the layers using each
        registered variant: 0/1 for a uniform model), the variant's parameters as
        ``attention.<name>.<param>`` (integers as ``log2(1 + v)``, booleans 0/1, strings one-hot
        as ``attention.<name>.<param>=<value>``; summed over the layers and divided by their
        number), ``log2_*`` sizes (d_model, n_layers, and of the layers' mean n_heads, head_dim
        and d_ff, the real FFN widths,
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
        raise XSearchError(f"need 0 < seq_len <= max_len={cfg.max_len} and batch > 0, got {seq_len}, {batch}")
    layers = cfg.layer_configs()
    share = 1.0 / len(layers)  # a per-layer model: each variant's fraction of the layers, its parameters' mean
    feats: dict[str, float] = {f"attention={name}": 0.0 for name in list_attentions()}
    for layer in layers:
        feats[f"attention={layer['attention']}"] += share
        for key, value in sorted(layer["attention_params"].items()):
            name = f"attention.{layer['attention']}.{key}"
            if isinstance(value, bool):
                value = float(value)
            elif isinstance(value, int):
                value = _log2(1 + value)
            elif isinstance(value, float):
                pass
            elif value is not None:
                name, value = f"{name}={value}", 1.0
            else:
                continue
            feats[name] = feats.get(name, 0.0) + value * share

    def mean(key: str) -> float:
        return sum(layer[key] for layer in layers) / len(layers)

    feats |= {
        "log2_d_model": _log2(cfg.d_model),
        "log2_n_layers": _log2(cfg.n_layers),
        "log2_n_heads": _log2(mean("n_heads")),
        "log2_head_dim": _log2(mean("head_dim")),
        "log2_d_ff": _log2(mean("d_ff")),
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


def row_features(row: LatencyRow) -> dict[str, float]:
    """``architecture_features`` of a measured row."""
    return architecture_features(row.config, row.seq_len, row.batch)


def architecture_key(config: dict[str, Any]) -> str:
    """What identifies an architecture (its config without dropout), as a string."""
    return json.dumps({k: v for k, v in config.items() if k != "dropout"}, sort_keys=True)
