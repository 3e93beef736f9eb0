"""``xsearch export``, ``xsearch bench``, ``xsearch predict``, ``xsearch generate`` and ``xsearch serve``.

``predict``, ``generate`` and ``serve`` run on onnxruntime and numpy only: this module imports neither torch nor optuna.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from xsearch.cli.args import (
    UsageError,
    add_settings,
    existing_file,
    non_negative_float,
    positive_int,
    settings_from_args,
)
from xsearch.export.metadata import step_path_for
from xsearch.export.settings import ExportSettings
from xsearch.latency.timing import MeasureSettings
from xsearch.settings import show_differences

log = logging.getLogger("xsearch")


def register(name: str, p: argparse.ArgumentParser) -> None:
    if name == "export":
        p.add_argument("model", help="a saved model folder")
        p.add_argument("--out", required=True, help="the .onnx file to write")
        add_settings(p, ExportSettings)
        p.add_argument("--int8", action="store_true", help="= --quantize dynamic-int8 (the fastest on CPU)")
        p.add_argument("--fp16", action="store_true", help="= --quantize fp16 (for GPUs)")
        p.add_argument("--decoder", action="store_true",
                       help="a causal LM for generation: prefill and step graphs with the decoding state "
                            "(OUT and OUT's .step.onnx), checked by greedy generation against torch")  # fmt: skip
        p.set_defaults(func=cmd_export)
    elif name == "generate":
        p.add_argument("onnx", help="a decoder exported with `xsearch export --decoder`")
        p.add_argument("--prompt", required=True, help="the text to continue (in the task's encoding)")
        p.add_argument("--max-new-tokens", type=positive_int, required=True, help="tokens to generate at most")
        p.add_argument("--temperature", type=non_negative_float, default=1.0, help="0 = greedy (default 1.0)")
        p.add_argument("--top-k", type=positive_int, help="sample among the K most likely tokens only")
        p.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
        p.add_argument("--threads", type=positive_int, help="onnxruntime intra-op threads")
        p.set_defaults(func=cmd_generate)
    elif name == "bench":
        p.add_argument("onnx", help="an exported .onnx file")
        p.add_argument("--vs", metavar="MODEL", help="a saved model folder: its torch model is timed beside the file")
        add_settings(p, MeasureSettings)
        p.set_defaults(func=cmd_bench)
    elif name == "predict":
        p.add_argument("onnx", help="an exported .onnx file")
        p.add_argument("--input", required=True, help='JSONL file (a string, id list or {"text": ...} per line), or -')
        p.add_argument("--truncate", action="store_true", help="cut inputs longer than max_len instead of failing")
        p.add_argument("--top-k", type=positive_int, default=3, help="most likely labels shown per input (default 3)")
        p.add_argument("--threads", type=positive_int, help="onnxruntime intra-op threads")
        p.set_defaults(func=cmd_predict)
    else:
        from xsearch.export.serve import ServeSettings

        p.add_argument("onnx", help="an exported .onnx file")
        add_settings(p, ServeSettings)
        p.set_defaults(func=cmd_serve)


def cmd_export(args: argparse.Namespace) -> int:
    from xsearch.export import quantize_onnx, to_onnx
    from xsearch.serialization import load_model, load_task_info

    settings = settings_from_args(ExportSettings, args)
    if args.int8 and args.fp16:
        raise UsageError("--int8 and --fp16 contradict each other")
    mode = settings.mode
    for flag, alias in (("--int8", "dynamic-int8"), ("--fp16", "fp16")):
        if getattr(args, flag[2:]):
            if mode not in (None, alias):
                raise UsageError(f"{flag} and --quantize {mode} contradict each other")
            mode = alias
    out = Path(args.out)
    if out.suffix != ".onnx":
        raise UsageError(f"--out must end in .onnx, got {out}")
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder")
    if mode == "static-int8" and args.decoder:
        raise UsageError("--decoder with static-int8: a step graph has no calibration inputs; use --int8")
    if mode == "static-int8" and not load_task_info(args.model):
        raise UsageError(f"static-int8 calibrates on the model's task, but {args.model} has no task.json")
    model = load_model(args.model)
    fp32 = out if mode is None else out.with_name(out.stem + ".fp32.onnx")
    report = to_onnx(model, fp32, check=settings.check, opset=settings.opset, portable=settings.portable,
                     decoder=args.decoder)  # fmt: skip
    if report.max_abs_diff is None:
        checked = "unchecked"
    elif args.decoder:
        checked = (f"parity max |diff| {report.max_abs_diff:.1e} over prefill and greedy steps, prompts of "
                   f"{list(report.lengths_checked)} tokens; the same tokens as torch")  # fmt: skip
    else:
        lengths = list(report.lengths_checked)
        checked = f"parity max |diff| {report.max_abs_diff:.1e} at lengths {lengths}, batches [1, 3]"
    shown = f"{fp32} + {step_path_for(fp32).name}" if args.decoder else str(fp32)
    print(f"exported {shown} ({report.size_bytes / 1e6:.2f} MB, {report.seconds:.1f} s, {checked})")
    if mode is not None:
        calibration = _calibration_batches(args.model) if mode == "static-int8" else None
        quantize_onnx(fp32, out, mode, calibration=calibration)
        print(f"quantized ({mode}) {out} ({out.stat().st_size / 1e6:.2f} MB)")
    return 0


def _calibration_batches(model_dir: str) -> list:
    """Eight train batches of the model's own task, as numpy pairs, for static quantization."""
    from xsearch.cli.args import build_task
    from xsearch.export.quantize import calibration_batches
    from xsearch.serialization import load_task_info

    info = load_task_info(model_dir)
    options = {k: v for k, v in info.get("options", {}).items() if v is not None}
    return calibration_batches(build_task(info["name"], options))


