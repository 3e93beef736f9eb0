"""The ``xsearch`` command line. Errors a user can cause print one line and exit with status 2."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

EXIT_USAGE = 2


class UsageError(Exception):
    """A bad command line or input; printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of usage + message
        raise UsageError(f"{self.prog}: {message}")


def parse_value(text: str) -> Any:
    """``"64"`` -> 64, ``"0.5"`` -> 0.5, ``"true"`` -> True, anything else stays a string."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, bool, str)) else text


def parse_assignments(items: list[str] | None, flag: str) -> dict[str, Any]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} expects KEY=VALUE, got {item!r}")
        out[key.strip()] = parse_value(value.strip())
    return out


# -- task options shared by train / eval -------------------------------------------------
def add_task_args(p: argparse.ArgumentParser, required: bool) -> None:
    g = p.add_argument_group("task")
    g.add_argument("--task", required=required, help="listops | text | lm")
    g.add_argument("--data", help="text: a JSONL file split into train/valid/test; lm: a UTF-8 text file")
    g.add_argument("--train-data", help="text: training JSONL")
    g.add_argument("--valid-data", help="text: validation JSONL")
    g.add_argument("--test-data", help="text: test JSONL")
    g.add_argument("--max-len", type=int, help="longest sequence (tokens / bytes)")
    g.add_argument("--preset", help="listops: 'lra' for the Long Range Arena setting")
    g.add_argument("--task-opt", action="append", metavar="KEY=VALUE", help="any other task option")


def task_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if args.data is not None:
        opts["path" if args.task == "lm" else "data"] = args.data
    for key, attr in (("train", "train_data"), ("valid", "valid_data"), ("test", "test_data")):
        if getattr(args, attr) is not None:
            opts[key] = getattr(args, attr)
    if args.max_len is not None:
        opts["max_len"] = args.max_len
    if args.preset is not None:
        opts["preset"] = args.preset
    opts.update(parse_assignments(args.task_opt, "--task-opt"))
    return opts


def build_task(name: str, options: dict[str, Any]):
    from xsearch.tasks import get_task

    logging.getLogger("xsearch").info("building task %s %s", name, options or "")
    return get_task(name, **options)


# -- commands ------------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    from xsearch.attention import attention_spec, list_attentions

    names = list_attentions(causal=True if args.causal else None)
    rows = []
    for name in names:
        s = attention_spec(name)
        params = ", ".join(f"{k}={v}" for k, v in s.params.items()) or "-"
        rows.append((name, s.paper, "+".join(s.family) or "-", s.complexity, "yes" if s.causal else "no", params))
    if args.markdown:
        print("| name | paper | family | complexity | causal | parameters (defaults) |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print("| " + " | ".join(f"`{r[0]}`" if i == 0 else r[i] for i in range(len(r))) + " |")
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(rows)} attention variants")
    for col in ("name", "family", "complexity", "causal", "parameters", "paper"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r[0], r[2], r[3], r[4], r[5], r[1])
    Console().print(table)
    return 0


def model_config_from_args(args: argparse.Namespace, task) -> Any:
    from xsearch.config import ModelConfig
    from xsearch.serialization import read_json

    base: dict[str, Any] = {}
    if args.config:
        doc = read_json(Path(args.config))
        base = doc.get("model", doc) if isinstance(doc, dict) else doc
        if not isinstance(base, dict):
            raise UsageError(f"{args.config}: expected a JSON object with the model config")
    overrides = {
        "attention": args.attention,
        "d_model": args.d_model,
        "n_layers": args.layers,
        "n_heads": args.heads,
        "head_dim": args.head_dim,
        "d_ff": args.d_ff,
        "weight_sharing": args.weight_sharing,
        "dropout": args.dropout,
        "pos_encoding": args.pos_encoding,
    }
    cfg = {**base, **{k: v for k, v in overrides.items() if v is not None}}
    params = parse_assignments(args.set, "--set")
    if params or args.attention is not None:
        keep = base.get("attention_params", {}) if cfg.get("attention") == base.get("attention") else {}
        cfg["attention_params"] = {**keep, **params}
    fields = task.model_fields()
    if base and base.get("max_len", fields["max_len"]) < fields["max_len"]:
        raise UsageError(f"config max_len={base['max_len']} is shorter than the task's max_len={fields['max_len']}")
    cfg.update(fields)
    return ModelConfig.from_dict(cfg)


def cmd_train(args: argparse.Namespace) -> int:
    import torch

    from xsearch.model import build_model, count_parameters
    from xsearch.serialization import atomic_write_text, save_model
    from xsearch.training import evaluate, train

    if args.steps is None and args.seconds is None:
        raise UsageError("train: give --steps or --seconds")
    if args.attention is not None:  # fail on a bad name before the (slower) task is built
        from xsearch.attention import attention_spec

        attention_spec(args.attention)
    task = build_task(args.task, task_options(args))
    cfg = model_config_from_args(args, task)
    torch.manual_seed(args.seed)
    model = build_model(cfg)
    log = logging.getLogger("xsearch")
    log.info("model: %s, %d parameters", cfg.attention, count_parameters(model))
    result = train(
        model,
        task,
        steps=args.steps,
        seconds=args.seconds,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        progress=not args.quiet,
    )
    metric = evaluate(model, task, "test")
    out = save_model(model, args.out, task=task.describe())
    name = "test_bits_per_byte" if task.kind == "lm" else "test_accuracy"
    metrics = {
        "steps": result.steps,
        "train_seconds": round(result.seconds, 2),
        "final_loss": result.final_loss,
        "valid": result.valid_metric,
        name: metric,
        "parameters": count_parameters(model),
    }
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2))
    print(f"saved {out}  steps={result.steps}  {name}={metric:.4f}  parameters={metrics['parameters']}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import time

    import torch

    from xsearch.serialization import load_model, load_task_info
    from xsearch.tasks.encoding import Encoding
    from xsearch.training import evaluate

    model = load_model(args.model)
    info = load_task_info(args.model) or {}
    task = _task_for_model(args.model, args)
    name = task.name
    if info.get("encoding") and Encoding.from_dict(info["encoding"]) != task.encoding:
        raise UsageError(f"task {name!r} encodes input differently from the task {args.model} was trained on")
    if task.max_len > model.config.max_len:
        raise UsageError(f"task max_len={task.max_len} exceeds the model's max_len={model.config.max_len}")
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    metric = evaluate(model, task, args.split, batch_size=args.batch_size)
    seconds = time.perf_counter() - start
    key = "bits_per_byte" if task.kind == "lm" else "accuracy"
    result = {"model": str(args.model), "task": name, "split": args.split, key: metric, "seconds": round(seconds, 2)}
    print(json.dumps(result) if args.json else f"{name} {args.split} {key} = {metric:.4f}  ({seconds:.1f} s)")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from xsearch.export import quantize_onnx, to_onnx
    from xsearch.serialization import load_model

    mode = "dynamic-int8" if args.int8 else "fp16" if args.fp16 else args.quantize
    out = Path(args.out)
    if out.suffix != ".onnx":
        raise UsageError(f"--out must end in .onnx, got {out}")
    model = load_model(args.model)
    fp32 = out if mode is None else out.with_name(out.stem + ".fp32.onnx")
    report = to_onnx(model, fp32, check=not args.no_check, opset=args.opset, portable=args.portable)
    checked = (
        "unchecked"
        if report.max_abs_diff is None
        else (f"parity max |diff| {report.max_abs_diff:.1e} at lengths {list(report.lengths_checked)}, batches [1, 3]")
    )
    print(f"exported {fp32} ({report.size_bytes / 1e6:.2f} MB, {report.seconds:.1f} s, {checked})")
    if mode is not None:
        calibration = None
        if mode == "static-int8":
            calibration = _calibration_batches(args.model, model)
        quantize_onnx(fp32, out, mode, calibration=calibration)
        print(f"quantized ({mode}) {out} ({out.stat().st_size / 1e6:.2f} MB)")
    return 0


def _calibration_batches(model_dir: str, model) -> list:
    """Eight train batches of the model's own task, as numpy pairs, for static quantization."""
    from xsearch.export.quantize import calibration_batches
    from xsearch.serialization import load_task_info

    info = load_task_info(model_dir)
    if not info:
        raise UsageError(f"static-int8 calibrates on the model's task, but {model_dir} has no task.json")
    return calibration_batches(
        build_task(info["name"], {k: v for k, v in info.get("options", {}).items() if v is not None})
    )


