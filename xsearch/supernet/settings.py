"""``SupernetTrainSettings``: every option of a supernet's training, defined once (``xsearch supernet train``'s
flags and the pipeline's ``supernet:`` section are built from it). No torch import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from xsearch.errors import SettingError
from xsearch.settings import Settings, option, same_as
from xsearch.training.settings import TrainSettings

SAMPLING = ("uniform", "sandwich", "progressive")
#: How a subnet's narrower slice of a Linear weight is scaled (``SuperTransformer``'s ``width_scaling``).
WIDTH_SCALING = ("none", "fan_in")
#: How the shared q/k/v/out projections hold every width's heads (``SuperTransformer``'s ``head_layout``).
HEAD_LAYOUTS = ("leading", "per_head")
#: The layout options' values in a supernet saved before the option.
LAYOUT_DEFAULTS = {"width_scaling": "none", "head_layout": "leading"}


@dataclass
class SupernetTrainSettings(Settings):
    """A supernet's training budget and recipe: exactly one of ``steps`` and ``seconds``."""

    ALTERNATIVES: ClassVar[tuple[tuple[str, ...], ...]] = (("steps", "seconds"),)

    steps: int | None = same_as(TrainSettings, "steps", help="optimizer steps, one sampled subnet each")
    seconds: float | None = same_as(TrainSettings, "seconds")
    batch_size: int = same_as(TrainSettings, "batch_size")
    lr: float = same_as(TrainSettings, "lr")
    warmup: float = same_as(TrainSettings, "warmup")
    weight_decay: float = same_as(TrainSettings, "weight_decay")
    grad_clip: float = same_as(TrainSettings, "grad_clip")
    seed: int = same_as(TrainSettings, "seed", help="seeds the initial weights, the subnet draws and the batch order")
    sampling: str = option("uniform", "which subnets each step trains: uniform (one drawn uniformly, as HAT), "
                           "sandwich (the largest on the labels; the smallest and --sandwich-random uniform draws "
                           "distilled from it, as BigNAS) or progressive (one drawn from the top of each size "
                           "range, the range let down to its bottom over --shrink-fraction of the steps, as "
                           "once-for-all)", choices=SAMPLING)  # fmt: skip
    sandwich_random: int = option(2, "the sandwich rule's uniformly drawn subnets per step", ge=0)
    shrink_fraction: float = option(0.5, "progressive sampling: the fraction of the steps over which smaller "
                                    "sizes are let in (uniform after it)", gt=0, le=1)  # fmt: skip
    width_scaling: str = option("none", "how a subnet's slice of a Linear weight that takes fewer inputs than the "
                                "supernet's is scaled: none (the plain leading slice, as HAT) or fan_in (times "
                                "sqrt(the supernet's inputs / the subnet's), so every width starts at its own "
                                "initial scale)", choices=WIDTH_SCALING)  # fmt: skip
    head_layout: str = option("leading", "how the shared q/k/v/out projections hold the heads: leading (a subnet's "
                              "rows are the leading slice, so a narrower width's heads cut across a wider one's) or "
                              "per_head (one block of rows per head index; head h of every width is the leading "
                              "part of block h, as elastic heads of one width are in HAT)",
                              choices=HEAD_LAYOUTS)  # fmt: skip
    device: str = same_as(TrainSettings, "device")
    checkpoint_every: int = option(200, "steps between checkpoints (a killed run resumes from the last)", ge=1)

    def rules(self) -> None:
        TrainSettings.rules(self)  # exactly one budget
        if self.sampling == "progressive" and self.steps is None:
            raise SettingError(("sampling", "steps", "seconds"), "{0}=progressive shrinks on a schedule of steps: "
                               "give {1}, not {2}")  # fmt: skip

    @property
    def layout(self) -> dict[str, str]:
        """The supernet's layout these settings train (``build_supernet``'s keywords, ``SuperTransformer.layout``)."""
        return {key: getattr(self, key) for key in LAYOUT_DEFAULTS}

    @property
    def subnets_per_step(self) -> int:
        """Subnet passes one step makes: the largest, the smallest and the uniform draws with the sandwich rule;
        1 with the others."""
        return 2 + self.sandwich_random if self.sampling == "sandwich" else 1
