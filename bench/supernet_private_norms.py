"""An experiment, not a library option: bench/supernet.py with every width given its own LayerNorms and
classifier head in the supernet (slimmable networks' switchable normalisation), patched into
``SuperTransformer``. It takes bench/supernet.py's arguments, e.g. ``python bench/supernet_private_norms.py
--max-len 512 --n-train 32000 --n-eval 2000 --tables one-subnet --spaces default --one-subnet-steps ''
--one-subnet-within d_model --supernet-steps 1500``. Not for --scores or --supernet-work: the patched
supernets' scores and checkpoints are not told apart from plain ones."""

import runpy
import sys

from torch import nn

import xsearch.supernet as S
import xsearch.supernet.supertransformer as ST

PRIVATE = ("ln1.", "ln2.", "ln_f.", "head.")
orig_template, orig_build = ST.SuperTransformer._template, S.build_supernet


def private(source: str) -> bool:
    return any(f".{p}" in f".{source}" for p in PRIVATE)


def build(space, fields, **kw):
    sn = orig_build(space, fields, **kw)
    for name in [n for n in sn.shapes if private(n)]:
        for w in space.model["d_model"].values():
            own = f"{name}@d{w}"
            sn.weights[ST._key(own)] = nn.Parameter(sn.tensor(name).detach().clone())
            sn.shapes[own] = sn.shapes[name]
    return sn


def template(self, cfg):
    model, mapping = orig_template(self, cfg)
    for name, s in list(mapping.items()):
        if private(s.source) and "@d" not in s.source:
            mapping[name] = s._replace(source=f"{s.source}@d{cfg.d_model}")
    return model, mapping


ST.SuperTransformer._template = template
S.build_supernet = build
sys.path.insert(0, "bench")
sys.argv = ["bench/supernet.py", *sys.argv[1:]]
runpy.run_path("bench/supernet.py", run_name="__main__")