def cmd_bench(args: argparse.Namespace) -> int:
    from xsearch.latency import measure_interleaved

    onnx_name = "onnxruntime " + args.target
    models: dict = {onnx_name: args.onnx}
    targets = {}
    if args.vs:  # timed in alternating rounds with the ONNX file, so a load drift hits both alike
        from xsearch.serialization import load_model

        torch_target = "torch-cuda" if args.target == "ort-cuda" else "torch-cpu"
        models[f"torch {torch_target}"] = load_model(args.vs)
        targets[f"torch {torch_target}"] = torch_target
    stats = measure_interleaved(models, args.target, batch=args.batch, seq_len=args.seq_len, threads=args.threads,
                                repeats=args.repeats, rounds=3, targets=targets)  # fmt: skip
    rows = list(stats.items())
    base = rows[-1][1].median_ms
    print(f"batch {args.batch}, seq_len {args.seq_len}, threads {args.threads or 'default'}, {args.repeats} runs")
    print(f"{'engine':28s} {'median ms':>10s} {'p90 ms':>10s} {'speedup':>8s}")
    for name, st in rows:
        print(f"{name:28s} {st.median_ms:10.2f} {st.p90_ms:10.2f} {base / st.median_ms:7.2f}x")
    return 0


def _read_inputs(source: str) -> list:
    stream = sys.stdin if source == "-" else None
    if stream is None:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"no such input file: {path}")
        lines = path.read_text(encoding="utf-8").splitlines()
    else:
        lines = stream.read().splitlines()
    from xsearch.jsonl import parse_jsonl

    items = []
    for i, obj in parse_jsonl(lines, source):
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

    predictor = Predictor(args.onnx, threads=args.threads)
    items = _read_inputs(args.input)
    for pred in predictor.predict(items, truncate=args.truncate, top_k=args.top_k):
        print(json.dumps(pred.to_dict()))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from xsearch.export.serve import serve

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("xsearch").warning("listening on %s: reachable beyond this machine", args.host)
    serve(args.onnx, args.host, args.port, threads=args.threads, max_body=args.max_body, max_batch=args.max_batch)
    return 0


