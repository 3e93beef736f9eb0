"""``--tables equal-cost``: the one-shot search against today's standalone search given the same seconds."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from lra_listops import cpu_seconds  # (bench/, beside bench/supernet.py)

from xsearch.config import describe_config
from xsearch.search_spaces import load_space_for_task
from xsearch.supernet import build_supernet, extract_subnet
from xsearch.supernet.settings import SupernetTrainSettings
from xsearch.supernet.train import train_supernet
from xsearch.training.recipe import train_model
from xsearch.training.settings import TrainSettings


class Clock:
    """Wall and CPU seconds (this process and its children) since it was made."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), cpu_seconds()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, cpu_seconds() - self.cpu


def equal_cost(task, task_options: dict, args) -> dict:
    """The one-shot search against today's standalone search given the same seconds (see bench/supernet.py's text)."""
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
    space = load_space_for_task(args.equal_cost_space, task)  # as the searches load it (its supernet must match)
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
