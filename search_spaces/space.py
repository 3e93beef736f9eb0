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
    """

    name: str
    model: dict[str, Dim]
    attention: dict[str, dict[str, Dim]]
    reference: dict[str, Any]
    description: str = ""
    excluded: dict[str, str] = field(default_factory=dict)

    def suggest(self, trial, task_fields: dict[str, Any]):
        """Define-by-run suggestions for one trial; returns the ``ModelConfig``."""
        from xsearch.config import ModelConfig

        attention = Dim(choices=tuple(self.attention)).suggest(trial, "attention")
        params = {p: d.suggest(trial, f"attention.{attention}.{p}") for p, d in self.attention[attention].items()}
        dims = {k: d.suggest(trial, k) for k, d in self.model.items()}
        return self._config(attention, params, dims, task_fields, ModelConfig)

    def reference_config(self, task_fields: dict[str, Any]):
        """The reference Transformer as a ``ModelConfig``."""
        from xsearch.config import ModelConfig

        dims = {k: v for k, v in self.reference.items() if k != "attention"}
        return self._config(self.reference.get("attention", "full"), {}, dims, task_fields, ModelConfig)

    def reference_params(self) -> dict[str, Any]:
        """The reference as Optuna parameters (for ``study.enqueue_trial``)."""
        out = {"attention": self.reference.get("attention", "full")}
        for k, d in self.model.items():
            if (d.choices is None or len(d.choices) > 1) and k in self.reference:
                out[k] = self.reference[k]
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
        return yaml.safe_dump(doc, sort_keys=False)

    def size(self) -> float:
        """Number of discrete configurations (inf when a float range is searched)."""

        def count(d: Dim) -> float:
            if d.choices is not None:
                return len(d.choices)
            if d.is_int:
                return (int(d.high) - int(d.low)) // int(d.step or 1) + 1
            return math.inf

        model = math.prod(count(d) for d in self.model.values())
        return model * sum(math.prod(count(d) for d in ps.values()) for ps in self.attention.values())