def _same_task(onnx_meta: dict, model, vs: str, onnx: str) -> None:
    """Refuse to compare an ONNX file with a torch model of another task or length."""
    mine, theirs = onnx_meta["config"], model.config.to_dict()
    keys = ("vocab_size", "max_len", "head", "n_classes", "causal")
    task_a, task_b = (onnx_meta.get("task") or {}).get("name"), (getattr(model, "task_info", None) or {}).get("name")
    if task_a and task_b:
        mine, theirs, keys = {**mine, "task": task_a}, {**theirs, "task": task_b}, ("task", *keys)
    if shown := show_differences(mine, theirs, keys, held_as=f"in {onnx}", now_as="in --vs"):
        raise UsageError(f"--vs {vs} is a model of another task than {onnx} ({shown}); their latencies do not compare")
    if {k: v for k, v in mine.items() if k != "dropout"} != {k: v for k, v in theirs.items() if k != "dropout"}:
        log.warning("--vs %s has another architecture than %s: the ratio compares two different models", vs, onnx)


def cmd_bench(args: argparse.Namespace) -> int:
    from xsearch.export.predictor import read_metadata
    from xsearch.latency.target import get_target
    from xsearch.latency.timing import measure_interleaved

    settings = settings_from_args(MeasureSettings, args)
    target = get_target(settings.target)
    if not target.runs_exported:
        raise UsageError(f"--target {target.name}: bench times an ONNX file; choose an onnxruntime target")
    meta = read_metadata(existing_file(args.onnx, "ONNX file"))
    onnx_name = f"onnxruntime {target.name}"
    models: dict = {onnx_name: args.onnx}
    targets = {}
    if args.vs:  # timed in alternating rounds with the ONNX file, so a load drift hits both alike
        from xsearch.serialization import load_model

        model = load_model(args.vs)
        _same_task(meta, model, args.vs, args.onnx)
        eager = target.eager()
        models[f"torch {eager.name}"] = model
        targets[f"torch {eager.name}"] = eager
    stats = measure_interleaved(models, target, batch=settings.batch, seq_len=settings.seq_len,
                                threads=settings.threads, repeats=settings.repeats, warmup=settings.warmup, rounds=3,
                                targets=targets, mode=settings.latency_mode,
                                context=settings.decode_context)  # fmt: skip
    rows = list(stats.items())
    base = rows[-1][1].median_ms
    what = {"forward": f"seq_len {settings.seq_len}", "prefill": f"prefill of {settings.seq_len} tokens",
            "decode": f"one decode step after {settings.decode_context} tokens"}[settings.latency_mode]  # fmt: skip
    print(f"batch {settings.batch}, {what}, threads {settings.threads or 'default'}, {settings.repeats} runs")
    print(f"{'engine':28s} {'median ms':>10s} {'p90 ms':>10s} {'speedup':>8s}")
    for name, st in rows:
        print(f"{name:28s} {st.median_ms:10.2f} {st.p90_ms:10.2f} {base / st.median_ms:7.2f}x")
    return 0


def read_inputs(source: str) -> list:
    """The inputs of ``predict``: one JSON value per line (a string, a list of token ids, or ``{"text": ...}``)."""
    from xsearch.jsonl import parse_jsonl, read_jsonl

    if source == "-":
        lines = parse_jsonl(sys.stdin.read().splitlines(), "<stdin>")
    else:
        lines = read_jsonl(existing_file(source, "input file"))
    items = []
    for i, obj in lines:
        if isinstance(obj, dict):
            obj = obj.get("text", obj.get("input_ids"))
        if not isinstance(obj, (str, list)):
            raise UsageError(f'{source}:{i}: expected a string, a list of token ids, or {{"text": ...}}')
        items.append(obj)
    if not items:
        raise UsageError(f"{source}: no inputs")
    return items


def cmd_predict(args: argparse.Namespace) -> int:
    from xsearch.export.predictor import Predictor

    predictor = Predictor(existing_file(args.onnx, "ONNX file"), threads=args.threads)
    items = read_inputs(args.input)
    for pred in predictor.predict(items, truncate=args.truncate, top_k=args.top_k):
        print(json.dumps(pred.to_dict()))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from xsearch.export.generator import Generator

    generator = Generator(existing_file(args.onnx, "ONNX file"), threads=args.threads)
    text = generator.generate_text(args.prompt, args.max_new_tokens, temperature=args.temperature,
                                   top_k=args.top_k, seed=args.seed)  # fmt: skip
    print(text)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from xsearch.export.serve import ServeSettings, serve

    settings = settings_from_args(ServeSettings, args)
    serve(existing_file(args.onnx, "ONNX file"), settings)  # (it warns when it listens beyond this machine)
    return 0
