"""``SearchSpace``: a validated space, turned into define-by-run Optuna suggestions (``suggest(trial)``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import yaml

from xsearch.search_spaces.dims import Dim


@dataclass
class SearchSpace:
    """A validated search space.

    Attributes:
        name: the space's name.
        model: model dimension -> ``Dim``.
        attention: variant name -> {parameter -> ``Dim``}.
        reference: the vanilla Transformer configuration (model keys, ``attention: full``).
        excluded: variants removed on load, with the reason.
        per_layer: each layer draws its own attention, parameters, heads and FFN ratio (Optuna
            names ``layers.<i>.attention``, ``layers.<i>.attention.<variant>.<param>``,
            ``layers.<i>.n_heads``, ``layers.<i>.ffn_ratio``); depth and width stay one draw.
    """

    name: str
    model: dict[str, Dim]
    attention: dict[str, dict[str, Dim]]
    reference: dict[str, Any]
    description: str = ""
    excluded: dict[str, str] = field(default_factory=dict)
    per_layer: bool = False

    #: The model dimensions a per-layer space draws for each layer.
    LAYER_DIMS = ("n_heads", "ffn_ratio")

    def suggest(self, trial, task_fields: dict[str, Any]):
        """Define-by-run suggestions for one trial; returns the ``ModelConfig``.

        ``trial`` is an Optuna trial, or anything with its ``suggest_categorical``,
        ``suggest_int`` and ``suggest_float`` (``RandomDraw`` draws without a study).
        """
        from xsearch.config import ModelConfig

        if not self.per_layer:
            attention, params = self._suggest_attention(trial, "")
            dims = {k: d.suggest(trial, k) for k, d in self.model.items()}
            return self._config(attention, params, dims, task_fields, ModelConfig)
        dims = {k: d.suggest(trial, k) for k, d in self.model.items() if k not in self.LAYER_DIMS}
        layers = []
        for i in range(dims["n_layers"]):
            attention, params = self._suggest_attention(trial, f"layers.{i}.")
            own = {k: self.model[k].suggest(trial, f"layers.{i}.{k}") for k in self.LAYER_DIMS if k in self.model}
            layers.append({"attention": attention, "attention_params": params, **own})
        return self._layered_config(dims, layers, task_fields, ModelConfig)

    def _suggest_attention(self, trial, prefix: str) -> tuple[str, dict[str, Any]]:
        attention = Dim(choices=tuple(self.attention)).suggest(trial, f"{prefix}attention")
        params = self.attention[attention]
        return attention, {p: d.suggest(trial, f"{prefix}attention.{attention}.{p}") for p, d in params.items()}

    def _layered_config(self, dims, layers, task_fields, model_config_cls):
        entries = []
        for layer in layers:
            entry = {k: v for k, v in layer.items() if k != "ffn_ratio"}
            entry["d_ff"] = max(1, int(round(dims["d_model"] * layer.get("ffn_ratio", 4))))
            entry.setdefault("n_heads", self.reference["n_heads"])
            entries.append(entry)
        first = entries[0]
        cfg = {**dims, "attention": first["attention"], "attention_params": first["attention_params"],
               "n_heads": first["n_heads"], "d_ff": first["d_ff"], "layers": entries, **task_fields}  # fmt: skip
        return model_config_cls.from_dict(cfg)

    def reference_config(self, task_fields: dict[str, Any]):
        """The reference Transformer as a ``ModelConfig``."""
        from xsearch.config import ModelConfig

        dims = {k: v for k, v in self.reference.items() if k != "attention"}
        return self._config(self.reference.get("attention", "full"), {}, dims, task_fields, ModelConfig)

    def reference_params(self) -> dict[str, Any]:
        """The reference as Optuna parameters (for ``study.enqueue_trial``)."""
        searched = {k for k, d in self.model.items() if (d.choices is None or len(d.choices) > 1)}
        attention = self.reference.get("attention", "full")
        if not self.per_layer:
            return {"attention": attention} | {k: self.reference[k] for k in self.model if k in searched}
        out = {k: self.reference[k] for k in self.model if k in searched and k not in self.LAYER_DIMS}
        for i in range(self.reference["n_layers"]):
            out[f"layers.{i}.attention"] = attention
            out |= {f"layers.{i}.{k}": self.reference[k] for k in self.LAYER_DIMS if k in searched}
        return out

    @staticmethod
    def _config(attention, params, dims, task_fields, model_config_cls):
        dims = dict(dims)
        ratio = dims.pop("ffn_ratio", 4)
        cfg = {**dims, "attention": attention, "attention_params": params, **task_fields}
        cfg["d_ff"] = max(1, int(round(cfg["d_model"] * ratio)))
        return model_config_cls.from_dict(cfg)

    def to_yaml(self) -> str:
        doc = {
            "name": self.name,
            "description": self.description,
            "reference": self.reference,
            "model": {k: d.to_yaml() for k, d in self.model.items()},
            "attention": {a: {p: d.to_yaml() for p, d in ps.items()} for a, ps in self.attention.items()},
        }
        if self.per_layer:
            doc["per_layer"] = True
        return yaml.safe_dump(doc, sort_keys=False)

    def size(self) -> float:
        """Number of discrete configurations (inf when a float range is searched)."""

        def count(d: Dim) -> float:
            if d.choices is not None:
                return len(d.choices)
            if d.is_int:
                return (int(d.high) - int(d.low)) // int(d.step or 1) + 1
            return math.inf

        attention = sum(math.prod(count(d) for d in ps.values()) for ps in self.attention.values())
        if not self.per_layer:
            return math.prod(count(d) for d in self.model.values()) * attention
        layer = attention * math.prod(count(self.model[k]) for k in self.LAYER_DIMS if k in self.model)
        shared = math.prod(count(d) for k, d in self.model.items() if k not in (*self.LAYER_DIMS, "n_layers"))
        return shared * sum(layer**n for n in self.model["n_layers"].every_value())
