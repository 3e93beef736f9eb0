"""The stages of ``xsearch run``, each a function ``(ctx, workdir) -> dict`` built from the library's verbs.

[supernet ->] search -> report -> pick -> [pretrain ->] train -> reference -> compress -> export -> quantize
-> verify -> summary.
In ``search.mode: supernet`` a supernet is trained first and the search scores its trials with the supernet's
weights; the train stage then fine-tunes the pick from its inherited weights (the reference still starts
from new weights, with the same budget). With ``pretrain.enabled`` the picked model and the reference are each
self-pretrained with the same budget, and the train and reference stages fine-tune them with a new head.
A stage reads what earlier stages left in their folders (``ctx.folder(name)``) and writes only into
its own work folder; the runner renames that folder into place once the stage has finished.
"""

from __future__ import annotations

import logging
from functools import cached_property
from pathlib import Path
from typing import Any

from xsearch.errors import XSearchError
from xsearch.pipeline.config import PipelineConfig
from xsearch.pipeline.runner import RunFolder, Stage

log = logging.getLogger("xsearch.pipeline")
STUDY_NAME = "search"
STUDY_FILE = "study.db"


class RunContext:
    """What every stage can reach: the configuration, the run folder, the task (built once)."""

    def __init__(self, cfg: PipelineConfig, run: RunFolder, *, progress: bool = True, echo=print) -> None:
        self.cfg = cfg
        self.run = run
        self.progress = progress
        self.echo = echo

    @cached_property
    def task(self):
        from xsearch.tasks import get_task

        return get_task(self.cfg.task.name, **self.cfg.task.options)

    @property
    def seq_len(self) -> int:
        return self.cfg.search.seq_len or self.task.max_len

    @property
    def latency_mode(self) -> str:
        """What the search timed, and so what the files are exported for and timed at: ``forward``, or a
        decoder's ``prefill`` or ``decode``."""
        return self.cfg.search.latency_mode

    @property
    def context(self) -> int | None:
        """The state's length of a timed decode step (as the search's: ``seq_len - 1`` unless given)."""
        if self.latency_mode != "decode":
            return None
        return self.cfg.search.context or max(1, self.seq_len - 1)

    def folder(self, name: str) -> Path:
        return self.run.folder(name)

    def result(self, name: str) -> dict[str, Any]:
        return self.run.result(name)

    def study(self):
        from xsearch.storage import load_study

        return load_study(study_url(self.folder("search") / STUDY_FILE), STUDY_NAME)

    def load_model(self, stage: str):
        from xsearch.serialization import load_model

        return load_model(self.folder(stage) / "model")

    def save_model(self, model, workdir: Path) -> None:
        from xsearch.serialization import save_model

        save_model(model, workdir / "model", task=self.task.describe())


def study_url(path: Path) -> str:
    return f"sqlite:///{path.resolve()}"


# -- 0 supernet, 1 search ----------------------------------------------------------------------
SUPERNET_DIR = "supernet"


def supernet_mode(ctx: RunContext) -> bool:
    return ctx.cfg.search.mode == "supernet"


def run_supernet_stage(ctx: RunContext, work: Path) -> dict[str, Any]:
    """Train the supernet the search scores its trials with (supernet mode); resumes from its last checkpoint."""
    from xsearch.search_spaces import load_space_for_task
    from xsearch.supernet import build_supernet
    from xsearch.supernet.train import train_supernet

    space = load_space_for_task(ctx.cfg.search.space, ctx.task)
    sn = build_supernet(space, ctx.task.model_fields(), seed=ctx.cfg.supernet.seed, **ctx.cfg.supernet.layout)
    ctx.echo(f"  supernet over {space.name}: {sn.n_parameters():,} parameters")
    record = train_supernet(sn, ctx.task, ctx.cfg.supernet, out=work / SUPERNET_DIR, progress=ctx.progress)
    chance = ctx.task.chance("valid")
    ctx.echo(f"  {record['steps']} steps ({record['seconds']:.0f} s); the reference subnet's inherited validation "
             f"{_metric_name(ctx)} {record['reference_valid']:.4f} (chance {chance:.4f})")  # fmt: skip
    return {"supernet": SUPERNET_DIR, "steps": record["steps"], "train_seconds": record["seconds"],
            "final_loss": record["final_loss"], "reference_valid": record["reference_valid"],
            "chance": chance}  # fmt: skip


