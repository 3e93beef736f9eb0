"""Per-token decode latency of every causal variant, through onnxruntime, against full attention with
its KV cache (the honest baseline: one step over the cache, not a recomputation).

For each causal variant: a 4-layer LM (d_model 256, 4 heads, the variant's default parameters,
vocabulary 256, max_len 16,385) exported as a decoder (prefill + step graphs). Its state after a
context of N random tokens is built once (torch prefill, untimed); then one onnxruntime step from
that state is timed (batch 1, 2 threads, median of the repeats). Also the state's bytes at the
largest context, and the step at 16K over the step at 256 (flat = a state that does not grow).

End to end: tokens per second of ``Generator.generate`` (what ``xsearch generate`` runs) for an
int8 ``linear`` model against the fp32 ``full`` one after a 4K-token prompt.

    python bench/decode.py [--variants a,b] [--contexts 256,1024,4096,16384] [--repeats 10]
                           [--new-tokens 64] [--prompt 4096] [--markdown]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import xsearch
from xsearch.decoding import Sampler, generate_loop
from xsearch.export import Generator, quantize_onnx, to_onnx
from xsearch.export.decoder import state_layout
from xsearch.export.metadata import PAST_LENGTH

THREADS, D_MODEL, LAYERS, HEADS, VOCAB = 2, 256, 4, 4, 256

sys.path.insert(0, str(Path(__file__).parent))
from export import table  # noqa: E402  (bench/export.py)


def lm(name: str, max_len: int) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = xsearch.ModelConfig(attention=name, d_model=D_MODEL, n_layers=LAYERS, n_heads=HEADS, d_ff=4 * D_MODEL,
                              vocab_size=VOCAB, max_len=max_len, causal=True, head="lm")  # fmt: skip
    return xsearch.build_model(cfg).eval()


def ort_state(model, gen: Generator, context: int) -> tuple[dict[str, np.ndarray], int]:
    """The onnxruntime step's inputs after ``context`` random tokens (built by torch's prefill), and their bytes."""
    ids = torch.from_numpy(np.random.default_rng(0).integers(1, VOCAB, (1, context), dtype=np.int64))
    with torch.inference_mode():
        _, state = model.prefill(ids)
    tensors = [state["layers"][i][name] for i, name, _ in state_layout(model)]
    feed = {PAST_LENGTH: state["length"].numpy(), **{n: t.numpy() for n, t in zip(gen.state_inputs, tensors)}}
    # onnxruntime's own values, as a generation loop holds them (a step's outputs are fed back as they are)
    feed = {n: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v)) for n, v in feed.items()}
    return feed, sum(t.numel() * t.element_size() for t in tensors)


def step_ms(gen: Generator, feed: dict[str, np.ndarray], repeats: int) -> float:
    from xsearch.latency.timing import timed_runs

    nxt = np.array([7], dtype=np.int64)

    def run() -> float:
        t0 = time.perf_counter()
        gen.step(nxt, feed)
        return (time.perf_counter() - t0) * 1000.0

    samples, _ = timed_runs(run, 2, repeats, patience=30.0)
    return float(np.median(samples))


def decode_rows(names: list[str], contexts: list[int], repeats: int, work: Path) -> tuple[list[list[str]], dict]:
    rows, per_variant = [], {}
    for name in names:
        model = lm(name, max(contexts) + 1)
        path = work / f"{name}.onnx"
        t0 = time.perf_counter()
        try:
            to_onnx(model, path, check=False, decoder=True)  # (parity: tests/test_decoder_export.py)
        except Exception as e:  # report and go on with the other variants
            rows.append([name, f"export failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}"])
            continue
        gen = Generator(path, threads=THREADS)
        ms, size = [], 0
        for n in contexts:
            feed, size = ort_state(model, gen, n)
            ms.append(step_ms(gen, feed, repeats))
        per_variant[name] = ms
        cells = [name, *(f"{m:.2f}" for m in ms), f"{ms[-1] / ms[0]:.2f}x", f"{size / 2**20:.2f}"]
        print(f"  {' '.join(cells)}  (export {time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        rows.append(cells)
    if "full" in per_variant:
        base = per_variant["full"]
        for r in rows:
            if r[0] in per_variant:
                r.append(f"{base[-1] / per_variant[r[0]][-1]:.1f}x")
    return rows, per_variant


def timed(fn, spent: dict[str, float], key: str):
    """``fn`` adding the seconds of each call to ``spent[key]``."""

    def run(*args):
        t0 = time.perf_counter()
        out = fn(*args)
        spent[key] += time.perf_counter() - t0
        return out

    return run


def generate_rows(prompt: int, new_tokens: int, work: Path) -> list[list[str]]:
    rows = []
    ids = np.random.default_rng(1).integers(1, VOCAB, prompt).tolist()
    for name, int8 in (("full", False), ("linear", True), ("linear", False)):
        model = lm(name, prompt + new_tokens)
        path = work / f"gen-{name}.onnx"
        to_onnx(model, path, check=False, decoder=True)
        if int8:
            path = quantize_onnx(path, work / f"gen-{name}.int8.onnx", "dynamic-int8")
        gen = Generator(path, threads=THREADS)
        gen.generate(ids[:64], 4, temperature=0)  # warm-up
        spent = {"prefill": 0.0, "step": 0.0}
        t0 = time.perf_counter()
        out = generate_loop(timed(gen.prefill, spent, "prefill"), timed(gen.step, spent, "step"), [ids], new_tokens,
                            Sampler(0.0), set())[0]  # fmt: skip
        total = time.perf_counter() - t0
        rows.append([f"{name} {'int8' if int8 else 'fp32'}", str(len(out)), f"{spent['prefill']:.2f}",
                     f"{(len(out) - 1) / spent['step']:.1f}", f"{len(out) / total:.1f}"])  # fmt: skip
        print(f"  {' '.join(rows[-1])}", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", help="comma-separated (default: every causal variant)")
    p.add_argument("--contexts", default="256,1024,4096,16384")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--prompt", type=int, default=4096, help="prompt tokens of the end-to-end run")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--skip-generate", action="store_true")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(THREADS)
    names = args.variants.split(",") if args.variants else xsearch.list_attentions(causal=True)
    contexts = [int(c) for c in args.contexts.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"per-token decode latency, ms (onnxruntime, d_model {D_MODEL}, {LAYERS} layers, batch 1, "
              f"{THREADS} threads; median of {args.repeats} steps from a state of N tokens)")  # fmt: skip
        header = ["variant", *(f"N={c}" for c in contexts), f"{contexts[-1]}/{contexts[0]}",
                  f"state MB at {contexts[-1]}", f"vs full at {contexts[-1]}"]  # fmt: skip
        rows, _ = decode_rows(names, contexts, args.repeats, work)
        print(table(header, rows, args.markdown))
        if not args.skip_generate:
            print(f"\nGenerator.generate after a {args.prompt}-token prompt, {args.new_tokens} new tokens (greedy)")
            header = ["model", "tokens", "prefill s", "decode tokens/s (steps)", "end-to-end tokens/s"]
            print(table(header, generate_rows(args.prompt, args.new_tokens, work), args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
