"""One searchable value of a space: a list of choices, an int or float range, or a constant."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xsearch.errors import XSearchError


class SpaceError(XSearchError):
    """A search space file that is malformed or names something that does not exist."""


@dataclass(frozen=True)
class Dim:
    """One searchable value: ``choices`` (categorical), or an int/float range, or a constant."""

    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False

    @property
    def is_range(self) -> bool:
        return self.choices is None

    @property
    def is_int(self) -> bool:
        return self.is_range and isinstance(self.low, int) and isinstance(self.high, int)

    def values(self) -> list[Any]:
        """Representative values (all choices, or the ends of a range) for validation."""
        return list(self.choices) if self.choices is not None else [self.low, self.high]

    def every_value(self) -> list[Any]:
        """Every value a draw can take: the choices, or each int of an int range (a float range has no list)."""
        if self.choices is not None:
            return list(self.choices)
        if not self.is_int:
            raise SpaceError(f"a float range ({self.low} to {self.high}) has no finite list of values")
        return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))

    def suggest(self, trial, name: str) -> Any:
        if self.choices is not None:
            if len(self.choices) == 1:
                return self.choices[0]
            return trial.suggest_categorical(name, list(self.choices))
        if self.is_int:
            return trial.suggest_int(name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(name, float(self.low), float(self.high), step=self.step, log=self.log)

    def to_yaml(self) -> Any:
        if self.choices is not None:
            return list(self.choices)
        out = {"low": self.low, "high": self.high}
        if self.step is not None:
            out["step"] = self.step
        if self.log:
            out["log"] = True
        return out


def parse_dim(where: str, raw: Any) -> Dim:
    if isinstance(raw, list):
        if not raw:
            raise SpaceError(f"{where}: empty list of choices")
        if len({type(v) for v in raw}) > 1 and not all(isinstance(v, (int, float)) for v in raw):
            raise SpaceError(f"{where}: mixed value types in {raw!r}")
        return Dim(choices=tuple(raw))
    if isinstance(raw, dict):
        unknown = sorted(set(raw) - {"low", "high", "step", "log"})
        if unknown:
            raise SpaceError(f"{where}: unknown range key {unknown[0]!r} (valid: low, high, step, log)")
        if "low" not in raw or "high" not in raw:
            raise SpaceError(f"{where}: a range needs 'low' and 'high', got {raw!r}")
        low, high = raw["low"], raw["high"]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)):
            raise SpaceError(f"{where}: 'low' and 'high' must be numbers, got {low!r}, {high!r}")
        if low > high:
            raise SpaceError(f"{where}: low={low} is greater than high={high}")
        log_scale = raw.get("log", False)
        if not isinstance(log_scale, bool):
            raise SpaceError(f"{where}: 'log' must be true or false, got {log_scale!r}")
        if log_scale and low <= 0:
            raise SpaceError(f"{where}: a log range needs low > 0, got {low}")
        return Dim(low=low, high=high, step=raw.get("step"), log=log_scale)
    if isinstance(raw, (int, float, str, bool)):
        return Dim(choices=(raw,))
    raise SpaceError(f"{where}: expected a list, a {{low, high}} range or a value, got {raw!r}")