def run_search_stage(ctx: RunContext, work: Path) -> dict[str, Any]:
    """The hardware-aware search; resumes its own study after an interruption."""
    import dataclasses

    import optuna

    from xsearch.search.run import run_search
    from xsearch.search.study import pareto_front, reference_trial, state_counts

    supernet = str(ctx.folder("supernet") / SUPERNET_DIR) if supernet_mode(ctx) else None
    settings = dataclasses.replace(ctx.cfg.search, storage=study_url(work / STUDY_FILE), supernet=supernet)
    used = 0
    if (work / STUDY_FILE).exists():
        from xsearch.search_spaces import load_space_for_task

        space = load_space_for_task(settings.space, ctx.task)
        used = _close_interrupted_trials(settings.storage, space.reference_params())
    remaining = settings.trials - used
    if remaining > 0:
        if used:
            ctx.echo(f"  {used} of {settings.trials} trials completed before the interruption; {remaining} to go")
        study = run_search(settings, progress=ctx.progress)
    else:
        study = optuna.load_study(study_name=STUDY_NAME, storage=settings.storage)
    states = state_counts(study)
    ref = reference_trial(study)
    if ref is None:
        raise RuntimeError(f"the reference Transformer's trial did not complete (trials: {states}); see {work}")
    duplicates = sum(t.user_attrs.get("duplicate_of") is not None for t in study.get_trials(deepcopy=False))
    return {"study": STUDY_NAME, "storage": STUDY_FILE, "trials": states, "reference_trial": ref.number,
            "front": [t.number for t in pareto_front(study)], "chance": study.user_attrs.get("chance"),
            "duplicates": duplicates}  # fmt: skip


def _close_interrupted_trials(url: str, reference_params: dict[str, Any]) -> int:
    """Mark trials left RUNNING by a killed run as FAIL ("interrupted") and queue their parameters again;
    return how many trials have completed."""
    import optuna
    from optuna.trial import TrialState

    storage = optuna.storages.RDBStorage(url)
    try:
        study_id = storage.get_study_id_from_name(STUDY_NAME)
    except KeyError:
        return 0
    used = 0
    retry = []
    for t in storage.get_all_trials(study_id, deepcopy=False):
        if t.state == TrialState.RUNNING:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
            storage.set_trial_user_attr(trial_id, "interrupted", True)
            storage.set_trial_user_attr(trial_id, "error", "interrupted: the run stopped during this trial")
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
            retry.append(t)
        elif t.state == TrialState.COMPLETE:
            used += 1
    if retry:  # the same candidates again (the reference above all: the run is read against it)
        study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
        for t in retry:
            if t.number == 0 or t.user_attrs.get("reference"):
                study.enqueue_trial(reference_params, user_attrs={"reference": True, "retry_of": t.number})
            elif t.params:  # (a trial cut off before it drew its candidate has nothing to retry)
                study.enqueue_trial(t.params, user_attrs={"retry_of": t.number}, skip_if_exists=False)
    storage.remove_session()
    return used


# -- 2 report, 3 pick ------------------------------------------------------------------------
def run_report_stage(ctx: RunContext, work: Path) -> dict[str, Any]:
    from xsearch.search.report import write_report

    doc = write_report(ctx.study(), work)
    return {"files": ["pareto.html", "pareto.png", "trials.csv", "front.json"], "front_size": len(doc["front"])}


def run_pick_stage(ctx: RunContext, work: Path) -> dict[str, Any]:
    """The best feasible trial (by what the search ranks by) within the latency budget (absolute and/or relative to
    the reference)."""
    from xsearch.search.report import pick, pick_budget
    from xsearch.search.study import (
        describe_trial,
        reference_trial,
        shown_beside,
        trial_latency_ms,
        trial_metric,
        trial_task_metric,
    )

    study = ctx.study()
    ref = reference_trial(study)
    ref_ms = trial_latency_ms(ref)
    budget = pick_budget(study, ctx.cfg.pick)
    try:
        chosen = pick(study, ctx.cfg.pick)
    except XSearchError as e:
        raise XSearchError(
            f"{e} (reference {ref_ms:.2f} ms): relax pick.max_latency_ms / pick.min_speedup and re-run, or raise "
            "search.trials and re-run with --redo-from search"
        ) from None
    metric, latency = trial_metric(chosen), trial_latency_ms(chosen)
    ranked, task_metric = study.user_attrs.get("metric", "metric"), trial_task_metric(chosen)
    beside = shown_beside(ranked)
    also = f", {beside} {task_metric:.4f}" if beside and task_metric is not None else ""
    ctx.echo(f"  picked trial {chosen.number}: {describe_trial(chosen)} ({ranked} {metric:.4f}{also}, "
             f"{latency:.2f} ms; reference {ref_ms:.2f} ms)")  # fmt: skip
    return {
        "trial": chosen.number, "model_config": chosen.user_attrs["model_config"], "search_metric": metric,
        "search_metric_name": ranked, "search_task_metric": task_metric,
        "search_latency_ms": latency, "budget_ms": budget, "reference_trial": ref.number,
        "reference_config": ref.user_attrs["model_config"], "reference_metric": trial_metric(ref),
        "reference_latency_ms": ref_ms,
    }  # fmt: skip


