"""Forward latency and peak memory of every attention variant against `full`, in one run.

Setting (issue 2/3): d_model 256, 4 heads, batch 1, 2 threads, inference mode, N in
1024..8192. Each (variant, N) runs in a fresh subprocess so its peak memory (the rise of
the resident set's high-water mark over the forward pass) is its own. Speed is reported as
a ratio against `full` measured in the same run.

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


def child(name: str, n: int, budget_s: float) -> dict:
    """Runs in the subprocess: build, measure peak memory of one forward, then time it."""
    import torch

    import xsearch

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    m = xsearch.build_attention(name, D_MODEL, HEADS, max_len=n, **BENCH_PARAMS.get(name, {})).eval()
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
        peak_mb = max(_rss_kb("VmHWM") - before, 0) / 1024
        times = []
        start = time.perf_counter()
        while len(times) < 3 or (len(times) < 10 and time.perf_counter() - start < budget_s):
            t0 = time.perf_counter()
            m(x)
            times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {"variant": name, "n": n, "median_ms": times[len(times) // 2], "peak_mb": peak_mb, "runs": len(times)}


def run_one(name: str, n: int, budget_s: float) -> dict:
    code = (
        "import sys, json; sys.path.insert(0, 'bench'); import attention as b; "
        f"print(json.dumps(b.child({name!r}, {n}, {budget_s})))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        return {"variant": name, "n": n, "error": (r.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    import xsearch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", help="comma-separated names (default: all; `full` is always included)")
    p.add_argument("--lengths", default="1024,2048,4096,8192")
    p.add_argument("--budget", type=float, default=3.0, help="seconds of timed runs per cell (3-10 runs)")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--json", help="also write the raw results here")
    args = p.parse_args()
    names = args.variants.split(",") if args.variants else xsearch.list_attentions()
    names = ["full"] + [n for n in names if n != "full"]
    lengths = [int(x) for x in args.lengths.split(",")]
    results = {}
    for name in names:
        for n in lengths:
            results[name, n] = r = run_one(name, n, args.budget)
            print(f"  {name:18s} N={n:5d} " + (f"{r['median_ms']:9.1f} ms {r['peak_mb']:8.1f} MB" if "error" not in r
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
