"""One-shot search: a weight-sharing SuperTransformer over a search space's attention variants, widths,
heads and depths, trained once, from which every subnet is scored with inherited weights and extracted.

    from xsearch.supernet import build_supernet, extract_subnet, save_supernet, load_supernet
    sn = build_supernet("tiny", task.model_fields())
    logits = sn(ids, mask, subnet=cfg)          # cfg: a ModelConfig of the space
    model = extract_subnet(sn, cfg)             # a plain XSearchModel with exactly those weights
"""

from xsearch.supernet.io import load_supernet, save_supernet
from xsearch.supernet.supertransformer import SubnetMismatchError, SuperTransformer, build_supernet, extract_subnet

__all__ = ["SubnetMismatchError", "SuperTransformer", "build_supernet", "extract_subnet", "load_supernet",
           "save_supernet"]  # fmt: skip
