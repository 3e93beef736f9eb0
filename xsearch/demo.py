"""`make demo`: the main job on the embedded default, end to end on a CPU.

A short hardware-aware search on generated ListOps (the ``tiny`` space, latency measured with
onnxruntime on this machine), the Pareto front against the reference Transformer, the most
accurate model picked and trained longer, compressed (FFN channels pruned, fine-tuned with
distillation from the unpruned model), exported to ONNX (checked against onnxruntime),
quantized to int8, and used through the onnxruntime-only Predictor.
"""

from __future__ import annotations

import copy
import logging
import shutil
import sys
from pathlib import Path

RUN = Path("runs/demo")


def main(argv: list[str] | None = None) -> int:
    import torch
    from rich.console import Console

    import xsearch
    from xsearch.cli import _print_front
    from xsearch.compress import distill, prune
    from xsearch.export import Predictor, quantize_onnx, to_onnx
    from xsearch.latency import measure
    from xsearch.report import pick, write_report
    from xsearch.search import SearchSettings, describe_trial, run_search
    from xsearch.tasks import get_task

    argv = sys.argv[1:] if argv is None else argv
    scale = float(argv[0]) if argv else 1.0  # shrink or stretch every budget (tests use a small scale)
    logging.basicConfig(level=logging.WARNING)
    console = Console()
    torch.set_num_threads(2)
    if RUN.exists():
        shutil.rmtree(RUN)
    RUN.mkdir(parents=True)
    task_options = {"n_train": 2000, "n_valid": 200, "n_test": 500}
    console.print("[bold]xsearch demo[/]: ListOps (lengths 64-256), space 'tiny', target ort-cpu (2 threads)")
    settings = SearchSettings(
        task="listops", task_options=task_options, space="tiny", target="ort-cpu", trials=max(2, round(8 * scale)),
        storage=f"sqlite:///{RUN}/search.db", study="demo", train_seconds=max(1.0, 8.0 * scale), lr=2e-3,
        latency_repeats=10, latency_cache=None,
    )  # fmt: skip
    study = run_search(settings, progress=True)
    _print_front(study)
    write_report(study, RUN / "report")
    console.print(f"report: {RUN}/report/pareto.html, pareto.png, trials.csv, front.json")

    best = pick(study)
    console.print(f"picked trial {best.number}: {describe_trial(best)}")
    task = get_task("listops", **task_options)
    torch.manual_seed(0)
    model = xsearch.build_model(best.user_attrs["model_config"])
    xsearch.train(model, task, seconds=max(2.0, 40.0 * scale), batch_size=32, lr=2e-3, progress=True)
    acc = xsearch.evaluate(model, task, "test")
    xsearch.save_model(model, RUN / "model", task=task.describe())
    console.print(f"trained: test accuracy {acc:.3f}, saved to {RUN}/model")

    teacher = copy.deepcopy(model)
    params_before = xsearch.count_parameters(model)
    prune(model, heads=0.0, ffn=0.5)
    distill(model, teacher, task, steps=max(5, round(300 * scale)), batch_size=32, lr=1e-3, progress=True)
    acc_small = xsearch.evaluate(model, task, "test")
    xsearch.save_model(model, RUN / "model-small", task=task.describe())
    console.print(
        f"compressed: FFN pruned by half and distilled: {params_before:,} -> {xsearch.count_parameters(model):,} "
        f"parameters, test accuracy {acc:.3f} -> {acc_small:.3f}, saved to {RUN}/model-small"
    )

    fp32, int8 = RUN / "model.onnx", RUN / "model.int8.onnx"
    report = to_onnx(model, fp32, task=task.describe())
    quantize_onnx(fp32, int8, "dynamic-int8")
    console.print(f"exported {fp32} (parity max |diff| {report.max_abs_diff:.1e}) and {int8}")
    for path in (fp32, int8):
        lat = measure(path, "ort-cpu", seq_len=task.max_len, threads=2, repeats=20)
        console.print(f"  {path.name}: {lat.median_ms:.2f} ms median at 256 tokens, {path.stat().st_size / 1e3:.0f} kB")
    predictor = Predictor(int8, threads=2)
    seqs, labels = task.data["test"]
    correct = sum(int(p.label) == y for p, y in zip(predictor.predict([task.encoding.decode(s) for s in seqs]), labels))
    console.print(f"int8 model through the Predictor: test accuracy {correct / len(labels):.3f}")
    for s, label in list(zip(seqs, labels))[:3]:
        text = task.encoding.decode(s)
        pred = predictor.predict([text])[0]
        console.print(f"  {text[:56] + '...':60s} true {label}  predicted {pred.label} ({pred.score:.2f})")
    console.print(f"try: .venv/bin/xsearch predict {int8} --input - <<< '\"[MAX 1 [MIN 7 3 ] 2 ]\"'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
