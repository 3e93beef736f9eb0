"""The options of the compression steps, each defined once (``xsearch compress``/``adapt`` flags and the
pipeline's ``compress:`` section are built from them). No torch import."""

from __future__ import annotations

from dataclasses import dataclass

from xsearch.settings import Settings, option, same_as
from xsearch.training.settings import TrainSettings

IMPORTANCE = ("magnitude", "taylor")
ADAPTER_KINDS = ("lora", "bottleneck")


@dataclass
class CompressSettings(Settings):
    """Structured pruning, then fine-tuning (distilled from a teacher when one is given)."""

    prune_heads: float = option(0.0, "fraction of attention heads removed (the same number in every layer)",
                                ge=0, lt=1)  # fmt: skip
    prune_ffn: float = option(0.0, "fraction of FFN channels removed", ge=0, lt=1)
    importance: str = option("magnitude", "what decides which heads and channels stay", choices=IMPORTANCE)
    finetune_steps: int = option(0, "fine-tuning steps after pruning (0: none)", ge=0)
    temperature: float = option(2.0, "distillation temperature", gt=0)
    alpha: float = option(0.5, "weight of the teacher's soft targets against the labels", ge=0, le=1)
    lr: float = option(1e-3, "fine-tuning learning rate", gt=0)
    batch_size: int = option(32, "fine-tuning examples per step", ge=1)
    seed: int = option(0, "seeds the fine-tuning")
    keep_best: bool = option(False, "end fine-tuning with the weights of its validation point of lowest loss")
    device: str = same_as(TrainSettings, "device", help="where to fine-tune (with the teacher): cpu, cuda or cuda:N "
                          "(a CUDA GPU torch sees; no fallback to the CPU)")  # fmt: skip


@dataclass
class AdapterSettings(Settings):
    """Task adapters on a frozen model."""

    kind: str = option("lora", "lora (low-rank updates of the projections) or bottleneck", choices=ADAPTER_KINDS)
    size: int = option(8, "LoRA rank or bottleneck width", ge=1)
    targets: str = option("q_proj,v_proj", "LoRA's target projections, comma-separated")

    def target_names(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.targets.split(",") if t.strip())
