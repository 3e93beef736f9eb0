"""Draws from a space without an Optuna study (supernet training, benchmarks): ``RandomDraw`` (uniform),
``BoundaryDraw`` (the largest or the smallest configuration) and ``ShrinkingDraw`` (uniform over the top of
each range, for progressive shrinking)."""

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


def numeric(choices: list[Any]) -> bool:
    """Whether a list of choices is ordered by size (numbers, not flags)."""
    return all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices)


def preferred(prefer: dict[str, Any], name: str, choices: list[Any]) -> Any:
    """``prefer``'s value for the Optuna name ``name`` (matched on its last part, so ``attention`` also names
    ``layers.2.attention``) when it is one of ``choices``, else None."""
    wanted = prefer.get(name.rsplit(".", 1)[-1])
    return wanted if wanted is not None and wanted in choices else None


class BoundaryDraw(RandomDraw):
    """The largest (``end="max"``) or the smallest (``end="min"``) configuration of a space, for the sandwich rule.

    Every numeric value (a range, or a list of numbers) takes its top or its bottom. A list of other values
    (attention variants, weight-sharing modes, flags) has no order: it takes ``prefer[name]`` when given and
    offered (matched on the last part of the Optuna name, so ``attention`` also names ``layers.2.attention``),
    else a uniform draw from ``rng``.
    """

    def __init__(self, rng: random.Random, end: str, prefer: dict[str, Any] | None = None) -> None:
        if end not in ("max", "min"):
            raise ValueError(f"end must be 'max' or 'min', got {end!r}")
        super().__init__(rng)
        self.end = end
        self.prefer = dict(prefer or {})

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        choices = list(choices)
        if numeric(choices):
            return self._keep(name, max(choices) if self.end == "max" else min(choices))
        wanted = preferred(self.prefer, name, choices)
        if wanted is not None:
            return self._keep(name, wanted)
        return super().suggest_categorical(name, choices)

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        top = low + (high - low) // step * step
        return self._keep(name, top if self.end == "max" else low)

    def suggest_float(self, name: str, low: float, high: float, step: float | None = None, log: bool = False) -> float:
        if self.end == "min":
            return self._keep(name, low)
        return self._keep(name, low + int((high - low) / step) * step if step else high)


class ShrinkingDraw(RandomDraw):
    """A draw from the top of the space, for progressive shrinking (once-for-all): ``reach`` says how far down.

    Each numeric value (a range, or a list of numbers) is drawn uniformly from its largest
    ``1 + floor(reach * (n - 1))`` of its ``n`` values: at ``reach=0`` every number takes its top (as
    ``BoundaryDraw("max")``), at ``reach=1`` the draw is uniform (as ``RandomDraw``). A list of other values
    takes ``prefer[name]`` (matched as ``BoundaryDraw`` matches it) with probability ``1 - reach`` when offered,
    else a uniform draw.
    """

    def __init__(self, rng: random.Random, reach: float, prefer: dict[str, Any] | None = None) -> None:
        if not 0.0 <= reach <= 1.0:
            raise ValueError(f"reach must be in [0, 1], got {reach!r}")
        super().__init__(rng)
        self.reach = reach
        self.prefer = dict(prefer or {})

    def _top(self, n: int) -> int:
        """How many of ``n`` values, counted from the top, may be drawn."""
        return 1 + int(self.reach * (n - 1))

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        choices = list(choices)
        if numeric(choices):
            ranked = sorted(set(choices), reverse=True)
            return self._keep(name, self.rng.choice(ranked[: self._top(len(ranked))]))
        wanted = preferred(self.prefer, name, choices)
        if wanted is not None and self.rng.random() >= self.reach:
            return self._keep(name, wanted)
        return super().suggest_categorical(name, choices)

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        n = (high - low) // step + 1
        return self._keep(name, low + (n - 1 - self.rng.randrange(self._top(n))) * step)

    def suggest_float(self, name: str, low: float, high: float, step: float | None = None, log: bool = False) -> float:
        if step:
            n = int(round((high - low) / step)) + 1
            return self._keep(name, low + (n - 1 - self.rng.randrange(self._top(n))) * step)
        return self._keep(name, self.rng.uniform(high - self.reach * (high - low), high))
