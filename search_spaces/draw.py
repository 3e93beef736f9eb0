"""``RandomDraw``: uniform draws from a space without an Optuna study (supernet training, benchmarks)."""

from __future__ import annotations

import math
import random
from typing import Any


class RandomDraw:
    """Stands in for an Optuna trial in ``SearchSpace.suggest``: each value drawn uniformly.

    ``params`` records what was drawn, under the names Optuna would use, so a draw can be
    replayed as an enqueued trial. One ``RandomDraw`` is one configuration: draw again with a
    new one, sharing the ``random.Random``.
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.params: dict[str, Any] = {}

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        return self._keep(name, self.rng.choice(list(choices)))

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        if log:
            value = int(round(math.exp(self.rng.uniform(math.log(low), math.log(high)))))
            value = low + (value - low) // step * step
        else:
            value = low + step * self.rng.randrange((high - low) // step + 1)
        return self._keep(name, value)

    def suggest_float(self, name: str, low: float, high: float, step: float | None = None, log: bool = False) -> float:
        if log:
            value = math.exp(self.rng.uniform(math.log(low), math.log(high)))
        elif step:
            value = low + step * self.rng.randrange(int(round((high - low) / step)) + 1)
        else:
            value = self.rng.uniform(low, high)
        return self._keep(name, value)

    def _keep(self, name: str, value: Any) -> Any:
        self.params[name] = value
        return value
