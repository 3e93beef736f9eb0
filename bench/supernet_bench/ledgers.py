"""The files that keep measured figures across sittings, one JSON line each: the proxy and standalone figures
(``--ledger``), the from-scratch control's (``--scratch-ledger``) and each supernet's inherited scores
(``--scores``), with the machine each line was measured on."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from supernet_bench.spaces import layout
from xsearch.config import describe_config
from xsearch.supernet.settings import LAYOUT_DEFAULTS


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


DEVICE = "cpu"  # --device (bench/supernet.py's main sets it): named in each ledger and scores line


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


class ScratchLedger(KeptRows):
    """Each subnet trained ``--from-scratch`` steps from new weights with the proxy's recipe and scored on the
    validation split (accuracy and loss), one JSON line each (``--scratch-ledger``): the fine-tune's control,
    the same steps from new weights rather than the supernet's."""

    BUDGET = ("max_len", "n_train", "n_eval", "seed", "lr", "from_scratch", "train_seed", "pos_encoding")


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

    def add(self, run: dict, *, passes: int | None = None) -> None:
        """Keep ``run`` under this budget, or, given ``passes`` (a supernet trained to a deadline), under this
        budget with those passes as its ``supernet_steps``."""
        budget = self.budget if passes is None else {**self.budget, "supernet_steps": passes}
        doc = {"budget": budget, **run}
        if budget == self.budget:
            self.runs[self.key(doc)] = doc
        append_line(self.path, doc)