def cmd_spaces(args: argparse.Namespace) -> int:
    from xsearch.search_spaces import list_spaces, load_space

    if args.show:
        print(load_space(args.show).to_yaml(), end="")
        return 0
    for name in list_spaces():
        space = load_space(name)
        size = f"{len(space.attention):2d} variants  {space.size():.3g} configurations"
        print(f"{name:10s} {size}  {space.description.strip()}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from xsearch.search import SearchSettings, run_search
    from xsearch.search_spaces import load_space
    from xsearch.storage import storage_kind

    if args.train_steps is not None and args.train_seconds is not None:
        raise UsageError("search: give --train-steps or --train-seconds, not both")
    settings = SearchSettings(
        task=args.task,
        task_options=task_options(args),
        space=args.space,
        target=args.target,
        trials=args.trials,
        timeout=args.timeout,
        storage=args.storage,
        study=args.study,
        seq_len=args.seq_len,
        batch=args.batch,
        threads=args.threads,
        max_latency_ms=args.max_latency_ms,
        max_params=args.max_params,
        train_steps=args.train_steps,
        train_seconds=None if args.train_steps is not None else (args.train_seconds or 30.0),
        batch_size=args.batch_size,
        lr=args.lr,
        sampler=args.sampler,
        seed=args.seed,
        objective=args.objective,
        pruner=args.pruner,
        heartbeat_interval=args.heartbeat_interval,
        grace_period=args.grace_period,
        latency_predictor=args.latency_predictor,
    )
    load_space(args.space)  # a bad space or storage URL fails before the task is built
    storage_kind(args.storage)
    study = run_search(settings, progress=not args.quiet)
    return _print_front(study)


def _print_front(study) -> int:
    from xsearch.search import describe_trial, pareto_front, reference_trial, trial_latency_ms, trial_metric

    ref = reference_trial(study)
    front = pareto_front(study)
    metric = study.user_attrs.get("metric", "metric")
    states = {}
    for t in study.get_trials(deepcopy=False):
        states[t.state.name] = states.get(t.state.name, 0) + 1
    print(f"study {study.study_name!r}: " + ", ".join(f"{v} {k}" for k, v in sorted(states.items())))
    _print_pruning(study)
    if not front:
        print("no feasible completed trial yet")
        return 0
    print(f"Pareto front ({len(front)} trials), against the reference Transformer:")
    print(f"  {'#':>4s}  {metric:>13s}  {'latency ms':>10s}  {'speedup':>8s}  {'delta':>8s}  architecture")
    for t in front:
        value, lat = trial_metric(t), trial_latency_ms(t)
        speed = f"{trial_latency_ms(ref) / lat:.2f}x" if ref else "-"
        delta = f"{value - trial_metric(ref):+.4f}" if ref else "-"
        print(f"  {t.number:4d}  {value:13.4f}  {lat:10.2f}  {speed:>8s}  {delta:>8s}  {describe_trial(t)}")
    if ref:
        print(f"  reference #{ref.number}: {metric} {trial_metric(ref):.4f}, {trial_latency_ms(ref):.2f} ms")
    return 0


def _print_pruning(study) -> None:
    """One line on a budgeted study: trials pruned before training, stopped early, and training steps spent."""
    trials = study.get_trials(deepcopy=False)
    reasons = [t.user_attrs.get("pruned", "") for t in trials if t.state.name == "PRUNED"]
    if not reasons:
        return
    budget = sum(r.startswith("over budget") for r in reasons)
    early = sum(r.startswith("stopped early") for r in reasons)
    steps = sum(int(t.user_attrs.get("train_steps") or 0) for t in trials)
    print(f"pruned: {budget} over budget before training, {early} stopped early; {steps} training steps in all")


def cmd_report(args: argparse.Namespace) -> int:
    from xsearch.report import load, write_report

    study = load(args.storage, args.study)
    write_report(study, args.out)
    _print_front(study)
    print(f"wrote {args.out}/pareto.html, pareto.png, trials.csv, front.json")
    return 0


def cmd_pick(args: argparse.Namespace) -> int:
    from xsearch.report import load, pick
    from xsearch.search import describe_trial, trial_latency_ms, trial_metric
    from xsearch.serialization import atomic_write_text

    study = load(args.storage, args.study)
    t = pick(study, args.max_latency_ms)
    value, latency = trial_metric(t), trial_latency_ms(t)
    doc = {
        "model": t.user_attrs["model_config"],
        "trial": t.number,
        "study": study.study_name,
        study.user_attrs.get("metric", "metric"): value,
        "latency_ms": latency,
        "task": study.user_attrs.get("task"),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(doc, indent=2, default=str))
    print(f"picked trial {t.number}: {describe_trial(t)} ({value:.4f}, {latency:.2f} ms) -> {out}")
    return 0


def _task_for_model(model_dir: str, args: argparse.Namespace):
    """The task a saved model was trained on, rebuilt from task.json (flags override options)."""
    from xsearch.serialization import load_task_info

    info = load_task_info(model_dir) or {}
    name = getattr(args, "task", None) or info.get("name")
    if name is None:
        raise UsageError(f"{model_dir} has no task.json; give --task")
    options = (
        {k: v for k, v in (info.get("options") or {}).items() if v is not None} if name == info.get("name") else {}
    )
    options.update(task_options(argparse.Namespace(**{**vars(args), "task": name})))
    return build_task(name, options)


def _measure_row(label: str, model, onnx_path: Path, task, target: str, threads: int) -> tuple:
    from xsearch.latency import measure
    from xsearch.model import count_parameters
    from xsearch.training import evaluate_onnx

    lat = measure(onnx_path, target, seq_len=task.max_len, threads=threads, repeats=20).median_ms
    accuracy = evaluate_onnx(onnx_path, task, "test", threads=threads)
    return (label, count_parameters(model), onnx_path.stat().st_size, lat, accuracy)


def cmd_compress(args: argparse.Namespace) -> int:
    import tempfile

    import torch

    from xsearch.compress import distill, prune
    from xsearch.export import quantize_onnx, to_onnx
    from xsearch.serialization import load_model, save_model
    from xsearch.training import train

    model = load_model(args.model)
    task = _task_for_model(args.model, args)
    if task.kind != "classify":
        raise UsageError("compress reports accuracy and needs a classification task")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        before_onnx = Path(d) / "before.onnx"
        to_onnx(model, before_onnx, task=task.describe())
        before = _measure_row("before (fp32)", model, before_onnx, task, args.target, args.threads)
    torch.manual_seed(args.seed)
    if args.prune_heads or args.prune_ffn:
        prune(model, heads=args.prune_heads, ffn=args.prune_ffn, importance=args.importance, task=task)
    if args.finetune_steps:
        if args.distill_from:
            teacher = load_model(args.distill_from)
            distill(model, teacher, task, steps=args.finetune_steps, temperature=args.temperature, alpha=args.alpha,
                    batch_size=args.batch_size, lr=args.lr, seed=args.seed, progress=not args.quiet)  # fmt: skip
        else:
            train(model, task, steps=args.finetune_steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                  progress=not args.quiet)  # fmt: skip
    elif args.distill_from:
        raise UsageError("--distill-from needs --finetune-steps")
    save_model(model, out, task=task.describe())
    final = out / "model.onnx"
    to_onnx(model, final, task=task.describe())
    if args.int8:
        quantize_onnx(final, out / "model.int8.onnx", "dynamic-int8")
        final = out / "model.int8.onnx"
    after = _measure_row("after" + (" (int8)" if args.int8 else ""), model, final, task, args.target, args.threads)
    print(f"{'':16s} {'parameters':>11s} {'file MB':>8s} {'latency ms':>11s} {'accuracy':>9s}   ({args.target}, "
          f"{task.max_len} tokens, {args.threads} threads)")  # fmt: skip
    for label, params, size, lat, acc in (before, after):
        print(f"{label:16s} {params:11,d} {size / 1e6:8.3f} {lat:11.2f} {acc:9.4f}")
    print(f"{'ratio':16s} {before[1] / after[1]:10.2f}x {before[2] / after[2]:7.2f}x {before[3] / after[3]:10.2f}x "
          f"{after[4] - before[4]:+9.4f}")  # fmt: skip
    print(f"saved {out} (model.safetensors, model.onnx{', model.int8.onnx' if args.int8 else ''})")
    return 0


def cmd_adapt(args: argparse.Namespace) -> int:
    import torch

    from xsearch.compress import add_adapters, save_adapters
    from xsearch.serialization import load_model
    from xsearch.training import evaluate, train

    model = load_model(args.model)
    task = build_task(args.task, task_options(args))
    if task.max_len > model.config.max_len:
        raise UsageError(f"task max_len={task.max_len} exceeds the model's max_len={model.config.max_len}")
    if task.encoding.vocab_size > model.config.vocab_size:
        raise UsageError(f"task vocabulary ({task.encoding.vocab_size}) is larger than the model's "
                         f"({model.config.vocab_size})")  # fmt: skip
    torch.manual_seed(args.seed)
    targets = tuple(t.strip() for t in args.targets.split(","))
    add_adapters(model, kind=args.kind, size=args.size, targets=targets,
                 n_classes=task.n_classes if task.kind == "classify" else None)  # fmt: skip
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    train(
        model, task, steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed, progress=not args.quiet
    )
    metric = evaluate(model, task, "test")
    out = save_adapters(model, args.out, task=task.describe())
    print(f"saved adapters to {out} ({n_train:,} trainable parameters); test "
          f"{'bits_per_byte' if task.kind == 'lm' else 'accuracy'} {metric:.4f}")  # fmt: skip
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from xsearch.pipeline import DEFAULT_YAML, load_pipeline_config, run_pipeline
    from xsearch.pipeline.summary import print_summary

    if args.print_config:
        print(DEFAULT_YAML, end="")
        return 0
    cfg = load_pipeline_config(args.config, parse_assignments(args.set, "--set"), name=args.name)
    if args.runs_dir is not None:
        cfg.runs_dir = args.runs_dir
    logging.getLogger("xsearch.export").setLevel(logging.WARNING)  # the export stage prints its own parity line
    print(f"xsearch run: {cfg.run_dir}  (task {cfg.task.name}, space {cfg.search.space}, target {cfg.target}, "
          f"{cfg.search.trials} trials)")  # fmt: skip
    try:
        summary = run_pipeline(cfg, fresh=args.fresh, redo_from=args.redo_from, progress=not args.quiet, echo=print)
    except KeyboardInterrupt:
        print(f"xsearch: interrupted; run the same command again to continue {cfg.run_dir}", file=sys.stderr)
        return 130
    print_summary(summary)
    return 0


# -- parser ------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="xsearch", description="Search, compress and ship efficient Transformers.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    s = sub.add_parser("list", help="the attention variants")
    s.add_argument("--causal", action="store_true", help="only decoder-capable variants")
    s.add_argument("--markdown", action="store_true", help="a Markdown table (for the README)")
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("train", help="train a model on a task and save it")
    add_task_args(s, required=True)
    m = s.add_argument_group("model")
    m.add_argument("--config", help="a ModelConfig JSON (e.g. from `xsearch pick`); flags override it")
    m.add_argument("--attention", help="attention variant (see `xsearch list`)")
    m.add_argument("--set", action="append", metavar="KEY=VALUE", help="attention parameter")
    m.add_argument("--d-model", type=int)
    m.add_argument("--layers", type=int)
    m.add_argument("--heads", type=int)
    m.add_argument("--head-dim", type=int)
    m.add_argument("--d-ff", type=int)
    m.add_argument("--weight-sharing", choices=["none", "all", "attention", "ffn"])
    m.add_argument("--dropout", type=float)
    m.add_argument("--pos-encoding", choices=["sinusoidal", "learned"])
    t = s.add_argument_group("training")
    t.add_argument("--steps", type=int)
    t.add_argument("--seconds", type=float)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--out", required=True, help="output folder (config.json + model.safetensors)")
    s.set_defaults(func=cmd_train)

    s = sub.add_parser("eval", help="evaluate a saved model")
    s.add_argument("model", help="a saved model folder")
    add_task_args(s, required=False)
    s.add_argument("--split", default="test", choices=["train", "valid", "test"])
    s.add_argument("--batch-size", type=int, default=64)
    s.add_argument("--threads", type=int)
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=cmd_eval)

    s = sub.add_parser("export", help="export a saved model to ONNX (checked against onnxruntime)")
    s.add_argument("model", help="a saved model folder")
    s.add_argument("--out", required=True, help="the .onnx file to write")
    q = s.add_mutually_exclusive_group()
    q.add_argument("--int8", action="store_true", help="dynamic int8 (the fastest on CPU)")
    q.add_argument("--quantize", choices=["dynamic-int8", "static-int8", "fp16"])
    q.add_argument("--fp16", action="store_true", help="float16 (for GPUs)")
    s.add_argument("--no-check", action="store_true", help="skip the onnxruntime parity check")
    s.add_argument("--opset", type=int)
    s.add_argument("--portable", action="store_true", help="standard ONNX operators only (no onnxruntime contrib ops)")
    s.set_defaults(func=cmd_export)

    s = sub.add_parser("bench", help="latency of an ONNX model (and of its torch model with --vs)")
    s.add_argument("onnx")
    s.add_argument("--vs", help="a saved model folder to compare against (torch)")
    s.add_argument("--seq-len", type=int, required=True)
    s.add_argument("--batch", type=int, default=1)
    s.add_argument("--threads", type=int)
    s.add_argument("--target", default="ort-cpu", choices=["ort-cpu", "ort-cuda"])
    s.add_argument("--repeats", type=int, default=20)
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("predict", help="JSONL predictions of an ONNX model (onnxruntime only)")
    s.add_argument("onnx")
    s.add_argument("--input", required=True, help='JSONL file (a string, id list or {"text": ...} per line), or -')
    s.add_argument("--truncate", action="store_true", help="cut inputs longer than max_len instead of failing")
    s.add_argument("--top-k", type=int, default=3)
    s.add_argument("--threads", type=int)
    s.set_defaults(func=cmd_predict)

    s = sub.add_parser("serve", help="HTTP predictions: POST /predict, GET /health")
    s.add_argument("onnx")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--threads", type=int)
    s.add_argument("--max-batch", type=int, default=64)
    s.add_argument("--max-body", type=int, default=1 << 20, help="request size limit in bytes")
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("spaces", help="the shipped search spaces")
    s.add_argument("--show", metavar="NAME", help="print one space as YAML (a starting point for your own)")
    s.set_defaults(func=cmd_spaces)

    s = sub.add_parser("search", help="hardware-aware architecture search (Optuna; one or many workers)")
    add_task_args(s, required=True)
    s.add_argument("--space", default="default", help="a shipped space (xsearch spaces) or a .yaml path")
    s.add_argument("--target", default="ort-cpu", choices=["ort-cpu", "torch-cpu", "torch-cuda", "ort-cuda"])
    s.add_argument("--trials", type=int, default=20, help="COMPLETE trials the study ends with (all workers together)")
    s.add_argument("--timeout", type=float, help="stop starting trials after this many seconds")
    s.add_argument("--storage", default="sqlite:///runs/xsearch.db",
                   help="sqlite:///FILE, postgresql+psycopg://USER:PASSWORD@HOST/DB, or journal:FILE")  # fmt: skip
    s.add_argument("--study", default="xsearch", help="study name (re-running resumes it; workers share it)")
    s.add_argument(
        "--objective",
        default="both",
        choices=["both", "accuracy"],
        help="both: accuracy and latency (Pareto front); accuracy: under --max-latency-ms, with pruning",
    )
    s.add_argument(
        "--pruner",
        choices=["hyperband", "median", "none"],
        help="stops weak trials early (--objective accuracy; default hyperband)",
    )
    s.add_argument("--heartbeat-interval", type=int, default=10, help="seconds between a running trial's heartbeats")
    s.add_argument(
        "--grace-period",
        type=int,
        help="seconds without a heartbeat before a trial is failed and retried (default 3 intervals)",
    )
    s.add_argument("--seq-len", type=int, help="length at which latency is measured (default: task max_len)")
    s.add_argument("--batch", type=int, default=1, help="batch size at which latency is measured")
    s.add_argument("--threads", type=int, default=2, help="threads for latency measurement")
    s.add_argument(
        "--max-latency-ms",
        type=float,
        help="latency budget (a constraint; with --objective accuracy, over-budget trials are pruned)",
    )
    s.add_argument("--max-params", type=int, help="parameter budget (like --max-latency-ms)")
    s.add_argument("--latency-predictor", help="a predictor JSON (xsearch latency fit): candidates predicted "
                   "over --max-latency-ms are pruned before training")  # fmt: skip
    g = s.add_mutually_exclusive_group()
    g.add_argument("--train-steps", type=int, help="training steps per trial")
    g.add_argument("--train-seconds", type=float, help="training seconds per trial (default 30)")
    s.add_argument("--batch-size", type=int, default=32)
    s.add_argument("--lr", type=float, default=1e-3)
    s.add_argument("--sampler", default="tpe", choices=["tpe", "nsga2", "random"])
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_search)

    from xsearch.cli_latency import add_latency_parser

    add_latency_parser(sub)

    s = sub.add_parser("report", help="Pareto plots, trials.csv and front.json of a study")
    s.add_argument("--storage", default="sqlite:///runs/xsearch.db")
    s.add_argument("--study", default="xsearch")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("pick", help="the most accurate feasible trial under a latency budget, as config.json")
    s.add_argument("--storage", default="sqlite:///runs/xsearch.db")
    s.add_argument("--study", default="xsearch")
    s.add_argument("--max-latency-ms", type=float)
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_pick)

    s = sub.add_parser("compress", help="prune, fine-tune (optionally distil), quantize; before/after table")
    s.add_argument("model", help="a saved model folder")
    add_task_args(s, required=False)
    s.add_argument("--prune-heads", type=float, default=0.0, help="fraction of heads to remove")
    s.add_argument("--prune-ffn", type=float, default=0.0, help="fraction of FFN channels to remove")
    s.add_argument("--importance", default="magnitude", choices=["magnitude", "taylor"])
    s.add_argument("--distill-from", help="a saved teacher model folder")
    s.add_argument("--temperature", type=float, default=2.0)
    s.add_argument("--alpha", type=float, default=0.5)
    s.add_argument("--finetune-steps", type=int, default=0)
    s.add_argument("--batch-size", type=int, default=32)
    s.add_argument("--lr", type=float, default=1e-3)
    s.add_argument("--int8", action="store_true", help="dynamic int8 ONNX of the result")
    s.add_argument("--target", default="ort-cpu", choices=["ort-cpu", "ort-cuda"])
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--quiet", action="store_true")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_compress)

    s = sub.add_parser("run", help="the whole pipeline: search, pick, train, compress, export, verify (restartable)")
    s.add_argument("--config", help="a pipeline.yaml (default: the embedded default; see --print-config)")
    s.add_argument("--print-config", action="store_true", help="print the default pipeline.yaml and exit")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key, e.g. search.trials=20")
    s.add_argument("--name", help="run name (the folder under runs_dir); overrides the config's")
    s.add_argument("--runs-dir", help="where run folders live (default: the config's runs_dir)")
    s.add_argument("--fresh", action="store_true", help="delete the run folder and start over")
    s.add_argument("--redo-from", metavar="STAGE", help="redo this stage and the later ones (search: adds trials)")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("adapt", help="fit task adapters (bottleneck or LoRA) to a saved model")
    s.add_argument("model", help="a saved base model folder")
    add_task_args(s, required=True)
    s.add_argument("--kind", default="lora", choices=["lora", "bottleneck"])
    s.add_argument("--size", type=int, default=8, help="LoRA rank or bottleneck width")
    s.add_argument("--targets", default="q_proj,v_proj", help="LoRA target projections")
    s.add_argument("--steps", type=int, default=300)
    s.add_argument("--batch-size", type=int, default=32)
    s.add_argument("--lr", type=float, default=1e-3)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--quiet", action="store_true")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_adapt)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        _setup_logging(args.verbose)
        return args.func(args)
    except UsageError as e:
        print(f"xsearch: error: {e}".replace("xsearch: error: xsearch", "xsearch"), file=sys.stderr)
    except (ValueError, FileNotFoundError, NotADirectoryError, PermissionError) as e:
        print(f"xsearch: error: {e}", file=sys.stderr)
    except RuntimeError as e:  # a missing CUDA device, a diverged training run, a failed export
        print(f"xsearch: error: {e}", file=sys.stderr)
        return 1 if type(e).__name__ == "TrainingDiverged" else EXIT_USAGE
    except KeyboardInterrupt:
        print("xsearch: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # e.g. a port in use
        print(f"xsearch: error: {e}", file=sys.stderr)
    return EXIT_USAGE


def _setup_logging(verbose: bool) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    # Root at WARNING (libraries such as onnxruntime's quantizer log chatter at INFO on the root
    # logger); xsearch's own progress at INFO.
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=Console(stderr=True), show_path=False, show_time=False)],
    )
    logging.getLogger("xsearch").setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("torch", "onnxscript", "onnx_ir"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


if __name__ == "__main__":
    sys.exit(main())
