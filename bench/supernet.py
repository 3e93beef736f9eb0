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
import dataclasses
import functools
import json
import logging
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import torch
from lra_listops import cpu_seconds  # (bench/, beside this script)

from xsearch.config import POS_ENCODINGS, describe_config
from xsearch.errors import XSearchError
from xsearch.latency.predictor.holdout import kendall_tau
from xsearch.model import count_parameters
from xsearch.search_spaces import RandomDraw, load_space_for_task
from xsearch.supernet import build_supernet, extract_subnet
from xsearch.supernet.settings import HEAD_LAYOUTS, LAYOUT_DEFAULTS, WIDTH_SCALING, SupernetTrainSettings
from xsearch.supernet.train import train_supernet
from xsearch.tasks import get_task
from xsearch.training import evaluate, evaluate_score
from xsearch.training.device import resolve_device
from xsearch.training.recipe import train_model
from xsearch.training.settings import DEVICES, TrainSettings


def tau(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b, or NaN where one side is constant (every proxy tied)."""
    try:
        return kendall_tau(x, y)
    except XSearchError:
        return float("nan")


def permutation_p(x: list[float], y: list[float], draws: int = 5000, seed: int = 0) -> float:
    """One-sided permutation p-value of ``tau(x, y)``: the share of random orders of ``x`` (its ties kept) that
    rank ``y`` at least as well. What chance alone gives a signal with no information about ``y``; NaN where
    the tau is undefined. (Kept per scores: every supernet's ranking asks it again of the same proxy.)"""
    return _permutation_p(tuple(x), tuple(y), draws, seed)


@functools.lru_cache(maxsize=256)
def _permutation_p(x: tuple[float, ...], y: tuple[float, ...], draws: int, seed: int) -> float:
    observed = tau(list(x), list(y))
    if observed != observed:
        return float("nan")
    rng = np.random.default_rng(seed)
    hits = sum(kendall_tau(rng.permutation(x), y) >= observed - 1e-12 for _ in range(draws))
    return (hits + 1) / (draws + 1)


#: What a ranking orders the subnets by, higher first: each supernet's inherited validation accuracy and loss,
#: and the standalone search's proxy (a short training from new weights).
SIGNALS = {"inherited": lambda r: r["inherited_valid"], "inherited_loss": lambda r: -r["inherited_loss"],
           "proxy": lambda r: r["proxy_valid"], "finetuned": lambda r: r["finetuned_valid"],
           "finetuned_loss": lambda r: -r["finetuned_loss"], "scratch": lambda r: r["scratch_valid"],
           "scratch_loss": lambda r: -r["scratch_loss"]}  # fmt: skip
FINETUNED = ("finetuned", "finetuned_loss")  # (the signals only a run with --inherited-finetune has)
SCRATCH = ("scratch", "scratch_loss")  # (the signals only a run with --from-scratch has)


def taus(rows: list[dict], truth: list[float], signals) -> dict[str, float]:
    """``tau_<signal>`` and its ``p_<signal>`` of each of ``signals`` (``SIGNALS``' names) over ``rows``."""
    out = {}
    for name in signals:
        scores = [SIGNALS[name](r) for r in rows]
        out[f"tau_{name}"], out[f"p_{name}"] = tau(scores, truth), permutation_p(scores, truth)
    return out


def paired_difference(
    a: list[float], b: list[float], truth: list[float], draws: int = 2000, seed: int = 0
) -> dict[str, float]:
    """``tau(a, truth) - tau(b, truth)`` and its 90% interval over the subnets resampled with replacement (a
    paired bootstrap: both signals ranked on each draw's subnets; draws where either tau is undefined are
    left out): whether one signal ranks better than the other beyond the luck of which subnets were drawn."""
    rng = np.random.default_rng(seed)
    a_, b_, t_ = np.asarray(a), np.asarray(b), np.asarray(truth)
    diffs = []
    for _ in range(draws):
        i = rng.integers(0, len(t_), len(t_))
        diff = tau(list(a_[i]), list(t_[i])) - tau(list(b_[i]), list(t_[i]))
        if not np.isnan(diff):
            diffs.append(diff)
    lo, hi = np.percentile(diffs, [5, 95]) if diffs else (float("nan"), float("nan"))
    return {"difference": tau(a, truth) - tau(b, truth), "low": float(lo), "high": float(hi)}


def noise_ceiling(values: list[float], noise_sd: float, draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """The tau a perfect ranker would reach against ground-truth figures ``values`` measured with noise ``noise_sd``.

    Each figure is the subnet's expected accuracy plus noise (the test split's sampling, a training seed's
    luck). The expected accuracies are taken as ``values`` shrunk toward their mean to the spread the noise
    leaves (variance of ``values`` less ``noise_sd``²); each draw adds new noise and ranks the noisy figures
    against the expected ones. Returns the mean tau and its 5th and 95th percentiles; 0 where the figures
    spread no more than the noise (a ranking of them is a ranking of noise).
    """
    v = np.asarray(values, dtype=float)
    spread = float(v.var(ddof=1)) - noise_sd**2
    if spread <= 0:
        return 0.0, 0.0, 0.0
    expected = v.mean() + (v - v.mean()) * np.sqrt(spread / v.var(ddof=1))
    rng = np.random.default_rng(seed)
    taus = np.sort([kendall_tau(expected, expected + rng.normal(0.0, noise_sd, v.size)) for _ in range(draws)])
    return float(taus.mean()), float(taus[int(0.05 * draws)]), float(taus[int(0.95 * draws)])


def read_lines(path: Path) -> list[dict]:
    """The JSON lines of a ledger file (none if it does not exist); a line cut by a kill is skipped, and its
    figures are measured again."""
    docs = []
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            docs.append(json.loads(line))
        except json.JSONDecodeError:
            print(f"{path}:{n}: not a JSON line, ignored", file=sys.stderr)
    return docs


def append_line(path: Path, doc: dict) -> None:
    """Append ``doc`` to a ledger file as one JSON line, on disk before this returns (after a line a kill cut
    short, on a line of its own)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        cut = False
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            cut = f.read(1) != b"\n"
        f.write((b"\n" if cut else b"") + json.dumps(doc).encode("utf-8") + b"\n")
        f.flush()
        os.fsync(f.fileno())


#: What the ledger's and the scores' lines from before a budget key was kept were measured with (``train_seed``:
#: the line's ``seed``).
OLD_BUDGET = {"pos_encoding": "sinusoidal"}


def load_bench_space(name: str, task, args):
    """The space ``name`` fitted to the task, its models built with ``--pos-encoding`` (a space that sets another
    exits naming it)."""
    space = load_space_for_task(name, task, defaults={"pos_encoding": args.pos_encoding})
    if (own := space.model["pos_encoding"].values()) != [args.pos_encoding]:
        raise SystemExit(f"--pos-encoding {args.pos_encoding}: the space {name!r} sets pos_encoding {own}")
    return space


class KeptRows:
    """Figures of each subnet measured under one budget, one JSON line each, appended as each is measured.

    They depend only on the subnet, the task and the budget (not on a supernet), and cost hours at the issue's
    protocol: a file of them lets a run that is stopped, or spread over several sessions, keep what it measured.
    Lines of other budgets are kept and ignored. A kind of figures names its budget's keys (``BUDGET``).
    """

    BUDGET: tuple[str, ...] = ()

    def __init__(self, path: str, args) -> None:
        self.path, self.budget = Path(path), {k: getattr(args, k) for k in self.BUDGET}
        self.rows: dict[tuple[str, str], dict] = {}  # this budget's rows, by space and subnet
        for doc in read_lines(self.path):
            self.read(doc)

    def read(self, doc: dict) -> None:
        """Take in one line of the file."""
        if doc["budget"] == self.budget:
            self.rows[doc["space"], doc["row"]["config"]] = doc["row"]

    def get(self, space: str, cfg) -> dict | None:
        return self.rows.get((space, describe_config(cfg)))

    def keep(self, space: str, row: dict, **extra) -> None:
        """Add ``row`` (its ``config`` names the subnet), and append it to the file with ``extra`` keys."""
        self.rows[space, row["config"]] = row
        append_line(self.path, {"space": space, "budget": self.budget, "machine": machine(), **extra, "row": row})


class Ledger(KeptRows):
    """The proxy and standalone figures of each subnet (``--ledger``), and the standalone test accuracy of every
    training seed measured (``repeats``: the ground truth averages seeds)."""

    BUDGET = ("max_len", "n_train", "n_eval", "seed", "lr", "proxy_steps", "standalone_steps", "train_seed",
              "pos_encoding")  # fmt: skip

    def __init__(self, path: str, args) -> None:
        self.repeats: dict[tuple[str, str], dict[int, float]] = {}  # standalone test by training seed, any seed
        super().__init__(path, args)

    @staticmethod
    def _seedless(budget: dict) -> dict:
        return {k: v for k, v in budget.items() if k != "train_seed"}

    def read(self, doc: dict) -> None:
        budget = {**OLD_BUDGET, "train_seed": doc["budget"]["seed"], **doc["budget"]}  # (see OLD_BUDGET)
        key = doc["space"], doc["row"]["config"]
        if budget == self.budget:
            self.rows[key] = {**doc["row"], "machine": doc.get("machine")}
        if self._seedless(budget) == self._seedless(self.budget):
            self.repeats.setdefault(key, {})[budget["train_seed"]] = doc["row"]["standalone_test"]

    def add(self, space: str, cfg, row: dict) -> None:
        self.repeats.setdefault((space, row["config"]), {})[self.budget["train_seed"]] = row["standalone_test"]
        self.keep(space, row, model_config=cfg.to_dict())


DEVICE = "cpu"  # --device (main sets it): named in each ledger and scores line


def machine() -> str:
    """The CPU the figures were measured on (a ledger may gather rows of several sessions), the GPU with
    ``--device cuda``, and the threads.

    Seconds are comparable only between rows of one machine and thread count: two 1-thread runs side by side
    (``--train-threads 1``, disjoint ``--only`` sets) measure about 1.3x more rows an hour on 2 cores than one
    2-thread run, each row's seconds longer.
    """
    threads = f"{torch.get_num_threads()} torch threads, torch {torch.__version__}"
    if DEVICE == "cuda":
        threads = f"{torch.cuda.get_device_name()} (cuda), {threads}"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores, {threads}"
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {threads}"


MIN_RANKED = 3  # subnets with standalone figures a ranking (and the ground truth's spread) needs


@torch.no_grad()
def accuracy_and_loss(model, task, split: str) -> tuple[float, float]:
    """``model``'s accuracy on ``split`` and its mean cross-entropy there (nats), from one pass: the loss still tells
    apart models whose predictions, and so whose accuracies, are the same (HAT ranks its SubTransformers by loss)."""
    score = evaluate_score(model, task, split)
    return score.metric, score.loss


def draw_subnets(space, task, args) -> list:
    """The ``--subnets`` subnets of ``space`` the ranking is measured on (drawn uniformly with ``--seed``)."""
    rng = random.Random(args.seed)
    return [space.suggest(RandomDraw(rng), task.model_fields()) for _ in range(args.subnets)]


class Scores:
    """Each supernet's inherited-weight validation accuracy of every drawn subnet, one JSON line per supernet.

    A supernet at the protocol's budget costs an hour on 2 cores and depends only on the space, the sampling
    rule and the budgets, not on the ground truth: its scores are kept (``--scores``) so that a ranking can be
    taken again, as the ledger's standalone rows come in, without training it again. Lines of other budgets are
    kept and ignored.
    """

    BUDGET = ("max_len", "n_train", "n_eval", "seed", "lr", "supernet_steps", "sandwich_random", "pos_encoding")

    def __init__(self, path: str, args) -> None:
        self.path, self.budget = Path(path), {k: getattr(args, k) for k in self.BUDGET}
        self.warm_start, self.shrink_fraction = args.warm_start, args.shrink_fraction
        self.supernet_seed, self.layout, self.split_by = args.supernet_seed, layout(args), args.split_by
        self.finetune = args.inherited_finetune
        self.runs: dict[tuple, dict] = {}  # by key()
        for doc in read_lines(self.path):
            if {**OLD_BUDGET, **doc["budget"]} == self.budget:
                self.runs[self.key(doc)] = doc

    @staticmethod
    def key(run: dict) -> tuple:
        """A supernet's settings beyond the budget (the shrink fraction only where the rule shrinks; lines from
        before ``--supernet-seed`` were seeded with the budget's ``seed``, those from before
        ``--width-scaling`` and ``--head-layout`` sliced plainly), then the steps its subnets were fine-tuned
        (``--inherited-finetune``; 0: none), so one file keeps a supernet's runs at several fine-tune budgets."""
        shrink = run.get("shrink_fraction") if run["sampling"] == "progressive" else None
        return (run["space"], run["sampling"], run.get("warm_start", 0), shrink,
                run.get("supernet_seed", run.get("budget", {}).get("seed")),
                *(run.get(key, default) for key, default in LAYOUT_DEFAULTS.items()), run.get("split_by"),
                run.get("inherited_finetune") or 0)  # fmt: skip

    def get(self, space: str, rule: str, subnets: list) -> dict | None:
        """The run of ``space``, ``rule``, ``--warm-start`` (and ``--shrink-fraction``) at this budget, if it scored
        exactly these subnets and kept their losses (a run from before the losses were kept is trained again).
        With ``--inherited-finetune``, the run whose subnets were fine-tuned that many steps; without, any run of
        the supernet (each keeps the inherited scores), the one without a fine-tune first."""
        wanted = {"space": space, "sampling": rule, "warm_start": self.warm_start,
                  "shrink_fraction": self.shrink_fraction, "supernet_seed": self.supernet_seed,
                  **self.layout, "split_by": self.split_by, "inherited_finetune": self.finetune}  # fmt: skip
        supernet = self.key(wanted)[:-1]
        if self.finetune:
            run = self.runs.get(self.key(wanted))
            if run is None and any(key[:-1] == supernet for key in self.runs):
                print(f"  [{space} {rule}] the supernet in {self.path} has no subnet fine-tuned {self.finetune} "
                      "steps: training it again (or taking it from --supernet-work)", file=sys.stderr,
                      flush=True)  # fmt: skip
        else:
            run = next((self.runs[key] for key in sorted(self.runs, key=lambda k: k[-1]) if key[:-1] == supernet),
                       None)  # fmt: skip
        if not run or [s["config"] for s in run["scores"]] != [describe_config(cfg) for cfg in subnets]:
            return None
        if any("inherited_loss" not in s for s in run["scores"]):
            print(f"  [{space} {rule}] the supernet in {self.path} was scored before losses were kept: "
                  "training it again", file=sys.stderr, flush=True)  # fmt: skip
            return None
        return run

    def add(self, run: dict) -> None:
        doc = {"budget": self.budget, **run}
        self.runs[self.key(doc)] = doc
        append_line(self.path, doc)


def measure_truth(name: str, subnets: list, task, args, ledger: Ledger | None) -> list[dict | None]:
    """Each subnet's proxy and standalone figures: from the ledger, or trained now (``--only``, ``--max-new``
    choose which); None where neither."""
    truth_rows: list[dict | None] = []
    for i, cfg in enumerate(subnets):
        if ledger and (row := ledger.get(name, cfg)):
            truth_rows.append(row)
            continue
        if (args.max_new is not None and args.max_new <= 0) or (args.only and i + 1 not in args.only):
            truth_rows.append(None)  # (left for another sitting; the ledger's later rows still count)
            continue
        t0 = time.perf_counter()
        proxy = train_model(cfg, task, TrainSettings(steps=args.proxy_steps, lr=args.lr, seed=args.train_seed,
                                                     device=args.device), progress=False)  # fmt: skip
        proxy_valid = evaluate(proxy.model.to(args.device), task, "valid")
        proxy_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        alone = train_model(cfg, task, TrainSettings(steps=args.standalone_steps, lr=args.lr, seed=args.train_seed,
                                                     device=args.device), progress=False)  # fmt: skip
        row = {"config": describe_config(cfg), "parameters": count_parameters(alone.model),
               "proxy_valid": proxy_valid, "standalone_test": alone.test_metric, "proxy_s": proxy_s,
               "standalone_s": time.perf_counter() - t0}  # fmt: skip
        if ledger:
            ledger.add(name, cfg, row)
        if args.max_new is not None:
            args.max_new -= 1
        truth_rows.append({**row, "machine": machine()})
        print(f"  [{name} {i + 1}/{len(subnets)}] {row['config'][:70]:70s} proxy {proxy_valid:.3f}  standalone "
              f"{alone.test_metric:.3f}  ({row['proxy_s'] + row['standalone_s']:.0f} s)", file=sys.stderr,
              flush=True)  # fmt: skip
    return truth_rows


def score_with_supernet(space, subnets: list, task, rule: str, args, *, passes: int | None = None) -> dict:
    """Train a supernet over ``space`` with the sampling rule ``rule`` and score each of ``subnets`` on the
    validation split with its inherited weights.

    The sandwich rule trains 2 + ``--sandwich-random`` subnets a step: it gets ``passes`` (``--supernet-steps``)
    divided by that many steps, the same number of subnet passes as uniform sampling (its seconds are printed
    beside).
    """
    passes = passes or args.supernet_steps
    sn = build_supernet(space, task.model_fields(), seed=args.supernet_seed, **layout(args))
    warm = warm_start_model(space, task, args) if args.warm_start else None
    settings = SupernetTrainSettings(steps=1, lr=args.lr, seed=args.supernet_seed, sampling=rule, **layout(args),
                                     sandwich_random=args.sandwich_random, shrink_fraction=args.shrink_fraction,
                                     device=args.device,
                                     checkpoint_every=args.checkpoint_every)  # fmt: skip
    settings = dataclasses.replace(settings, steps=max(1, passes // settings.subnets_per_step))
    out = None
    if args.supernet_work:
        shrink = f"-shrink{args.shrink_fraction:g}" if rule == "progressive" and args.shrink_fraction != 0.5 else ""
        seed = f"-seed{args.supernet_seed}" if args.supernet_seed != args.seed else ""
        scaled = "".join(f"-{v}" for k, v in layout(args).items() if v != LAYOUT_DEFAULTS[k])
        out = (Path(args.supernet_work)
               / f"{space.name}-{rule}-{passes}-warm{args.warm_start}{shrink}{seed}{scaled}")  # fmt: skip
    record = train_supernet(sn, task, settings, out=out, progress=out is not None, init=warm and warm["model"])
    supernet_s = record["seconds"]  # (over every sitting of a resumed run)
    scores = []
    for cfg in subnets:
        t0 = time.perf_counter()
        inherited, loss = accuracy_and_loss(extract_subnet(sn, cfg).to(args.device), task, "valid")
        scores.append({"config": describe_config(cfg), "inherited_valid": inherited, "inherited_loss": loss,
                       "score_s": time.perf_counter() - t0})  # fmt: skip
    if args.inherited_finetune:  # (after every inherited score: the supernet's weights are not trained further)
        for i, (cfg, score) in enumerate(zip(subnets, scores, strict=True)):
            score.update(finetuned(sn, cfg, task, args))
            print(f"  [{space.name} {rule} {i + 1}/{len(subnets)}] fine-tuned {args.inherited_finetune} steps from "
                  f"the inherited weights: valid {score['finetuned_valid']:.4f}, loss {score['finetuned_loss']:.4f} "
                  f"(was {score['inherited_valid']:.4f}, {score['inherited_loss']:.4f}; {score['finetune_s']:.0f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip
    print(f"  [{space.name} {rule}] supernet {record['subnet_passes']} subnet passes in {supernet_s:.0f} s (final "
          f"loss {record['final_loss']:.3f}, reference subnet {record['reference_valid']:.4f} validation); "
          f"{len(scores)} subnets scored", file=sys.stderr, flush=True)  # fmt: skip
    return {"space": space.name, "sampling": rule, "warm_start": args.warm_start, "supernet_seed": args.supernet_seed,
            **layout(args),
            **({"shrink_fraction": settings.shrink_fraction} if rule == "progressive" else {}),
            **({k: v for k, v in warm.items() if k != "model"} if warm else {}), "supernet_steps": record["steps"],
            "subnet_passes": record["subnet_passes"], "supernet_seconds": supernet_s,
            "supernet_parameters": sn.n_parameters(), "final_loss": record["final_loss"],
            "reference_valid": record["reference_valid"], "machine": machine(),
            **({"inherited_finetune": args.inherited_finetune} if args.inherited_finetune else {}),
            "scores": scores}  # fmt: skip


def trained_and_scored(cfg, task, steps: int, args, init=None) -> tuple[float, float, float]:
    """``cfg`` trained ``steps`` steps with the proxy's recipe (``--lr``, seed ``--train-seed``) from ``init``'s
    weights (None: new ones), then its validation accuracy and loss, and the seconds both took."""
    t0 = time.perf_counter()
    settings = TrainSettings(steps=steps, lr=args.lr, seed=args.train_seed, device=args.device)
    trained = train_model(cfg, task, settings, progress=False, init=init)
    valid, loss = accuracy_and_loss(trained.model.to(args.device), task, "valid")
    return valid, loss, time.perf_counter() - t0


def finetuned(sn, cfg, task, args) -> dict:
    """``cfg`` extracted from ``sn``, trained ``--inherited-finetune`` steps from those weights, then scored on the
    validation split: the inherited weights as a start rather than a score (the proxy's training, shortened,
    from the supernet's weights)."""
    valid, loss, seconds = trained_and_scored(cfg, task, args.inherited_finetune, args, init=extract_subnet(sn, cfg))
    return {"finetuned_valid": valid, "finetuned_loss": loss, "finetune_s": seconds}


class ScratchLedger(KeptRows):
    """Each subnet trained ``--from-scratch`` steps from new weights with the proxy's recipe and scored on the
    validation split (accuracy and loss), one JSON line each (``--scratch-ledger``): the fine-tune's control,
    the same steps from new weights rather than the supernet's."""

    BUDGET = ("max_len", "n_train", "n_eval", "seed", "lr", "from_scratch", "train_seed", "pos_encoding")


def from_scratch(
    name: str, subnets: list, truth_rows: list[dict | None], task, args, kept: ScratchLedger | None
) -> list[dict | None]:
    """``truth_rows`` with each measured subnet's ``--from-scratch`` figures added (``scratch_valid``,
    ``scratch_loss``, ``scratch_s``): taken from ``kept`` (``--scratch-ledger``), or trained now (``--rank-only``
    trains none: a subnet without them exits naming it)."""
    rows: list[dict | None] = []
    for i, (cfg, row) in enumerate(zip(subnets, truth_rows, strict=True)):
        figures = kept.get(name, cfg) if kept and row is not None else None
        if row is not None and figures is None:
            if args.rank_only:
                raise SystemExit(f"--rank-only: subnet {i + 1} of {name} has no figures of {args.from_scratch} "
                                 f"steps from new weights in {args.scratch_ledger}")  # fmt: skip
            valid, loss, seconds = trained_and_scored(cfg, task, args.from_scratch, args)
            figures = {"config": describe_config(cfg), "scratch_valid": valid, "scratch_loss": loss,
                       "scratch_s": seconds}  # fmt: skip
            if kept:
                kept.keep(name, figures)
            print(f"  [{name} {i + 1}/{len(subnets)}] {args.from_scratch} steps from new weights: valid "
                  f"{valid:.4f}, loss {loss:.4f} ({seconds:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
        rows.append(None if row is None else {**row, **{k: v for k, v in figures.items() if k != "config"}})
    return rows


def sub_space(space, dim: str, value):
    """``space`` with ``dim`` held at ``value`` (its reference too)."""
    from xsearch.search_spaces.dims import Dim

    return dataclasses.replace(space, name=f"{space.name}-{dim}{value}", model={**space.model, dim: Dim((value,))},
                               reference={**space.reference, dim: value})  # fmt: skip


def score_with_split_supernets(space, subnets: list, task, rule: str, args) -> dict:
    """Few-shot NAS (Zhao et al., 2021): ``space`` split on ``--split-by`` into one sub-space per value, a supernet
    trained over each with an equal share of ``--supernet-steps`` passes, each subnet scored with its value's
    supernet (no weight is shared across the values). The figures of the run are the sums over the supernets."""
    dim = args.split_by
    once = [d for d in space.model if not (space.per_layer and d in space.LAYER_DIMS)]
    if dim not in once:
        raise SystemExit(f"--split-by {dim}: not a model dimension the space {space.name!r} draws once per model "
                         f"(valid: {', '.join(once)})")  # fmt: skip
    if args.warm_start:
        raise SystemExit("--split-by: the warm start is of the whole space's reference; give one or the other")
    values = space.model[dim].every_value()
    runs = [score_with_supernet(sub_space(space, dim, v), [c for c in subnets if model_dims(c)[dim] == v], task,
                                rule, args, passes=args.supernet_steps // len(values)) for v in values]  # fmt: skip
    by_config = {s["config"]: s for r in runs for s in r["scores"]}
    total = {k: sum(r[k] for r in runs) for k in ("supernet_steps", "subnet_passes", "supernet_seconds",
                                                   "supernet_parameters")}  # fmt: skip
    return {**runs[0], **total, "space": space.name, "split_by": dim,
            "final_loss": float(np.mean([r["final_loss"] for r in runs])),
            "reference_valid": float(np.mean([r["reference_valid"] for r in runs])),
            "split": {str(v): {k: r[k] for k in ("space", *total, "final_loss", "reference_valid")}
                      for v, r in zip(values, runs, strict=True)},
            "scores": [by_config[describe_config(cfg)] for cfg in subnets]}  # fmt: skip


def warm_start_model(space, task, args) -> dict:
    """The space's reference trained alone ``--warm-start`` steps (kept under ``--supernet-work`` and taken from
    there the next time), the weights a warm-started supernet starts from, with its figures."""
    from xsearch.serialization import load_model, save_model

    cfg = space.reference_config(task.model_fields())
    kept = Path(args.supernet_work) / f"reference-{space.name}-{args.warm_start}" if args.supernet_work else None
    if kept is not None and (kept / "warm_start.json").is_file():
        doc = json.loads((kept / "warm_start.json").read_text())
        return {**doc, "model": load_model(kept)}
    t0 = time.perf_counter()
    trained = train_model(cfg, task, TrainSettings(steps=args.warm_start, lr=args.lr, seed=args.seed,
                                                   device=args.device), progress=False)  # fmt: skip
    doc = {"warm_start_config": describe_config(cfg), "warm_start_seconds": time.perf_counter() - t0,
           "warm_start_valid": evaluate(trained.model.to(args.device), task, "valid"),
           "warm_start_test": trained.test_metric}  # fmt: skip
    print(f"  [{space.name}] warm start: the reference {doc['warm_start_config']} trained {args.warm_start} steps "
          f"in {doc['warm_start_seconds']:.0f} s: valid {doc['warm_start_valid']:.4f}, test "
          f"{doc['warm_start_test']:.4f}", file=sys.stderr, flush=True)  # fmt: skip
    if kept is not None:
        save_model(trained.model, kept)
        (kept / "warm_start.json").write_text(json.dumps(doc, indent=2))
    return {**doc, "model": trained.model}


def pick(rows: list[dict], key) -> dict:
    """The standalone test accuracy of the subnet ``key`` scores highest, and, where several tie at the top,
    the mean over the tied ones (what a pick among them is worth on average) and how many tie."""
    top = max(key(r) for r in rows)
    tied = [r["standalone_test"] for r in rows if key(r) == top]
    return {"test": float(np.mean(tied)), "tied": len(tied)}


def rank(run: dict, subnets: list, truth_rows: list[dict | None]) -> dict:
    """Kendall tau of the supernet run's scores (its accuracy and, negated, its loss) and of the proxy against
    the standalone figures, over the subnets whose standalone figures are measured; beside them, two rankers
    that train nothing and read only the architecture's size (narrower first; fewer parameters first): what a
    signal must beat to say more than "small models train faster"."""
    rows = [{**row, **score, "d_model": cfg.d_model}
            for score, cfg, row in zip(run["scores"], subnets, truth_rows) if row is not None]  # fmt: skip
    truth = [r["standalone_test"] for r in rows]
    signals = [name for name in SIGNALS if (name not in FINETUNED or run.get("inherited_finetune"))
               and (name not in SCRATCH or all("scratch_valid" in r for r in rows))]  # fmt: skip
    alike = [r for r in rows if r.get("machine") == run["machine"]]
    return {
        **{k: v for k, v in run.items() if k not in ("scores", "budget")},
        "subnets": len(rows), "drawn": len(truth_rows), "rows": rows, **taus(rows, truth, signals),
        "inherited_spread": {"min": min(r["inherited_valid"] for r in rows),
                             "max": max(r["inherited_valid"] for r in rows),
                             "distinct": len({r["inherited_valid"] for r in rows}),
                             "loss_min": min(r["inherited_loss"] for r in rows),
                             "loss_max": max(r["inherited_loss"] for r in rows)},
        "tau_narrower": tau([-r["d_model"] for r in rows], truth),
        "tau_fewer_parameters": tau([-r["parameters"] for r in rows], truth),
        "score_s": sum(s["score_s"] for s in run["scores"]) / len(run["scores"]),
        **({"finetune_s": sum(s["finetune_s"] for s in run["scores"]) / len(run["scores"])}
           if "finetune_s" in run["scores"][0] else {}),
        **({"scratch_s": sum(r["scratch_s"] for r in rows) / len(rows)} if "scratch" in signals else {}),
        # The fine-tune against its control (--from-scratch at any steps), each by accuracy and by loss.
        **({f"finetuned_minus_scratch{loss}": paired_difference(
                [SIGNALS[f"finetuned{loss}"](r) for r in rows], [SIGNALS[f"scratch{loss}"](r) for r in rows], truth)
            for loss in ("", "_loss")} if "scratch" in signals and "finetuned" in signals else {}),
        # Seconds compare only on one machine and thread count: the rows measured where this supernet was.
        "standalone_s": sum(r["standalone_s"] for r in alike) / len(alike) if alike else float("nan"),
        "standalone_rows": len(alike),
        **{f"pick_by_{name}": pick(rows, SIGNALS[name]) for name in signals},
        "best": max(truth),
        "within_width": within_width(rows, [name for name in signals if name != "proxy"]),
    }  # fmt: skip


def within_width(rows: list[dict], signals: list[str]) -> dict:
    """The supernet's ``signals``' taus (and p) among the subnets of the most common width only: what the
    supernet says beyond "narrower first", which a score that merely encodes width would rank at chance."""
    width = max(sorted({r["d_model"] for r in rows}), key=lambda w: sum(r["d_model"] == w for r in rows))
    group = [r for r in rows if r["d_model"] == width]
    return {"d_model": width, "subnets": len(group), **taus(group, [r["standalone_test"] for r in group], signals)}


def averaged(row: dict, by_seed: dict[int, float], seeds: list[int]) -> dict | None:
    """``row`` with its standalone figure the mean over the training ``seeds`` (``--truth-seeds``), or None where
    the ledger lacks one of them (the proxy stays the search's: one training, seed ``--seed``)."""
    if any(seed not in by_seed for seed in seeds):
        return None
    return {**row, "standalone_test": float(np.mean([by_seed[seed] for seed in seeds]))}


def run_space(
    name: str, task, args, ledger: Ledger | None, scores: Scores | None, scratch: ScratchLedger | None
) -> tuple[list, list[dict]]:
    """The space's drawn subnets and, unless ``--truth-only``, one ranking per sampling rule (a supernet trained
    now, or its scores taken from ``--scores``), over the subnets whose standalone figures are measured (with
    ``--from-scratch``, their figures from new weights, kept in ``scratch``)."""
    space = load_bench_space(name, task, args)
    subnets = draw_subnets(space, task, args)
    truth_rows = measure_truth(name, subnets, task, args, ledger)
    if len(args.truth_seeds) > 1 and not args.truth_only:
        truth_rows = [averaged(row, ledger.repeats.get((name, row["config"]), {}), args.truth_seeds)
                      if row is not None else None for row in truth_rows]  # fmt: skip
    if args.from_scratch and not args.truth_only:
        truth_rows = from_scratch(name, subnets, truth_rows, task, args, scratch)
    measured = sum(row is not None for row in truth_rows)
    if measured < len(subnets) or args.truth_only or args.train_seed != args.seed:
        print(f"  [{name}] standalone figures of {measured} of {len(subnets)} subnets"
              + (f" in {args.ledger}" if ledger else ""), file=sys.stderr, flush=True)  # fmt: skip
    if args.truth_only or args.train_seed != args.seed or measured < MIN_RANKED:
        return subnets, []
    results = []
    for rule in args.sampling.split(","):
        run = scores.get(name, rule, subnets) if scores else None
        if run is None and args.rank_only:
            print(f"  [{name} {rule}] no kept scores of this supernet in {args.scores} (--rank-only trains none)",
                  file=sys.stderr, flush=True)  # fmt: skip
            continue
        if run is None:
            run = (score_with_split_supernets if args.split_by else score_with_supernet)(space, subnets, task, rule,
                                                                                         args)  # fmt: skip
            if scores:
                scores.add(run)
        results.append(rank(run, subnets, truth_rows))
    return subnets, results


class Clock:
    """Wall and CPU seconds (this process and its children) since it was made."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), cpu_seconds()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, cpu_seconds() - self.cpu


def equal_cost(task, task_options: dict, args) -> dict:
    """The one-shot search against today's standalone search given the same seconds (see the module's text)."""
    from xsearch.export import to_onnx
    from xsearch.latency.timing import measure_interleaved
    from xsearch.search.report import pick
    from xsearch.search.run import run_search
    from xsearch.search.settings import PickSettings, SearchSettings
    from xsearch.supernet import save_supernet
    from xsearch.training import evaluate_onnx

    work = Path(args.work)
    if (work / "studies.db").exists():  # (a resumed arm would take no seconds, and the other arm would get none)
        raise SystemExit(f"--work {work} holds an earlier equal-cost run: choose another folder")
    work.mkdir(parents=True, exist_ok=True)
    fields = task.model_fields()
    space = load_bench_space(args.equal_cost_space, task, args)
    common = dict(task="listops", task_options=task_options, space=args.equal_cost_space, target="torch-cpu",
                  storage=f"sqlite:///{work / 'studies.db'}", latency_repeats=5, seed=args.seed, batch_size=32,
                  lr=args.lr)  # fmt: skip
    rule = PickSettings(min_speedup=args.min_speedup)

    clock = Clock()
    sn = build_supernet(space, fields, seed=args.seed)
    train_supernet(sn, task, SupernetTrainSettings(steps=args.ec_supernet_steps, lr=args.lr, seed=args.seed),
                   out=work / "supernet-checkpoint", progress=False)  # fmt: skip
    save_supernet(sn, work / "supernet")
    shot = run_search(SearchSettings(**common, study="one-shot", supernet=str(work / "supernet"),
                                     trials=args.ec_trials, latency_cache=str(work / "latency-one-shot.jsonl")),
                      progress=False)  # fmt: skip
    shot_pick = pick(shot, rule)
    shot_init = extract_subnet(sn, shot_pick.user_attrs["model_config"])
    shot_seconds, shot_cpu = clock.read()
    print(f"  one-shot: supernet {args.ec_supernet_steps} steps + {args.ec_trials} candidates in {shot_seconds:.0f} "
          f"s; standalone search gets the same", file=sys.stderr, flush=True)  # fmt: skip

    clock = Clock()
    alone = run_search(SearchSettings(**common, study="standalone", trials=100_000, timeout=shot_seconds,
                                      train_steps=args.proxy_steps, latency_cache=str(work / "latency-alone.jsonl")),
                       progress=False)  # each arm measures its own latencies  # fmt: skip
    alone_pick = pick(alone, rule)
    alone_seconds, alone_cpu = clock.read()

    fine_tune = TrainSettings(steps=args.finetune_steps, lr=args.lr, seed=args.seed)
    arms = {
        "one-shot (supernet)": (shot, shot_pick, shot_init, shot_seconds, shot_cpu),
        "standalone search": (alone, alone_pick, None, alone_seconds, alone_cpu),
        "reference Transformer": (alone, None, None, 0.0, 0.0),
    }
    rows, files = {}, {}
    for name, (study, chosen, init, seconds, cpu) in arms.items():
        config = space.reference_config(fields).to_dict() if chosen is None else chosen.user_attrs["model_config"]
        clock = Clock()
        trained = train_model(config, task, fine_tune, progress=False, init=init)
        tune_seconds, tune_cpu = clock.read()
        files[name] = work / f"{name.split()[0]}.onnx"
        to_onnx(trained.model, files[name], task=task.describe())
        counted = [t for t in study.get_trials(deepcopy=False) if t.state.name in ("COMPLETE", "PRUNED")]
        rows[name] = {"config": describe_config(config), "candidates": len(counted) if chosen else 0,
                      "test_onnx": evaluate_onnx(files[name], task, "test", threads=args.train_threads),
                      "search_seconds": seconds, "search_cpu": cpu, "finetune_seconds": tune_seconds,
                      "finetune_cpu": tune_cpu, "search_valid": chosen.values[0] if chosen else None}  # fmt: skip
    latency = measure_interleaved(files, "ort-cpu", seq_len=task.model_fields()["max_len"], threads=2, repeats=30)
    for name, row in rows.items():
        row["latency_ms"] = latency[name].median_ms
    return {"space": args.equal_cost_space, "rows": rows, "supernet_steps": args.ec_supernet_steps,
            "trials": args.ec_trials, "proxy_steps": args.proxy_steps,
            "finetune_steps": args.finetune_steps}  # fmt: skip


# --one-subnet-within: the part of the space each row's supernet draws (the rest kept at the subnet's own):
# one of these halves, or model dimensions of the space joined by '+' (d_model, n_layers+weight_sharing, ...)
WITHIN = {"attention": "every attention variant, the subnet's sizes kept",
          "model": "every size, depth and sharing, the subnet's attention kept"}  # fmt: skip


def layout(args) -> dict[str, str]:
    """The supernets' layout options (``build_supernet``'s and ``SupernetTrainSettings``' keywords)."""
    return {key: getattr(args, key) for key in LAYOUT_DEFAULTS}


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


def model_dims(cfg) -> dict:
    """A config's values of the space's model dimensions (one attention for the whole model)."""
    return {"d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
            "ffn_ratio": cfg.d_ff / cfg.d_model, "weight_sharing": cfg.weight_sharing, "pooling": cfg.pooling,
            "pos_encoding": cfg.pos_encoding, "dropout": cfg.dropout}  # fmt: skip


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


def print_equal_cost(ec: dict, chance: float) -> None:
    rows = ec["rows"]
    ref_ms = rows["reference Transformer"]["latency_ms"]
    print(f"Search quality at equal cost ({ec['space']} space): one-shot = supernet {ec['supernet_steps']} steps + "
          f"{ec['trials']} candidates scored with its weights; standalone = candidates trained {ec['proxy_steps']} "
          f"steps each for the same seconds; every model then trained {ec['finetune_steps']} steps (target: the "
          "one-shot pick at least as accurate at no greater latency)")  # fmt: skip
    print("| search | candidates | search wall / CPU min | pick | test accuracy (onnxruntime) | latency ms (ort-cpu) "
          "| speedup | fine-tune steps, wall / CPU min |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    protocol = rows["one-shot (supernet)"]["search_cpu"] >= 2400 and rows["standalone search"]["search_cpu"] >= 2400
    for name, r in rows.items():
        search = "-" if not r["candidates"] else f"{r['search_seconds'] / 60:.1f} / {r['search_cpu'] / 60:.1f}"
        print(f"| {name} | {r['candidates'] or '-'} | {search} | {r['config']} | {r['test_onnx']:.4f} | "
              f"{r['latency_ms']:.2f} | {ref_ms / r['latency_ms']:.2f}x | {ec['finetune_steps']}, "
              f"{r['finetune_seconds'] / 60:.1f} / {r['finetune_cpu'] / 60:.1f} |")  # fmt: skip
    print(f"| majority class | - | - | - | {chance:.4f} | - | - | - |")
    if not protocol:
        print("SHORTER than the issue's protocol (>= 40 CPU minutes for each search)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--n-train", type=int, default=8000)
    p.add_argument("--n-eval", type=int, default=500, help="validation and test examples each")
    p.add_argument("--subnets", type=int, default=24)
    p.add_argument("--supernet-steps", type=int, default=3000)
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
    if len(args.truth_seeds) > 1 and not args.ledger:
        raise SystemExit("--truth-seeds: the other seeds' figures come from --ledger")
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.train_threads)
    try:
        resolve_device(args.device)  # (fails now, with one line, rather than after the task is built)
    except XSearchError as e:
        raise SystemExit(f"--device: {e}") from None
    global DEVICE
    DEVICE = args.device
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


def ground_noise(ledger: Ledger | None, mean: float, n_test: int) -> tuple[float, str]:
    """The noise of one standalone figure on this test split: the spread of subnets trained with several seeds
    (``--train-seed``), pooled, where the ledger holds any. Without them, the binomial sampling noise of the
    split's size stands in; it overstates the noise of a comparison on one shared split, where models of
    one architecture tend to miss the same examples (on ListOps 512 the seeds' spread came out lower)."""
    sq, dof = 0.0, 0
    for by_seed in ledger.repeats.values() if ledger else []:
        if len(by_seed) >= 2:
            v = np.asarray(list(by_seed.values()))
            sq, dof = sq + float(((v - v.mean()) ** 2).sum()), dof + v.size - 1
    if dof:
        return (sq / dof) ** 0.5, f"training seeds, {dof} degrees of freedom"
    return (mean * (1 - mean) / n_test) ** 0.5, f"binomial, {n_test} examples; no seed repeats"


def print_ground_truth(task, args, ledger: Ledger, drawn: dict[str, list]) -> dict:
    """The standalone figures' spread beside their own noise: how high any ranking's tau can be against them
    (``drawn``: each space's subnets)."""
    print()
    seeds = args.truth_seeds
    print(f"Ground truth: standalone test accuracy after {args.standalone_steps} steps ("
          + (f"training seed {seeds[0]}" if len(seeds) == 1 else f"the mean over training seeds "
             f"{', '.join(map(str, seeds))}") + "), and the tau a ranker that knew each subnet's expected accuracy "
          "would reach against it; beside it, the tau between two training seeds' figures (what one seed's "
          "figures rank the other's with)")  # fmt: skip
    print("| space | subnets measured | standalone test min / mean / max | sd | noise sd | tau of a perfect ranker "
          "(5-95%) | tau seed against seed | chance |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    doc = {}
    for name, subnets in drawn.items():
        cells = [ledger.repeats.get((name, describe_config(cfg)), {}) for cfg in subnets]
        truth = [float(np.mean([c[seed] for seed in seeds])) for c in cells if all(seed in c for seed in seeds)]
        if len(truth) < MIN_RANKED:
            print(f"| {name} | {len(truth)} of {args.subnets} | - | - | - | - | - | {task.chance('test'):.4f} |")
            continue
        noise, source = ground_noise(ledger, float(np.mean(truth)), args.n_eval)
        if len(seeds) > 1:  # the noise of a mean over k independent trainings
            noise, source = noise / len(seeds) ** 0.5, f"{source}, over the mean of {len(seeds)}"
        ceiling = noise_ceiling(truth, noise)
        first, second = seeds[:2] if len(seeds) > 1 else (0, 1)  # (one seed ranked: retested on seeds 0 and 1)
        pairs = [(c[first], c[second]) for c in cells if first in c and second in c]
        retest = (f"{tau([a for a, _ in pairs], [b for _, b in pairs]):.3f} (seeds {first} and {second}, "
                  f"{len(pairs)} subnets)"
                  if len(pairs) >= MIN_RANKED else "-")  # fmt: skip
        doc[name] = {"measured": len(truth), "sd": float(np.std(truth, ddof=1)), "noise_sd": noise,
                     "noise_source": source, "perfect_ranker_tau": ceiling}  # fmt: skip
        print(f"| {name} | {len(truth)} of {args.subnets} | {min(truth):.4f} / {np.mean(truth):.4f} / "
              f"{max(truth):.4f} | {doc[name]['sd']:.4f} | {noise:.4f} ({source}) | {ceiling[0]:.2f} "
              f"({ceiling[1]:.2f} to {ceiling[2]:.2f}) | {retest} | {task.chance('test'):.4f} |")  # fmt: skip
    repeated = {key: by_seed for key, by_seed in ledger.repeats.items() if len(by_seed) >= 2}
    if repeated:
        print()
        print("Repeatability: subnets trained again with other seeds (--train-seed)")
        print("| space | subnet | standalone test by training seed | sd |")
        print("|---|---|---|---|")
        for (space, config), by_seed in sorted(repeated.items()):
            seeds = ", ".join(f"{seed}: {acc:.4f}" for seed, acc in sorted(by_seed.items()))
            print(f"| {space} | {config} | {seeds} | {np.std(list(by_seed.values()), ddof=1):.4f} |")
    return doc


def sampling(r: dict, seed: int) -> str:
    """The sampling rule (with its shrink fraction), the supernet's seed where it is not ``seed`` (``--seed``,
    which seeded the lines from before ``--supernet-seed``), and the warm start if any (with the reference's own
    test accuracy)."""
    rule = r["sampling"] + (f" (shrink fraction {r['shrink_fraction']:g})" if "shrink_fraction" in r else "")
    if r.get("supernet_seed", seed) != seed:
        rule += f", supernet seed {r['supernet_seed']}"
    for key, default in LAYOUT_DEFAULTS.items():
        if r.get(key, default) != default:
            rule += f", {key.replace('_', ' ')} {r[key]}"
    if r.get("split_by"):
        rule += f", split by {r['split_by']} ({len(r['split'])} supernets, no weight shared across them)"
    if not r.get("warm_start"):
        return rule
    return f"{rule}, warm start (reference {r['warm_start']} steps: test {r['warm_start_test']:.4f})"


def print_ranking(task, args) -> dict:
    ledger = Ledger(args.ledger, args) if args.ledger else None
    scores = Scores(args.scores, args) if args.scores else None
    scratch_ledger = ScratchLedger(args.scratch_ledger, args) if args.scratch_ledger and args.from_scratch else None
    drawn, results = {}, []
    for name in args.spaces.split(","):
        drawn[name], ranked = run_space(name, task, args, ledger, scores, scratch_ledger)
        results += ranked
    ground = print_ground_truth(task, args, ledger, drawn) if ledger else {}
    if not results:
        if not args.truth_only and args.train_seed == args.seed:
            print(f"no ranking table: fewer than {MIN_RANKED} subnets of each space have standalone figures")
        return {"ground_truth": ground, "rankings": []}
    for r in results:  # the ground truth's ceiling, over the subnets ranked (all those the ledger holds)
        truth = [row["standalone_test"] for row in r["rows"]]
        if r["space"] in ground:
            r["perfect_ranker_tau"] = ground[r["space"]]["perfect_ranker_tau"]
        else:
            r["perfect_ranker_tau"] = noise_ceiling(truth, ground_noise(ledger, float(np.mean(truth)), args.n_eval)[0])
    protocol = args.max_len >= 512 and args.subnets >= 24 and args.standalone_steps >= 1000
    print()
    print(f"{args.subnets} subnets per space; supernet {args.supernet_steps} steps, proxy {args.proxy_steps}, "
          f"standalone {args.standalone_steps} steps; "
          + ("the issue's protocol" if protocol else "SMALLER than the issue's protocol (512 tokens, 24 subnets, "
             ">= 1,000 standalone steps)"))  # fmt: skip
    if partial := [r for r in results if r["subnets"] < r["drawn"]]:
        print("PARTIAL: " + "; ".join(f"{r['space']} ({r['sampling']}) ranked over the {r['subnets']} of its "
                                      f"{r['drawn']} subnets whose standalone figures are measured" for r in partial)
              + " (the ones left are mostly the slowest to train, so these are not a uniform draw)")  # fmt: skip
    print("Ranking fidelity (Kendall tau-b against standalone test accuracy"
          + (f", the mean over training seeds {', '.join(map(str, args.truth_seeds))}" if len(args.truth_seeds) > 1
             else "") + "; target: inherited >= 0.6 and above the proxy). p: the share of random orders of the "
          "same scores that rank at least as well (one-sided permutation test): a tau whose p is not small says "
          "no more than chance")  # fmt: skip
    print(
        "| space | sampling | subnets | tau inherited accuracy / loss (supernet; p) | the same within one width "
        "(the most common; p) | inherited validation "
        f"accuracy min-max (distinct values) / loss min-max | tau proxy (from scratch, {args.proxy_steps} steps; p) "
        "| tau by size alone: narrower / fewer parameters first | tau of a perfect "
        "ranker (the ground truth's noise) | standalone test of the "
        "pick by inherited accuracy / by inherited loss / by proxy / best | chance |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")

    def ranked(t: float, p: float) -> str:
        return f"{t:.3f} (p {p:.3f})" if t == t else "none (every subnet ties)"

    def picked(p: dict) -> str:
        return f"{p['test']:.4f}" + (f" (mean of a {p['tied']}-way tie)" if p["tied"] > 1 else "")

    for r in results:
        spread, within = r["inherited_spread"], r["within_width"]
        print(f"| {r['space']} | {sampling(r, args.seed)} | {r['subnets']} of {r['drawn']} | "
              f"{ranked(r['tau_inherited'], r['p_inherited'])} / "
              f"{ranked(r['tau_inherited_loss'], r['p_inherited_loss'])} | d{within['d_model']} "
              f"({within['subnets']}): {ranked(within['tau_inherited'], within['p_inherited'])} / "
              f"{ranked(within['tau_inherited_loss'], within['p_inherited_loss'])} | "
              f"{spread['min']:.4f}-{spread['max']:.4f} ({spread['distinct']}) / {spread['loss_min']:.3f}-"
              f"{spread['loss_max']:.3f} | {ranked(r['tau_proxy'], r['p_proxy'])} | {r['tau_narrower']:.3f} / "
              f"{r['tau_fewer_parameters']:.3f} | {r['perfect_ranker_tau'][0]:.2f} | "
              f"{picked(r['pick_by_inherited'])} / {picked(r['pick_by_inherited_loss'])} / "
              f"{picked(r['pick_by_proxy'])} / {r['best']:.4f} | {task.chance('test'):.4f} |")  # fmt: skip
    if tuned := [r for r in results if r.get("inherited_finetune")]:
        print()
        print("The inherited weights as a start: each subnet trained more steps from them, then scored on the "
              "validation split (beside the proxy: as many or more steps from new weights)")  # fmt: skip
        print("| space | sampling | fine-tune | tau fine-tuned accuracy / loss (p) | the same within one width (p) | "
              "tau proxy (p) | standalone test of the pick by fine-tuned accuracy / loss / proxy / best | "
              "seconds per candidate (fine-tune) | chance |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
        for r in tuned:
            within = r["within_width"]
            print(f"| {r['space']} | {sampling(r, args.seed)} | {r['inherited_finetune']} steps | "
                  f"{ranked(r['tau_finetuned'], r['p_finetuned'])} / "
                  f"{ranked(r['tau_finetuned_loss'], r['p_finetuned_loss'])} | d{within['d_model']} "
                  f"({within['subnets']}): {ranked(within['tau_finetuned'], within['p_finetuned'])} / "
                  f"{ranked(within['tau_finetuned_loss'], within['p_finetuned_loss'])} | "
                  f"{ranked(r['tau_proxy'], r['p_proxy'])} ({args.proxy_steps} steps) | "
                  f"{picked(r['pick_by_finetuned'])} / {picked(r['pick_by_finetuned_loss'])} / "
                  f"{picked(r['pick_by_proxy'])} / {r['best']:.4f} | {r['finetune_s']:.0f} | "
                  f"{task.chance('test'):.4f} |")  # fmt: skip
    scratch: dict[str, dict] = {}  # each space's first ranking (the figures are the same in its others)
    for r in results:
        if "scratch_s" in r:
            scratch.setdefault(r["space"], r)
    if scratch:
        print()
        print(f"From new weights: each subnet trained {args.from_scratch} steps from new weights with the proxy's "
              "recipe, then scored on the validation split (the fine-tune's control: the same recipe from another "
              "start; one row per space, as it does not depend on the supernet, set beside the space's first ranked "
              "supernet's fine-tune)")  # fmt: skip
        print("| space | steps | tau accuracy / loss (p) | the same within one width (p) | standalone test of the "
              "pick by accuracy / loss / best | seconds per candidate | tau of the fine-tune minus this, by "
              "accuracy / loss (90% interval, paired bootstrap over the subnets) | chance |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")

        def minus(d: dict | None) -> str:
            return f"{d['difference']:+.3f} ({d['low']:+.2f} to {d['high']:+.2f})" if d else "-"

        for r in scratch.values():
            within = r["within_width"]
            print(f"| {r['space']} | {args.from_scratch} | {ranked(r['tau_scratch'], r['p_scratch'])} / "
                  f"{ranked(r['tau_scratch_loss'], r['p_scratch_loss'])} | d{within['d_model']} "
                  f"({within['subnets']}): {ranked(within['tau_scratch'], within['p_scratch'])} / "
                  f"{ranked(within['tau_scratch_loss'], within['p_scratch_loss'])} | "
                  f"{picked(r['pick_by_scratch'])} / {picked(r['pick_by_scratch_loss'])} / {r['best']:.4f} | "
                  f"{r['scratch_s']:.0f} | {minus(r.get('finetuned_minus_scratch'))} / "
                  f"{minus(r.get('finetuned_minus_scratch_loss'))} | {task.chance('test'):.4f} |")  # fmt: skip
    print()
    print("Cost")
    print(
        "| space | sampling | supernet parameters | supernet training | one standalone model (mean) | "
        "seconds per scored candidate | candidates per minute |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        warm = (f" + the reference's {r['warm_start']} steps alone, {r['warm_start_seconds']:.0f} s"
                if r.get("warm_start") else "")  # fmt: skip
        print(f"| {r['space']} | {sampling(r, args.seed)} | {r['supernet_parameters']:,} | {r['supernet_steps']} steps "
              f"({r['subnet_passes']} subnet passes), "
              f"{r['supernet_seconds']:.0f} s{warm} | {args.standalone_steps} steps, "
              + (f"{r['standalone_s']:.0f} s over {r['standalone_rows']} rows of this machine and threads "
                 f"(supernet = {r['supernet_seconds'] / r['standalone_s']:.2f}x)" if r["standalone_rows"]
                 else "no row measured on this machine and threads")
              + f" | {r['score_s']:.2f} | "
              f"{60 / r['score_s']:.0f} |")  # fmt: skip
    return {"ground_truth": ground, "rankings": results}


if __name__ == "__main__":
    sys.exit(main())
