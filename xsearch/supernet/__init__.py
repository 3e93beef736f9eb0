"""One-shot search: a weight-sharing SuperTransformer over a search space's attention variants, widths,
heads and depths, trained once, from which every subnet is scored with inherited weights and extracted.

    from xsearch.supernet import build_supernet, extract_subnet, save_supernet, load_supernet
    sn = build_supernet("tiny", task.model_fields())
    logits = sn(ids, mask, subnet=cfg)          # cfg: a ModelConfig of the space
    model = extract_subnet(sn, cfg)             # a plain XSearchModel with exactly those weights
    warm_start(sn, trained)                     # the inverse: a trained subnet's weights into the supernet

``import xsearch.supernet`` is light; torch is imported when a name that needs it is used.
"""

from __future__ import annotations

from xsearch._lazy import by_module, lazy_names

_LAZY = by_module(
    {
        "xsearch.supernet.supertransformer": (
            "SuperTransformer SubnetMismatchError build_supernet extract_subnet warm_start"
        ),
        "xsearch.supernet.io": "save_supernet load_supernet check_matches",
        "xsearch.supernet.settings": "SupernetTrainSettings",
        "xsearch.supernet.train": "train_supernet draw_subnets sandwich_loss",
    }
)
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
