"""Options several tasks share, declared once (the sizes of generated splits, the shares held out of a
file), and how a task's options are checked. Each task's options are a settings dataclass (see
``xsearch.settings``); no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xsearch.errors import SettingError
from xsearch.settings import Settings, from_mapping, option


def checked(cls: type, task: str, values: dict[str, Any]):
    """``cls(**values)``, its errors naming ``task``'s options (``task 'listops': option 'max_len' must be ...``).

    Raises:
        SettingError: an unknown option, a value of the wrong type or out of range, a broken rule.
    """
    return from_mapping(cls, values, name=lambda f: f"option {f!r}", source=f"task {task!r}: ")


@dataclass
class SplitSizes(Settings):
    """How many examples a generated task draws for each split."""

    n_train: int = option(2000, "training examples", ge=1)
    n_valid: int = option(200, "validation examples", ge=1)
    n_test: int = option(200, "test examples", ge=1)


@dataclass
class HeldOut(Settings):
    """The shares of one file held out as the validation and test splits."""

    valid_fraction: float = option(0.1, "share of the data held out as the valid split", ge=0, lt=1)
    test_fraction: float = option(0.1, "share of the data held out as the test split", ge=0, lt=1)

    def rules(self) -> None:
        if self.valid_fraction + self.test_fraction >= 1:
            raise SettingError(
                ("valid_fraction", "test_fraction"),
                f"{{0}} + {{1}} must be < 1 (something is left to train on), got {self.valid_fraction} + "
                f"{self.test_fraction}",
            )