# -- pretrain, train, reference ------------------------------------------------------------------
PRETRAINED = {"picked": "model_config", "reference": "reference_config"}


def pretrain_enabled(ctx: RunContext) -> bool:
    return ctx.cfg.pretrain.enabled


def _supernet_weights(ctx: RunContext, config: dict[str, Any]):
    """The picked subnet with its weights in the supernet (supernet mode), else None."""
    if not supernet_mode(ctx):
        return None
    from xsearch.supernet import extract_subnet, load_supernet

    return extract_subnet(load_supernet(ctx.folder("supernet") / SUPERNET_DIR), config)


def run_pretrain_stage(ctx: RunContext, work: Path) -> dict[str, Any]:
    """Self-pretrain the picked model and the reference, each with the pretrain: budget (the picked one from
    its supernet weights in supernet mode); each resumes from its last checkpoint."""
    import torch

    from xsearch.config import describe_config
    from xsearch.model import build_model
    from xsearch.training.pretrain import pretrain

    settings = ctx.cfg.pretrain
    pick = ctx.result("pick")
    out: dict[str, Any] = {}
    for name, key in PRETRAINED.items():
        config = pick[key]
        torch.manual_seed(settings.seed)
        model = _supernet_weights(ctx, config) if name == "picked" else None
        if model is None:
            model = build_model(config)
        record = pretrain(model, ctx.task, settings, out=work / name, progress=ctx.progress)
        first, last = record["history"][0], record["history"][-1]
        ctx.echo(
            f"  {name} ({describe_config(config)}): {record['steps']} steps ({record['seconds']:.0f} s), "
            f"{record['objective']} loss {first['valid_loss']:.4f} -> {last['valid_loss']:.4f} on validation"
        )
        out[name] = {"folder": name, "steps": record["steps"], "seconds": record["seconds"],
                     "valid_loss_before": first["valid_loss"], "valid_loss_after": last["valid_loss"]}  # fmt: skip
    return out


def _pretrained(ctx: RunContext, name: str):
    """The model the pretrain stage left for ``name`` (``picked`` or ``reference``), with a new head."""
    from xsearch.training.pretrain import init_from_pretrained

    return init_from_pretrained(ctx.folder("pretrain") / name, ctx.task, seed=ctx.cfg.train.seed)


def _train_fully(ctx: RunContext, work: Path, config: dict[str, Any], init=None, how: str = "new") -> dict[str, Any]:
    from xsearch.config import describe_config
    from xsearch.training.recipe import train_model

    t = ctx.cfg.train
    if how != "new":
        ctx.echo(f"  fine-tuned from its {'weights in the supernet' if how == 'supernet' else 'pretraining'}")
    trained = train_model(config, ctx.task, t, progress=ctx.progress, init=init)
    ctx.echo(f"  {describe_config(config)}: {trained.parameters:,} parameters")
    ctx.save_model(trained.model, work)
    r = trained.result
    kept = f" (weights of step {r.best_step}, the lowest validation loss)" if t.keep_best else ""
    budget = f"{r.steps} steps" + (f" in {r.seconds:.0f} s" if t.seconds is not None else f" ({r.seconds:.0f} s)")
    ctx.echo(f"  {budget}{kept}; test {_metric_name(ctx)} {trained.test_metric:.4f} (chance {trained.chance:.4f})")
    return {"model": "model", "test_metric": trained.test_metric, "chance": trained.chance, "steps": r.steps,
            "train_seconds": round(r.seconds, 2), "best_step": r.best_step, "parameters": trained.parameters,
            "description": describe_config(config), "init": how,
            "history": [{"step": h["step"], "valid": h["valid"]} for h in r.history]}  # fmt: skip


