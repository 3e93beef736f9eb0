"""Does a supernet's inherited-weight score rank architectures as training them would? And what does it cost?

For each space (``--spaces``, default ``default`` and ``per_layer``) on ListOps at ``--max-len`` tokens:

1. a supernet over the space is trained for ``--supernet-steps`` subnet passes, one per step drawn uniformly
   (``--sampling uniform``) and/or, with ``--sampling sandwich``, the sandwich rule's 2 + ``--sandwich-random``
   subnets a step (fewer steps, the same passes), and/or, with ``--sampling progressive``, one subnet a step
   drawn from the top of each size range, the ranges let down to uniform over the first ``--shrink-fraction``
   of the steps (once-for-all's progressive shrinking; 0.5);
2. ``--subnets`` subnets are drawn uniformly (seeded); each is scored on the validation split with its
   inherited weights (no training): the one-shot search's signal, its accuracy and its mean cross-entropy (the
   loss, which HAT ranks by, still tells apart subnets whose predictions, and so accuracies, are the same);
3. each is trained from scratch for ``--proxy-steps`` steps (the standalone search's per-trial budget, 200 by
   default): today's proxy, scored on the validation split;
4. each is trained standalone from scratch for ``--standalone-steps`` steps and scored on the test split: the
   ground truth both signals are ranked against (Kendall tau-b; the chance level is printed beside).

Budgets are in steps (seconds are printed, and depend on the machine's load). The protocol of the supernet
issue is ``--max-len 512 --subnets 24 --standalone-steps 1000`` (hours on 2 cores); smaller runs say so. Run it
with ``--n-train 32000 --n-eval 2000``: a 2,000-example test split (LRA's size) has a sampling noise of about
1.1 points at 35% accuracy, where 500 examples have 2.1, enough alone to cap the tau a ranking can show; and
1,000 steps of 32 examples then see each training example once. The ledger of that run is
``bench/results/supernet-ranking-listops512.jsonl``:

    python bench/supernet.py --max-len 512 --n-train 32000 --n-eval 2000 --truth-only \
        --ledger bench/results/supernet-ranking-listops512.jsonl [--max-new N]

Steps 3 and 4 do not depend on the supernet: ``--ledger`` keeps their figures as each subnet is measured, so
they can be gathered over several sittings (``--truth-only --max-new N``) and a supernet ranked against them
later. Steps 1 and 2 do not depend on the ground truth: ``--scores`` keeps each supernet's inherited score of
every drawn subnet, so a supernet is trained once per space, rule and budget (about an hour at the protocol's)
and ranked again, without training, as the ledger fills. While the ledger lacks some subnets the ranking is
taken over those it holds and printed as PARTIAL (``--max-new 0`` trains none of them now, but a space and
rule without kept scores, or with scores from before the losses were kept, gets its supernet trained, which
``--rank-only`` refuses: it trains nothing):

    python bench/supernet.py --max-len 512 --n-train 32000 --n-eval 2000 --rank-only \
        --ledger bench/results/supernet-ranking-listops512.jsonl \
        --scores bench/results/supernet-inherited-listops512.jsonl --spaces default --sampling uniform \
        --truth-seeds 0,1

``--warm-start N`` starts each supernet from the space's reference trained alone ``N`` steps (``warm_start``:
its weights in their leading slices; the reference's steps and seconds are printed beside the supernet's), and
``--supernet-work DIR`` keeps each supernet's checkpoints there, so its training shows progress and resumes:

    python bench/supernet.py --max-len 512 --n-train 32000 --n-eval 2000 --max-new 0 \
        --ledger bench/results/supernet-ranking-listops512.jsonl \
        --scores bench/results/supernet-inherited-listops512.jsonl --spaces default --sampling uniform \
        --warm-start 1000 --supernet-work runs/bench-supernet-warm

No ranking can agree with the ground truth better than the ground truth agrees with itself. With ``--ledger``
the bench prints each space's standalone spread beside the noise of one figure (the spread of subnets trained
again with other seeds, ``--train-seed 1 --only I,J``, pooled; without such rows the binomial noise of the
test split's size), the tau a ranker that knew each subnet's expected accuracy would reach against it (the
ceiling of both signals' tau), and the tau between two seeds' figures. ``--truth-seeds 0,1`` ranks against
the mean of those seeds' figures instead (the ledger holds both for all 48 subnets of the protocol): half the
noise's variance, a higher ceiling.

Each tau is printed with its one-sided permutation p (the share of random orders of the same scores that rank
the ground truth at least as well), and each supernet with the spread of its inherited scores (how many
distinct accuracies the subnets get) and its taus within the most common width alone (what it says beyond
"narrower first"): a tau over scores that all but tie, or with a p that is not small, says no more than chance.
``--supernet-seed K`` trains a supernet again from another initialisation and sampling (the
subnets and ground truth unchanged, its scores kept apart): the supernet's own retest.

``--inherited-finetune STEPS`` uses the inherited weights as a start rather than a score: each subnet is also
trained STEPS steps from them with the proxy's recipe and ranked by its validation accuracy and loss then, in a
table of its own beside the proxy (which trains ``--proxy-steps`` from new weights). Its cost is the supernet's
plus STEPS steps a candidate, so it suits re-ranking a short list rather than scoring thousands.
``--from-scratch STEPS`` is its control: each subnet trained STEPS steps from new weights with the same recipe
(the proxy's, shortened or lengthened) and ranked by its validation accuracy and loss, in a table of its own
(``--scratch-ledger`` keeps those figures, which do not depend on the supernet). At the fine-tune's STEPS it
tells what the supernet's weights add to the training; at ``--proxy-steps`` it ranks the proxy by its loss too.

``--device cuda`` trains and scores on a CUDA GPU; ``bench/supernet_gpu.sh`` runs many such processes side by
side on one GPU until a deadline (ground-truth rows, and two supernets) and gathers their ledger and scores
lines.

``--tables equal-cost`` compares the two searches at equal cost instead, on ``--equal-cost-space``:

1. one-shot: a supernet trained ``--ec-supernet-steps`` steps, a search of ``--ec-trials`` candidates scored with
   its weights, the pick (``--min-speedup`` times faster than the study's reference) extracted;
2. standalone: today's search (each candidate trained ``--proxy-steps`` steps from new weights) given the same
   wall-clock seconds as step 1 took (``search.timeout``; the bench runs alone, so equal wall time on the same
   2 cores is equal CPU time, and both are printed), then its pick;
3. each pick fine-tuned ``--finetune-steps`` steps (the one-shot pick from its inherited weights, the
   standalone pick from new weights) and the reference Transformer trained the same steps from new weights;
   all three exported to ONNX, scored on the test split through onnxruntime and timed interleaved (ort-cpu).

The issue's protocol (>= 40 CPU minutes a search; about 75 minutes alone on 2 cores; the result is
``bench/results/supernet-equal-cost-listops512.json``):

    python bench/supernet.py --tables equal-cost --max-len 512 --n-train 32000 --n-eval 2000 \
        --work runs/bench-ec-512 --json runs/bench-ec-512.json

``--tables one-subnet`` asks whether the supernet's training is too short or its machinery wrong: the supernet's
shapes, initialization, slicing and training loop given one subnet (``--one-subnet I`` of the first of
``--spaces``) to train every step, at each of ``--one-subnet-steps``, beside that subnet's inherited scores
(``--scores``) and standalone figures (``--ledger``): the shared supernet's passes are worth as many steps
alone as give the same validation loss. ``--one-subnet-within attention,model`` adds a supernet of
``--supernet-steps`` uniform passes over each half of the space: every attention variant at the subnet's sizes,
and every size, depth and sharing at the subnet's attention; the half that keeps the subnet on the plateau is
the sharing that holds the whole supernet back. A part may also name model dimensions of the space, joined by
'+' (``--one-subnet-within d_model,n_layers+weight_sharing,n_heads,ffn_ratio``): each row's supernet draws
those alone, every other value kept at the subnet's own, which splits the sizes' half into its dimensions.
``--pos-encoding nested_sinusoidal`` builds every model of the ranking and of this table with position tables
that nest across widths (``xsearch.model.sinusoidal_positions``).

    python bench/supernet.py --tables one-subnet --one-subnet 2 --max-len 512 --n-train 32000 --n-eval 2000 \
        --spaces default --ledger bench/results/supernet-ranking-listops512.jsonl \
        --scores bench/results/supernet-inherited-listops512.jsonl [--one-subnet-within attention,model]

    python bench/supernet.py [--max-len 512] [--subnets 24] [--supernet-steps 3000] [--standalone-steps 1000]
                             [--proxy-steps 200] [--spaces default,per_layer] [--train-threads 2]
                             [--sampling uniform,sandwich,progressive] [--sandwich-random 2] [--warm-start STEPS]
                             [--inherited-finetune STEPS]
                             [--supernet-work DIR [--checkpoint-every 200]] [--device cpu|cuda]
                             [--json out.json] [--ledger runs/ranking.jsonl [--truth-only] [--max-new N] [--only I,J]
                             [--train-seed K] [--truth-seeds K,L]] [--scores runs/inherited.jsonl]
    python bench/supernet.py --tables equal-cost [--ec-supernet-steps 1200] [--ec-trials 50]
                             [--finetune-steps 400] [--work runs/bench-supernet]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

import torch
from supernet_bench import ledgers
from supernet_bench.equal_cost import equal_cost, print_equal_cost
from supernet_bench.one_subnet import one_subnet
from supernet_bench.ranking_tables import print_ranking

from xsearch.config import POS_ENCODINGS
from xsearch.errors import XSearchError
from xsearch.supernet.settings import HEAD_LAYOUTS, WIDTH_SCALING
from xsearch.tasks import get_task
from xsearch.training.device import resolve_device
from xsearch.training.settings import DEVICES


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--n-train", type=int, default=8000)
    p.add_argument("--n-eval", type=int, default=500, help="validation and test examples each")
    p.add_argument("--subnets", type=int, default=24)
    p.add_argument("--supernet-steps", type=int, default=3000)
    p.add_argument("--supernet-seconds", type=float, metavar="S", help="train each ranking supernet for S seconds "
                   "instead of --supernet-steps passes (a GPU sitting's deadline): its --scores line keeps the passes "
                   "it reached as its --supernet-steps, the budget to rank it again by")  # fmt: skip
    p.add_argument("--standalone-steps", type=int, default=1000)
    p.add_argument("--proxy-steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--spaces", default="default,per_layer")
    p.add_argument("--sampling", default="uniform", help="the supernet's sampling rules to rank with, "
                   "comma-separated (uniform, sandwich, progressive): one supernet each, at the same number of "
                   "subnet passes")  # fmt: skip
    p.add_argument("--sandwich-random", type=int, default=2, help="the sandwich rule's uniform draws per step")
    p.add_argument("--shrink-fraction", type=float, default=0.5, help="the progressive rule's share of the steps "
                   "over which the size ranges are let down to the whole space")  # fmt: skip
    p.add_argument("--width-scaling", default="none", choices=WIDTH_SCALING, help="the ranking's and the "
                   "one-subnet table's supernets' slicing (SupernetTrainSettings.width_scaling): none, or fan_in "
                   "(a narrower Linear slice times sqrt(the supernet's inputs / the subnet's))")  # fmt: skip
    p.add_argument("--head-layout", default="leading", choices=HEAD_LAYOUTS, help="the ranking's and the "
                   "one-subnet table's supernets' projections (SupernetTrainSettings.head_layout): leading, or "
                   "per_head (head h of every width the leading part of one block of rows)")  # fmt: skip
    p.add_argument("--split-by", metavar="DIM", help="few-shot NAS: one supernet per value of this model dimension "
                   "of the space (e.g. d_model), each over the sub-space holding it with an equal share of "
                   "--supernet-steps passes; each subnet scored with its value's supernet")  # fmt: skip
    p.add_argument("--pos-encoding", default="sinusoidal", choices=POS_ENCODINGS, help="the position encoding of "
                   "every model the ranking and the one-subnet table build (the spaces' models: ground truth, "
                   "proxies, supernets); kept in the ledger's and the scores' budgets (lines from before it read as "
                   "sinusoidal). nested_sinusoidal gives every width the leading columns of one table")  # fmt: skip
    p.add_argument("--inherited-finetune", type=int, default=0, metavar="STEPS", help="also train each subnet "
                   "STEPS steps from its inherited weights (the proxy's recipe) and rank by its validation accuracy "
                   "and loss then: the supernet's weights as a start rather than a score")  # fmt: skip
    p.add_argument("--from-scratch", type=int, default=0, metavar="STEPS", help="also train each ranked subnet "
                   "STEPS steps from new weights (the proxy's recipe) and rank by its validation accuracy and loss "
                   "then: the --inherited-finetune's control (the same steps from another start), and the proxy "
                   "ranked by its loss")  # fmt: skip
    p.add_argument("--scratch-ledger", metavar="JSONL", help="keep the --from-scratch figures here as they are "
                   "measured, and take those it holds")  # fmt: skip
    p.add_argument("--warm-start", type=int, default=0, metavar="STEPS", help="warm-start each supernet from the "
                   "space's reference trained alone this many steps (0: from new weights)")  # fmt: skip
    p.add_argument("--supernet-work", metavar="DIR", help="keep each supernet's checkpoints (and the warm start's "
                   "reference) here: its training shows progress and a stopped run resumes")  # fmt: skip
    p.add_argument("--checkpoint-every", type=int, default=200, help="with --supernet-work, steps between a "
                   "supernet's checkpoints (each holds its weights and optimizer state)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="the task's data, the subnets drawn, the supernets")
    p.add_argument("--supernet-seed", type=int, help="the ranking's and the one-subnet table's supernets' "
                   "initialisation, draws and batches (default: --seed): train one again with another seed to see "
                   "how much of a figure is luck (the one-subnet table's subnet stays --seed's draw)")  # fmt: skip
    p.add_argument("--train-seed", type=int, help="the proxy and standalone trainings' seed (default: --seed); "
                   "another one, with --ledger and --only, trains those subnets again to measure how much the "
                   "ground truth itself varies (the repeatability table), not the ranking")  # fmt: skip
    p.add_argument("--truth-seeds", type=lambda v: [int(i) for i in v.split(",")], metavar="K,L,...",
                   help="rank against the mean of the standalone figures of these training seeds (the ledger's "
                   "--train-seed rows; subnets lacking one are left out): less noise, a higher ceiling "
                   "(default: --seed alone)")  # fmt: skip
    p.add_argument("--train-threads", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=DEVICES, help="where the supernets, proxies and "
                   "standalone models train and are scored (the ledger and scores lines name it)")  # fmt: skip
    p.add_argument("--tables", default="ranking", help="ranking (with the cost table), equal-cost and/or one-subnet")
    p.add_argument("--one-subnet", type=int, default=2, metavar="I", help="the one-subnet table's subnet: the I-th "
                   "drawn of the first of --spaces")  # fmt: skip
    p.add_argument("--one-subnet-steps", default="200,400,1000", help="the one-subnet table's budgets ('': none)")
    p.add_argument("--one-subnet-within", default="", metavar="PARTS", help="the one-subnet table's rows of a "
                   "supernet trained --supernet-steps uniform passes over part of the space: 'attention' (every "
                   "variant drawn, the subnet's sizes kept), 'model' (every size drawn, the subnet's attention "
                   "kept) and/or model dimensions of the space, or attention, joined by '+' (e.g. d_model, "
                   "n_layers+weight_sharing, attention+n_layers; the rest kept): which shared part keeps the "
                   "subnet on the plateau")  # fmt: skip
    p.add_argument("--equal-cost-space", default="default")
    p.add_argument("--ec-supernet-steps", type=int, default=1200, help="the one-shot arm's supernet training")
    p.add_argument("--ec-trials", type=int, default=50, help="candidates the one-shot arm scores (with measured "
                   "latency and a 2,000-example validation split, about 10 s each at 512 tokens)")  # fmt: skip
    p.add_argument("--finetune-steps", type=int, default=400, help="training of each pick and of the reference")
    p.add_argument("--min-speedup", type=float, default=3.0, help="each pick this many times faster than the reference")
    p.add_argument("--work", default="runs/bench-supernet", help="the equal-cost arms' supernet, studies and models")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--ledger", metavar="JSONL", help="keep each subnet's proxy and standalone figures here as "
                   "they are measured, and take those it holds (a stopped run resumes)")  # fmt: skip
    p.add_argument("--truth-only", action="store_true", help="measure the proxy and standalone figures only "
                   "(no supernet): with --ledger, the protocol's hours in as many sittings as it takes")  # fmt: skip
    p.add_argument("--scores", metavar="JSONL", help="keep each supernet's inherited scores of the drawn subnets "
                   "here, and take those it holds (a supernet of the same space, rule and budget is not trained "
                   "again as the ledger fills)")  # fmt: skip
    p.add_argument("--max-new", type=int, help="train at most this many subnets not in the ledger, then stop")
    p.add_argument("--rank-only", action="store_true", help="train nothing: rank the kept scores (--scores) against "
                   "the ledger; a space and rule without kept scores is named and left out")  # fmt: skip
    p.add_argument("--only", type=lambda v: {int(i) for i in v.split(",")}, metavar="I,J,...",
                   help="train only these of each space's subnets (numbered from 1) now; the others are taken "
                   "from the ledger or left for another sitting (to fit a sitting's time)")  # fmt: skip
    args = p.parse_args()
    if args.train_seed is None:
        args.train_seed = args.seed
    if args.supernet_seed is None:
        args.supernet_seed = args.seed
    if args.truth_seeds is None:
        args.truth_seeds = [args.seed]
    if args.rank_only:
        if not (args.ledger and args.scores):
            raise SystemExit("--rank-only ranks kept figures: give --ledger and --scores")
        args.max_new = 0
    args.one_subnet_within = [v for v in args.one_subnet_within.split(",") if v]
    if args.supernet_seconds is not None and (args.split_by or "progressive" in args.sampling.split(",")):
        raise SystemExit("--supernet-seconds: --split-by shares out passes, and progressive shrinking follows a "
                         "schedule of steps; give --supernet-steps")  # fmt: skip
    if len(args.truth_seeds) > 1 and not args.ledger:
        raise SystemExit("--truth-seeds: the other seeds' figures come from --ledger")
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.train_threads)
    try:
        resolve_device(args.device)  # (fails now, with one line, rather than after the task is built)
    except XSearchError as e:
        raise SystemExit(f"--device: {e}") from None
    ledgers.DEVICE = args.device  # (named in each ledger and scores line)
    tables = set(args.tables.split(","))
    if unknown := tables - {"ranking", "equal-cost", "one-subnet"}:
        raise SystemExit(f"--tables: unknown {', '.join(sorted(unknown))} (valid: ranking, equal-cost, one-subnet)")
    if "equal-cost" in tables and args.pos_encoding != "sinusoidal":
        raise SystemExit(f"--pos-encoding {args.pos_encoding}: the equal-cost table's searches build the space's "
                         "own models (sinusoidal); give it without --pos-encoding")  # fmt: skip
    task_options = {"n_train": args.n_train, "n_valid": args.n_eval, "n_test": args.n_eval, "max_len": args.max_len,
                    "seed": args.seed}  # fmt: skip
    task = get_task("listops", **task_options)
    print(f"ListOps at {args.max_len} tokens (train {args.n_train}, valid/test {args.n_eval}); chance (majority "
          f"class): valid {task.chance('valid'):.4f}, test {task.chance('test'):.4f}; lr {args.lr}; "
          f"{args.pos_encoding} positions")  # fmt: skip
    doc = {"args": vars(args), "chance_test": task.chance("test")}
    if "equal-cost" in tables:
        doc["equal_cost"] = equal_cost(task, task_options, args)
        print()
        print_equal_cost(doc["equal_cost"], task.chance("test"))
    if "one-subnet" in tables:
        doc["one_subnet"] = one_subnet(task, args)
    if "ranking" in tables:
        doc["ranking"] = print_ranking(task, args)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
