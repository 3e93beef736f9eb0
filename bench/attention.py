"""Forward latency and peak memory of every attention variant against `full`, in one run.

Setting (issue 2/3): d_model 256, 4 heads, batch 1, 2 threads, inference mode, N in
1024..8192. Latency: for each N all variants are timed in one process in interleaved rounds
(one forward of each variant per round, median over rounds), so drifting background load
hits every variant alike; the ratio is against `full` from the same rounds. Peak memory: each
(variant, N) runs once in a fresh subprocess, as the rise of the resident set's high-water
mark over one forward pass.

    python bench/attention.py [--variants a,b] [--lengths 1024,8192] [--markdown] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time

D_MODEL, HEADS, THREADS = 256, 4, 2
# The settings the issue names for its targets; every other variant runs with its defaults.
BENCH_PARAMS = {"local": {"block_size": 256}, "linformer": {"k": 256}, "performer": {"nb_features": 256}}
TARGETS = {"linear": 10.0, "linformer": 6.0, "performer": 5.0, "local": 4.0}  # speedup at N = 8192


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def build(name: str, n: int):
    import torch

    import xsearch

    torch.manual_seed(0)
    return xsearch.build_attention(name, D_MODEL, HEADS, max_len=n, **BENCH_PARAMS.get(name, {})).eval()


def peak_memory(name: str, n: int) -> dict:
    """Runs in the subprocess: the resident-set rise over one forward pass, in MB."""
    import torch

    torch.set_num_threads(THREADS)
    m = build(name, n)
    x = torch.randn(1, n, D_MODEL)
    with torch.inference_mode():
        m(x[:, : min(n, 64)])  # first-call allocations (kernels, caches) out of the way
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the high-water mark to the current RSS
        except OSError:
            pass
        before = _rss_kb("VmRSS")
        m(x)
        return {"peak_mb": max(_rss_kb("VmHWM") - before, 0) / 1024}


def run_memory(name: str, n: int) -> dict:
    code = (
        "import sys, json; sys.path.insert(0, 'bench'); import attention as b; "
        f"print(json.dumps(b.peak_memory({name!r}, {n})))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def time_interleaved(names: list[str], n: int, rounds: int) -> dict[str, float]:
    """Median forward ms of each variant over ``rounds`` interleaved rounds."""
    import torch

    torch.set_num_threads(THREADS)
    x = torch.randn(1, n, D_MODEL)
    models = {name: build(name, n) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    with torch.inference_mode():
        for m in models.values():
            m(x)  # warm-up
        for _ in range(rounds):
            for name, m in models.items():
                t0 = time.perf_counter()
                m(x)
                samples[name].append((time.perf_counter() - t0) * 1000)
    return {name: sorted(v)[len(v) // 2] for name, v in samples.items()}


def main() -> int:
    import xsearch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", help="comma-separated names (default: all; `full` is always included)")
    p.add_argument("--lengths", default="1024,2048,4096,8192")
    p.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds per length")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--json", help="also write the raw results here")
    args = p.parse_args()
    names = args.variants.split(",") if args.variants else xsearch.list_attentions()
    names = ["full"] + [n for n in names if n != "full"]
    lengths = [int(x) for x in args.lengths.split(",")]
    results = {}
    for n in lengths:
        times = time_interleaved(names, n, args.rounds)
        for name in names:
            mem = run_memory(name, n)
            results[name, n] = r = {"variant": name, "n": n, "median_ms": times[name], **mem}
            print(f"  {name:18s} N={n:5d} {r['median_ms']:9.1f} ms " + (f"{r['peak_mb']:8.1f} MB" if "error" not in r
                  else r["error"]), file=sys.stderr, flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**r} for r in results.values()], f, indent=2)
    print_table(names, lengths, results, args.markdown)
    return 0


def print_table(names, lengths, results, markdown: bool) -> None:
    import xsearch

    hi, lo = max(lengths), (2048 if 2048 in lengths else min(lengths))
    header = ["variant", "complexity"] + [f"ms N={n}" for n in lengths] + [f"x full N={n}" for n in lengths]
    header += [f"MB N={n}" for n in lengths] + [f"mem {hi}/{lo}", "target"]
    bound = (hi / lo) * math.log(hi) / math.log(lo)  # linear-times-log growth
    rows = []
    for name in names:
        spec = xsearch.attention_spec(name)
        cells = [name, spec.complexity]
        rs = [results[name, n] for n in lengths]
        if any("error" in r for r in rs):
            rows.append(cells + ["error: " + next(r["error"] for r in rs if "error" in r)])
            continue
        cells += [f"{r['median_ms']:.1f}" for r in rs]
        cells += [f"{results['full', n]['median_ms'] / r['median_ms']:.2f}x" for n, r in zip(lengths, rs)]
        cells += [f"{r['peak_mb']:.1f}" for r in rs]
        growth = results[name, hi]["peak_mb"] / max(results[name, lo]["peak_mb"], 1e-3)
        cells.append(f"{growth:.2f}")
        speed = results["full", hi]["median_ms"] / results[name, hi]["median_ms"]
        if name == "full":
            verdict = "baseline"
        elif spec.quadratic:
            verdict = "O(N²): no target"
        else:
            need = TARGETS.get(name, 1.0)
            ok = speed >= need and (growth <= bound or results[name, hi]["peak_mb"] < 16)
            verdict = f"{'met' if ok else 'MISSED'} (>= {need:g}x, mem <= {bound:.2f})"
        cells.append(verdict)
        rows.append(cells)
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"attention forward, d_model {D_MODEL}, {HEADS} heads, batch 1, {THREADS} threads")
    for h in header:
        t.add_column(h, justify="right")
    for r in rows:
        t.add_row(*r, *[""] * (len(header) - len(r)))
    Console(width=250).print(t)


if __name__ == "__main__":
    sys.exit(main())