def run_train_stage(ctx: RunContext, work: Path) -> dict[str, Any]:
    config = ctx.result("pick")["model_config"]
    if pretrain_enabled(ctx):
        return _train_fully(ctx, work, config, init=_pretrained(ctx, "picked"), how="pretrained")
    init = _supernet_weights(ctx, config)
    return _train_fully(ctx, work, config, init=init, how="supernet" if init is not None else "new")


def run_reference_stage(ctx: RunContext, work: Path) -> dict[str, Any]:
    config = ctx.result("pick")["reference_config"]
    if pretrain_enabled(ctx):
        return _train_fully(ctx, work, config, init=_pretrained(ctx, "reference"), how="pretrained")
    return _train_fully(ctx, work, config)


def _metric_name(ctx: RunContext) -> str:
    from xsearch.search.study import metric_name

    return metric_name(ctx.task.kind)


# -- 6 compress -------------------------------------------------------------------------------
def run_compress_stage(ctx: RunContext, work: Path) -> dict[str, Any]:
    """Prune heads and FFN channels of the trained model, then fine-tune it, distilling from the teacher."""
    from xsearch.compress.recipe import compress_model
    from xsearch.config import describe_config
    from xsearch.training.loop import evaluate

    c = ctx.cfg.compress
    model = ctx.load_model("train")
    teacher = None if c.teacher == "none" else ctx.load_model("reference" if c.teacher == "reference" else "train")
    _, done = compress_model(model, ctx.task, c, teacher=teacher, progress=ctx.progress)
    ctx.echo(f"  pruned heads {c.prune_heads:.0%}, FFN {c.prune_ffn:.0%}: {done.parameters_before:,} -> "
             f"{done.parameters:,} parameters")  # fmt: skip
    metric = evaluate(model, ctx.task, "test")
    ctx.save_model(model, work)
    ctx.echo(f"  fine-tuned {c.finetune_steps} steps (teacher: {c.teacher}); test {_metric_name(ctx)} {metric:.4f}")
    return {"model": "model", "parameters_before": done.parameters_before, "parameters": done.parameters,
            "test_metric": metric, "description": describe_config(model.config.to_dict())}  # fmt: skip


# -- 7 export, 8 quantize ----------------------------------------------------------------------
EXPORTS = {"model.onnx": "compress", "searched.onnx": "train", "reference.onnx": "reference"}


def run_export_stage(ctx: RunContext, work: Path) -> dict[str, Any]:
    """ONNX files of the compressed model and, for the comparison, of the searched and reference models."""
    from xsearch.export import to_onnx

    out = {}
    e = ctx.cfg.export
    for filename, stage in EXPORTS.items():
        report = to_onnx(ctx.load_model(stage), work / filename, task=ctx.task.describe(), opset=e.opset,
                         portable=e.portable, decoder=ctx.latency_mode != "forward")  # fmt: skip
        out[filename] = {"from": stage, "max_abs_diff": report.max_abs_diff, "size_bytes": report.size_bytes}
        ctx.echo(f"  {filename}: {report.size_bytes / 1e6:.2f} MB, parity max |diff| {report.max_abs_diff:.1e}")
    return {"files": out}


def run_quantize_stage(ctx: RunContext, work: Path) -> dict[str, Any]:
    import shutil

    from xsearch.export import quantize_onnx
    from xsearch.export.quantize import calibration_batches

    mode = ctx.cfg.export.quantize
    src = ctx.folder("export") / "model.onnx"
    if ctx.cfg.export.mode is None:
        shutil.copyfile(src, work / "model.onnx")
        return {"mode": mode, "file": "model.onnx"}
    name = {"dynamic-int8": "model.int8.onnx", "static-int8": "model.int8.onnx", "fp16": "model.fp16.onnx"}[mode]
    calibration = calibration_batches(ctx.task) if mode == "static-int8" else None
    quantize_onnx(src, work / name, mode, calibration=calibration)
    ctx.echo(f"  {mode}: {(work / name).stat().st_size / 1e6:.2f} MB")
    return {"mode": mode, "file": name}


# -- 9 verify, 10 summary ----------------------------------------------------------------------
def deploy_target(target: str) -> str:
    """The onnxruntime target an ONNX file is timed on for a search target (the same device)."""
    from xsearch.latency.target import get_target

    return get_target(target).deployment().name


