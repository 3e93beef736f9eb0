"""Training and scoring on a CUDA GPU, where torch sees one (CI has none: skipped there). Every variant, in each
mode it supports, runs the same forward on the GPU as on the CPU, trains there (``device="cuda"``) and comes back
to the CPU; a supernet trains there and its subnets still extract with parity."""

import dataclasses
import random

import pytest
import torch

import xsearch
from tests.conftest import modes
from xsearch.tasks import get_task

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TOLERANCE = 2e-3  # (cuDNN's convolutions, as in compressive and memory-compressed attention, run in TF32)


@pytest.fixture(scope="module")
def tasks():
    return {False: get_task("listops", n_train=64, n_valid=32, n_test=32, min_len=16, max_len=64, max_depth=3, seed=1),
            True: get_task("lm", max_len=64)}  # fmt: skip


@pytest.mark.parametrize("name,causal", modes())
def test_every_variant_runs_trains_and_scores_on_the_gpu(name, causal, tasks):
    task = tasks[causal]
    torch.manual_seed(0)
    spec = xsearch.attention_spec(name)
    config = xsearch.ModelConfig(**task.model_fields(), d_model=32, n_layers=2, n_heads=4, attention=name,
                                 attention_params=dict(spec.small_params))  # fmt: skip
    model = xsearch.build_model(config)
    ids, mask, _ = next(iter(task.batches("valid", 4)))
    with torch.no_grad():
        want = model.eval()(ids, mask)
        got = model.to("cuda")(ids.cuda(), mask.cuda()).cpu()
    torch.testing.assert_close(got, want, atol=TOLERANCE, rtol=TOLERANCE)
    model.to("cpu")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = xsearch.train(model, task, steps=3, batch_size=4, eval_batches=1, progress=False, device="cuda")
    assert result.steps == 3 and all(t.device.type == "cpu" for t in model.state_dict().values())
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    on_gpu = xsearch.evaluate(model.to("cuda"), task, "valid")
    assert on_gpu == pytest.approx(xsearch.evaluate(model.to("cpu"), task, "valid"), abs=2 / 32 if not causal else 0.02)


def test_a_supernet_trains_on_the_gpu_and_comes_back(tasks):
    from xsearch.search_spaces import RandomDraw, load_space
    from xsearch.supernet import build_supernet, extract_subnet, train_supernet
    from xsearch.supernet.settings import SupernetTrainSettings

    task = tasks[False]
    space = load_space("default", max_len=64)
    sn = build_supernet(space, task.model_fields())
    record = train_supernet(sn, task, SupernetTrainSettings(steps=4, batch_size=4, device="cuda"), progress=False)
    assert record["steps"] == 4 and sn.device.type == "cpu"
    ids, mask, _ = next(iter(task.batches("valid", 4)))
    sn.eval()
    rng = random.Random(0)
    for cfg in [space.suggest(RandomDraw(rng), task.model_fields()) for _ in range(4)]:
        with torch.no_grad():
            torch.testing.assert_close(extract_subnet(sn, cfg)(ids, mask), sn(ids, mask, subnet=cfg), atol=1e-5, rtol=0)


def test_pretraining_on_the_gpu_takes_the_cpus_steps(tasks, tmp_path):
    """The masking is drawn on the CPU: without dropout, pretraining on the GPU takes the CPU's steps (to TF32's
    tolerance), checkpoints there and hands the model back on the CPU."""
    from xsearch.training.pretrain import pretrain
    from xsearch.training.settings import PretrainSettings

    task = tasks[False]
    config = xsearch.ModelConfig(**task.model_fields(), d_model=32, n_layers=2, n_heads=4, attention="full",
                                 dropout=0.0)  # fmt: skip
    torch.manual_seed(0)
    on_cpu, on_gpu = xsearch.build_model(config), xsearch.build_model(config)
    on_gpu.load_state_dict(on_cpu.state_dict())
    settings = PretrainSettings(steps=6, batch_size=4, checkpoint_every=3)
    pretrain(on_cpu, task, settings, progress=False)
    record = pretrain(on_gpu, task, dataclasses.replace(settings, device="cuda"), out=tmp_path / "p", progress=False)
    assert record["steps"] == 6 and all(t.device.type == "cpu" for t in on_gpu.state_dict().values())
    for name, want in on_cpu.state_dict().items():
        torch.testing.assert_close(on_gpu.state_dict()[name], want, atol=TOLERANCE, rtol=TOLERANCE)
    assert xsearch.load_model(tmp_path / "p").config == on_gpu.config


def test_search_trials_train_on_the_gpu(tmp_path):
    import optuna

    from xsearch.search import SearchSettings, run_search

    opts = {"n_train": 64, "n_valid": 32, "n_test": 16, "min_len": 16, "max_len": 64, "max_depth": 4}
    s = SearchSettings(task="listops", task_options=opts, space="tiny", target="ort-cpu", trials=2,
                       storage=f"sqlite:///{tmp_path}/s.db", study="t", train_steps=4, batch_size=16,
                       latency_repeats=3, threads=1, latency_cache=str(tmp_path / "lat.jsonl"),
                       train_device="cuda")  # fmt: skip
    run_search(s, progress=False)
    trials = optuna.load_study(study_name="t", storage=s.storage).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"] and all(t.values[0] > 0 for t in trials)


def test_distillation_fine_tunes_on_the_gpu_and_hands_both_models_back(tasks):
    from xsearch.compress.recipe import compress_model
    from xsearch.compress.settings import CompressSettings

    task = tasks[False]
    config = xsearch.ModelConfig(**task.model_fields(), d_model=32, n_layers=2, n_heads=4, attention="full")
    student, teacher = xsearch.build_model(config), xsearch.build_model(config)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    settings = CompressSettings(prune_heads=0.5, finetune_steps=3, batch_size=4, device="cuda")
    compress_model(student, task, settings, teacher=teacher, progress=False)
    for m in (student, teacher):
        assert all(t.device.type == "cpu" for t in m.state_dict().values())
    assert student.config.n_heads == 2 and any(k not in before or not torch.equal(before[k], v)
                                               for k, v in student.state_dict().items())  # fmt: skip
