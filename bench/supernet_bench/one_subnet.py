"""``--tables one-subnet``: one subnet trained by the supernet's machinery, alone and shared with part of the
space (``--one-subnet-within``)."""

from __future__ import annotations

import optuna

from supernet_bench.ledgers import Ledger, Scores
from supernet_bench.scoring import accuracy_and_loss
from supernet_bench.spaces import draw_subnets, layout, load_bench_space, model_dims
from xsearch.config import describe_config
from xsearch.supernet import build_supernet, extract_subnet
from xsearch.supernet.settings import LAYOUT_DEFAULTS, SupernetTrainSettings
from xsearch.supernet.train import train_supernet

# --one-subnet-within: the part of the space each row's supernet draws (the rest kept at the subnet's own):
# one of these halves, or model dimensions of the space joined by '+' (d_model, n_layers+weight_sharing, ...)
WITHIN = {"attention": "every attention variant, the subnet's sizes kept",
          "model": "every size, depth and sharing, the subnet's attention kept"}  # fmt: skip


def within_dims(part: str, space) -> tuple[str, ...]:
    """The dimensions of ``space`` a ``--one-subnet-within`` part draws (``attention`` for the variant and its
    parameters, alone or joined to model dimensions); an unknown one exits naming it."""
    if part in WITHIN:
        return ("attention",) if part == "attention" else tuple(space.model)
    dims = tuple(part.split("+"))
    if unknown := [d for d in dims if d not in space.model and d != "attention"]:
        raise SystemExit(f"--one-subnet-within: unknown part {part!r} ({', '.join(unknown)}: not a model "
                         f"dimension of the space {space.name!r}; valid: {', '.join([*WITHIN, *space.model])}, "
                         "or dimensions joined by '+')")  # fmt: skip
    return dims


def space_params(space, cfg) -> dict:
    """A config of ``space`` (one attention for the whole model) as the values of its draw, under the names the
    space's ``suggest`` gives them (``attention``, ``attention.<variant>.<param>``, each model dimension)."""
    own = {f"attention.{cfg.attention}.{k}": v for k, v in cfg.attention_params.items()}
    return {"attention": cfg.attention, **own, **{k: v for k, v in model_dims(cfg).items() if k in space.model}}


def mixed(space, fields: dict, cfg, drawn, dims: tuple[str, ...]):
    """``cfg`` with ``drawn``'s values of ``dims`` (``attention`` for the variant and its parameters), built by the
    space itself from those values (its FFN and head widths follow the width, FFN ratio and heads)."""
    own, other = space_params(space, cfg), space_params(space, drawn)
    values = {n: v for n, v in own.items() if n.split(".")[0] not in dims}
    values |= {n: v for n, v in other.items() if n.split(".")[0] in dims}
    return space.suggest(optuna.trial.FixedTrial(values), fields)


def within_label(part: str) -> str:
    return WITHIN.get(part) or f"every {part.replace('+', ' and ')}, the rest of the subnet kept"


def one_subnet(task, args) -> dict:
    """The supernet's machinery (its shapes, initialization, slicing and training loop) given one subnet to train
    every step instead of a draw, at each of ``--one-subnet-steps``: how far the shared supernet's
    ``--supernet-steps`` passes over the whole space take that subnet, in steps of training it alone. Printed
    beside the subnet's inherited scores in ``--scores`` and its standalone figures in ``--ledger``. With
    ``--one-subnet-within``, also supernets of ``--supernet-steps`` passes drawn over half the space (every
    attention variant at the subnet's sizes, or every size at its attention): which sharing holds it back."""
    from unittest import mock

    import xsearch.supernet.train as supernet_train

    name = args.spaces.split(",")[0]
    space = load_bench_space(name, task, args)
    subnets = draw_subnets(space, task, args)
    if not 1 <= args.one_subnet <= len(subnets):
        raise SystemExit(f"--one-subnet {args.one_subnet}: the space {name!r} has subnets 1 to {len(subnets)} drawn")
    cfg = subnets[args.one_subnet - 1]
    uniform = supernet_train.draw_subnets

    def trained(steps: int, draw) -> dict:
        sn = build_supernet(space, task.model_fields(), seed=args.supernet_seed, **layout(args))
        with mock.patch.object(supernet_train, "draw_subnets", draw):
            settings = SupernetTrainSettings(steps=steps, lr=args.lr, seed=args.supernet_seed, **layout(args))
            train_supernet(sn, task, settings, progress=False)
        model = extract_subnet(sn, cfg)
        (valid, valid_loss), (test, _) = accuracy_and_loss(model, task, "valid"), accuracy_and_loss(model, task, "test")
        return {"steps": steps, "valid": valid, "valid_loss": valid_loss, "test": test}

    if args.one_subnet_within and space.per_layer:
        raise SystemExit(f"--one-subnet-within: the space {name!r} draws each layer's attention; give a space "
                         "that draws one for the whole model")  # fmt: skip
    parts = {part: within_dims(part, space) for part in args.one_subnet_within}
    rows = [trained(int(steps), lambda *_, **__: [cfg]) for steps in filter(None, args.one_subnet_steps.split(","))]
    within = []
    for part, dims in parts.items():

        def draw(sn_space, fields, *a, _dims=dims, **kw):  # the space's uniform draw of the part, the rest kept
            return [mixed(sn_space, fields, cfg, uniform(sn_space, fields, *a, **kw)[0], _dims)]

        within.append({"within": part, **trained(args.supernet_steps, draw)})
    run = Scores(args.scores, args).get(name, "uniform", subnets) if args.scores else None
    shared = next((s for s in run["scores"] if s["config"] == describe_config(cfg)), None) if run else None
    alone = Ledger(args.ledger, args).repeats.get((name, describe_config(cfg)), {}) if args.ledger else {}
    print()
    scaled = "".join(f" ({k.replace('_', ' ')} {v})" for k, v in layout(args).items() if v != LAYOUT_DEFAULTS[k])
    print(f"One subnet ({name} {args.one_subnet}: {describe_config(cfg)}) trained alone by the supernet's "
          f"machinery{scaled}")  # fmt: skip
    print("| trained | steps | valid accuracy | valid loss | test accuracy | chance (test) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| alone, in the supernet | {r['steps']} | {r['valid']:.4f} | {r['valid_loss']:.4f} | {r['test']:.4f} | "
              f"{task.chance('test'):.4f} |")  # fmt: skip
    for r in within:
        print(f"| shared: the uniform supernet over {within_label(r['within'])} | {r['steps']} passes | "
              f"{r['valid']:.4f} | {r['valid_loss']:.4f} | {r['test']:.4f} | {task.chance('test'):.4f} |")  # fmt: skip
    if shared and "inherited_loss" in shared:
        print(
            f"| shared: the uniform supernet over the space | {run['subnet_passes']} passes, all subnets | "
            f"{shared['inherited_valid']:.4f} | {shared['inherited_loss']:.4f} | - | {task.chance('test'):.4f} |"
        )
    if alone:
        seeds = ", ".join(f"{seed}: {acc:.4f}" for seed, acc in sorted(alone.items()))
        print(f"| standalone (ledger, by training seed) | {args.standalone_steps} | - | - | {seeds} | "
              f"{task.chance('test'):.4f} |")  # fmt: skip
    return {"space": name, "subnet": describe_config(cfg), "rows": rows, "within": within, "shared": shared,
            "standalone": alone}  # fmt: skip