def shipped_path(ctx: RunContext) -> Path:
    return ctx.folder("quantize") / ctx.result("quantize")["file"]


def run_verify_stage(ctx: RunContext, work: Path) -> dict[str, Any]:
    """Test-split metric of each ONNX file through onnxruntime, and their latencies measured interleaved."""
    from xsearch.latency.timing import measure_interleaved
    from xsearch.training.loop import evaluate_onnx

    files = {
        "reference": ctx.folder("export") / "reference.onnx",
        "searched": ctx.folder("export") / "searched.onnx",
        "shipped": shipped_path(ctx),
    }
    target = deploy_target(ctx.cfg.target)
    stats = measure_interleaved(files, target, batch=ctx.cfg.batch, seq_len=ctx.seq_len, threads=ctx.cfg.threads,
                                repeats=ctx.cfg.verify.latency_repeats, mode=ctx.latency_mode,
                                context=ctx.context)  # fmt: skip
    rows = {}
    chance = ctx.task.chance("test")
    ctx.echo(f"  chance level ({'unigram model' if ctx.task.kind == 'lm' else 'majority class'}, test split): "
             f"{_metric_name(ctx)} {chance:.4f}")  # fmt: skip
    for name, path in files.items():
        metric = evaluate_onnx(path, ctx.task, "test", threads=ctx.cfg.threads)
        rows[name] = {"file": str(path.relative_to(ctx.run.root)), "test_metric": metric,
                      "latency": stats[name].to_dict(), "size_bytes": path.stat().st_size}  # fmt: skip
        ctx.echo(f"  {name:9s} {_metric_name(ctx)} {metric:.4f}  {stats[name].median_ms:8.2f} ms  "
                 f"{path.stat().st_size / 1e6:6.2f} MB  ({path.name})")  # fmt: skip
    return {"target": target, "seq_len": ctx.seq_len, "batch": ctx.cfg.batch, "threads": ctx.cfg.threads,
            "latency_mode": ctx.latency_mode, "context": ctx.context, "chance": chance,
            "test_size": ctx.task.size("test"), "models": rows}  # fmt: skip


def run_summary_stage(ctx: RunContext, work: Path) -> dict[str, Any]:
    from xsearch.pipeline.summary import build_summary, write_summary

    summary = build_summary(ctx)
    write_summary(summary, ctx.run.root)
    return {"files": ["../summary.md", "../summary.json"]}


STAGES = [
    Stage("supernet", run_supernet_stage, "train the supernet (search.mode supernet)", resumes=True,
          depends=("task", "search.space", "search.mode", "supernet")),
    Stage("search", run_search_stage, "hardware-aware search", resumes=True,
          depends=("task", "target", "threads", "batch", "search", "supernet")),
    Stage("report", run_report_stage, "report: Pareto front, plots"),
    Stage("pick", run_pick_stage, "pick under the latency budget", depends=("pick",)),
    Stage("pretrain", run_pretrain_stage, "self-pretrain the picked model and the reference (pretrain.enabled)",
          resumes=True, depends=("pretrain",)),
    Stage("train", run_train_stage, "train the picked model fully", depends=("train", "pretrain")),
    Stage("reference", run_reference_stage, "train the reference Transformer fully", depends=("train", "pretrain")),
    Stage("compress", run_compress_stage, "prune and fine-tune with distillation", depends=("compress",)),
    Stage("export", run_export_stage, "export to ONNX (parity-checked)", depends=("export.portable", "export.opset")),
    Stage("quantize", run_quantize_stage, "quantize", depends=("export.quantize",)),
    Stage("verify", run_verify_stage, "verify on onnxruntime: test metric and latency", depends=("verify",)),
    Stage("summary", run_summary_stage, "summary"),
]  # fmt: skip


def stages_for(cfg: PipelineConfig) -> list[Stage]:
    """The stages of a run: the supernet stage only in ``search.mode: supernet`` and the pretrain stage only with
    ``pretrain.enabled`` (a run without them keeps its numbering, 01-search ... 10-summary, and does not depend on
    their sections)."""
    import dataclasses

    left_out = {name for name, used in (("supernet", cfg.search.mode == "supernet"),
                                        ("pretrain", cfg.pretrain.enabled)) if not used}  # fmt: skip
    return [dataclasses.replace(s, depends=tuple(d for d in s.depends if d not in left_out))
            for s in STAGES if s.name not in left_out]  # fmt: skip
