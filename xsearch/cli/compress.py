"""``xsearch compress``: prune, fine-tune (distilling from a teacher), export and quantize a saved model,
with a before/after table of parameters, file size, latency and test accuracy."""

from __future__ import annotations

import argparse
from pathlib import Path

from xsearch.cli.args import (
    UsageError,
    add_settings,
    add_task_args,
    build_task,
    output_dir,
    settings_from_args,
    task_of_model,
)
from xsearch.compress.settings import CompressSettings
from xsearch.latency.timing import MeasureSettings

MEASURE_DEFAULTS = {"threads": 2}


def register(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a saved model folder")
    add_task_args(p, required=False)
    add_settings(p.add_argument_group("compression"), CompressSettings)
    p.add_argument("--distill-from", metavar="MODEL", help="a saved teacher model folder (with --finetune-steps)")
    p.add_argument("--int8", action="store_true", help="also write the dynamic int8 ONNX file, and time that one")
    add_settings(
        p.add_argument_group("latency"), MeasureSettings, only=("target", "threads"), defaults=MEASURE_DEFAULTS
    )
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--out", required=True, help="output folder (model.safetensors, model.onnx, model.int8.onnx)")
    p.set_defaults(func=cmd_compress)


def _row(label: str, parameters: int, onnx_path: Path, task, measure: MeasureSettings) -> tuple:
    from xsearch.latency.timing import measure as time_it
    from xsearch.training.loop import evaluate_onnx

    lat = time_it(onnx_path, measure.target, seq_len=task.max_len, threads=measure.threads, repeats=20).median_ms
    accuracy = evaluate_onnx(onnx_path, task, "test", threads=measure.threads)
    return (label, parameters, onnx_path.stat().st_size, lat, accuracy)


def cmd_compress(args: argparse.Namespace) -> int:
    import tempfile

    from xsearch.compress.recipe import compress_model
    from xsearch.export import quantize_onnx, to_onnx
    from xsearch.latency.target import get_target
    from xsearch.model import count_parameters
    from xsearch.serialization import load_model, save_model, staged_directory

    settings = settings_from_args(CompressSettings, args)
    out = output_dir(args.out)
    if args.distill_from and not settings.finetune_steps:
        raise UsageError("--distill-from needs --finetune-steps (distillation is the fine-tuning)")
    if settings.finetune_steps:
        from xsearch.training.device import resolve_device

        resolve_device(settings.device)  # (before the model is exported and timed)
    model = load_model(args.model)
    teacher = load_model(args.distill_from) if args.distill_from else None
    if teacher is not None and (teacher.config.head, teacher.head.out_features) != (
        model.config.head,
        model.head.out_features,
    ):
        raise UsageError(f"--distill-from {args.distill_from}: the teacher's head ({teacher.config.head}, "
                         f"{teacher.head.out_features} outputs) is not the model's ({model.config.head}, "
                         f"{model.head.out_features})")  # fmt: skip
    name, options = task_of_model(args.model, args)
    task = build_task(name, options)
    if task.kind != "classify":
        raise UsageError("compress reports accuracy and needs a classification task")
    measure = settings_from_args(MeasureSettings, args, defaults=MEASURE_DEFAULTS, fixed={"seq_len": task.max_len})
    if not get_target(measure.target).runs_exported:
        raise UsageError(f"--target {measure.target}: compress times ONNX files; choose an onnxruntime target")
    with tempfile.TemporaryDirectory() as d:
        before_onnx = Path(d) / "before.onnx"
        to_onnx(model, before_onnx, task=task.describe())
        before = _row("before (fp32)", count_parameters(model), before_onnx, task, measure)
    compress_model(model, task, settings, teacher=teacher, progress=not args.quiet)
    with staged_directory(out) as stage:
        save_model(model, stage, task=task.describe())
        final = stage / "model.onnx"
        to_onnx(model, final, task=task.describe())
        if args.int8:
            quantize_onnx(final, stage / "model.int8.onnx", "dynamic-int8")
            final = stage / "model.int8.onnx"
        after = _row("after" + (" (int8)" if args.int8 else ""), count_parameters(model), final, task, measure)
    chance = task.chance("test")
    print(f"{'':16s} {'parameters':>11s} {'file MB':>8s} {'latency ms':>11s} {'accuracy':>9s}   ({measure.target}, "
          f"{task.max_len} tokens, {measure.threads} threads; chance accuracy {chance:.4f})")  # fmt: skip
    for label, params, size, lat, acc in (before, after):
        print(f"{label:16s} {params:11,d} {size / 1e6:8.3f} {lat:11.2f} {acc:9.4f}")
    print(f"{'ratio':16s} {before[1] / after[1]:10.2f}x {before[2] / after[2]:7.2f}x {before[3] / after[3]:10.2f}x "
          f"{after[4] - before[4]:+9.4f}")  # fmt: skip
    print(f"saved {out} (model.safetensors, model.onnx{', model.int8.onnx' if args.int8 else ''})")
    return 0
