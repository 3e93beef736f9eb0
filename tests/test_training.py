import math

import pytest
import torch

import xsearch
from xsearch.tasks import get_task


@pytest.fixture(scope="module")
def task():
    return get_task("listops", n_train=256, n_valid=64, n_test=64, min_len=16, max_len=48, max_depth=3, seed=2)


def small_model(task, **kw):
    torch.manual_seed(0)
    return xsearch.build_model(xsearch.ModelConfig(**task.model_fields(), d_model=32, n_layers=1, n_heads=2, **kw))


def test_training_lowers_the_loss(task):
    model = small_model(task, attention="local", attention_params={"block_size": 16})
    losses = []
    xsearch.train(
        model,
        task,
        steps=1,
        batch_size=64,
        lr=0,
        progress=False,
        loss_fn=lambda m, i, k, l: losses.append(xsearch.training.task_loss(m, i, k, l)) or losses[-1],
    )
    before = losses[0].item()
    result = xsearch.train(model, task, steps=120, batch_size=32, lr=3e-3, progress=False, eval_every=40)
    assert result.steps == 120 and len(result.history) == 3
    assert result.final_loss < before - 0.2, (before, result.final_loss)
    acc = xsearch.evaluate(model, task, "test")
    assert 0.0 <= acc <= 1.0
    assert not model.training


def test_seconds_budget(task):
    model = small_model(task)
    result = xsearch.train(model, task, seconds=1.0, batch_size=8, progress=False)
    assert result.steps > 0 and result.seconds >= 1.0


def test_divergence_is_reported(task):
    model = small_model(task)
    with torch.no_grad():
        model.head.weight.fill_(float("nan"))
    with pytest.raises(xsearch.TrainingDiverged, match="step 0"):
        xsearch.train(model, task, steps=5, progress=False)


def test_evaluate_score_is_the_accuracy_and_the_mean_cross_entropy_of_one_pass(task):
    model = small_model(task)
    xsearch.train(model, task, steps=20, batch_size=32, lr=3e-3, progress=False)
    score = xsearch.evaluate_score(model, task, "valid")
    logits, labels = [], []
    with torch.no_grad():  # an independent pass: the split in its own order, one example at a time
        for ids, mask, ys in task.batches("valid", 1):
            logits.append(model(ids, mask))
            labels.append(ys)
    logits, labels = torch.cat(logits), torch.cat(labels)
    assert score.metric == xsearch.evaluate(model, task, "valid")
    assert score.metric == pytest.approx((logits.argmax(-1) == labels).double().mean().item())
    assert score.loss == pytest.approx(torch.nn.functional.cross_entropy(logits, labels).item(), rel=1e-5)
    # the validation points of a training run record both, from the weights they were taken with
    result = xsearch.train(model, task, steps=4, batch_size=32, lr=1e-3, eval_batches=None, progress=False)
    last = xsearch.evaluate_score(model, task, "valid")
    assert (result.history[-1]["valid"], result.history[-1]["valid_loss"]) == (last.metric, last.loss)


def test_the_loss_of_lm_is_its_bits_per_byte_in_nats():
    t = get_task("lm", max_len=32)
    model = xsearch.build_model(
        xsearch.ModelConfig(**t.model_fields(), d_model=32, n_layers=1, n_heads=2, attention="linear")
    )
    score = xsearch.evaluate_score(model, t, "test", max_batches=2)
    assert score.loss == pytest.approx(score.metric * math.log(2))
    assert t.loss_chance("valid") == pytest.approx(t.chance("valid") * math.log(2))


def test_lm_bits_per_byte():
    t = get_task("lm", max_len=32)
    model = xsearch.build_model(
        xsearch.ModelConfig(**t.model_fields(), d_model=32, n_layers=1, n_heads=2, attention="linear")
    )
    bpb = xsearch.evaluate(model, t, "test", max_batches=2)
    assert abs(bpb - math.log2(257)) < 1.5  # an untrained model is near uniform over 257 ids
    xsearch.train(model, t, steps=60, batch_size=16, lr=3e-3, progress=False)
    assert xsearch.evaluate(model, t, "test", max_batches=2) < bpb - 1.0


def test_bad_arguments(task):
    model = small_model(task)
    with pytest.raises(ValueError, match="steps= or seconds="):
        xsearch.train(model, task)
    with pytest.raises(ValueError, match="split"):
        xsearch.evaluate(model, task, "dev")


def test_keep_best_leaves_the_weights_of_the_best_validation_point(task):
    model = small_model(task)

    def spoil(step, rec):  # after step 40 the weights are ruined: later validation points are worse
        if step == 40:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 5)

    result = xsearch.train(model, task, steps=60, batch_size=16, lr=3e-3, eval_every=10, eval_batches=None,
                           keep_best=True, callback=spoil, progress=False)  # fmt: skip
    losses = [r["valid_loss"] for r in result.history]
    kept = result.history[losses.index(min(losses))]
    assert result.best_step == kept["step"] <= 40 and result.valid_metric == kept["valid"]
    score = xsearch.evaluate_score(model, task, "valid")
    assert score.loss == pytest.approx(min(losses)) and score.metric == pytest.approx(kept["valid"])


def test_keep_best_chooses_by_loss_among_points_whose_accuracy_ties():
    from xsearch.training.loop import _Best

    model = torch.nn.Linear(2, 2)
    best = _Best(model, keep=True)
    for step, valid, loss in [(10, 0.34, 1.90), (20, 0.34, 1.85), (30, 0.30, 1.95), (40, 0.34, 1.80)]:
        with torch.no_grad():
            model.weight.fill_(step)
        best.offer({"step": step, "valid": valid, "valid_loss": loss})
    # by accuracy the first of the tied 0.34 (step 10, the least trained) would be kept
    assert best.record["step"] == 40 and float(best.state["weight"][0, 0]) == 40.0


def test_weight_average_is_an_exponential_moving_average():
    from xsearch.training.loop import WeightAverage

    model = torch.nn.Linear(3, 2)
    avg = WeightAverage(model, decay=0.75)
    start = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(4.0)
    avg.update()
    torch.testing.assert_close(avg.module.weight, 0.75 * start + 0.25 * (start + 4.0))
    assert not avg.module.weight.requires_grad


def test_ema_training_validates_and_keeps_the_averaged_weights(task):
    plain, averaged = small_model(task), small_model(task)
    xsearch.train(plain, task, steps=20, lr=3e-3, progress=False)
    r = xsearch.train(averaged, task, steps=20, lr=3e-3, ema=0.9, progress=False)
    assert not torch.allclose(plain.head.weight, averaged.head.weight)  # the average, not the last step
    # the figure reported is the kept weights' own
    assert r.valid_metric == xsearch.evaluate(averaged, task, "valid", batch_size=32, max_batches=8)
    with pytest.raises(xsearch.XSearchError, match="ema"):
        xsearch.train(plain, task, steps=1, ema=1.0, progress=False)


def test_label_smoothing_is_cross_entropy_against_smoothed_targets(task):
    from xsearch.training.loop import task_loss

    model = small_model(task).eval()
    ids, mask, labels = next(task.batches("train", 8))
    logits = model(ids, mask)
    want = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.2)
    torch.testing.assert_close(task_loss(model, ids, mask, labels, label_smoothing=0.2), want)
    assert not torch.allclose(want, task_loss(model, ids, mask, labels))


def test_step_loop_resumed_midway_takes_the_same_steps():
    """A loop started at a checkpoint's step (its optimizer state and loss window restored) continues the same
    schedule and ends with the weights of an uninterrupted one; a NaN loss stops it with the run's name."""
    from xsearch.training.steps import StepLoop, TrainingDiverged, adamw, lr_factor

    def run(start_at=None, stop_at=None):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        opt, params = adamw(model.named_parameters(), lr=0.1, weight_decay=0.01)
        assert [len(g["params"]) for g in opt.param_groups] == [1, 1]  # no decay on the bias
        x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
        if start_at is not None:
            model.load_state_dict(start_at["model"])
            opt.load_state_dict(start_at["opt"])
        first = start_at["step"] if start_at else 0
        loop = StepLoop(opt, params, lr=0.1, warmup=0.2, grad_clip=0.5, steps=10, progress=False, step=first,
                        window=start_at["window"] if start_at else None)  # fmt: skip
        lrs = []
        with loop:
            for step in loop:
                lrs.append((step, opt.param_groups[0]["lr"]))
                loop.update(torch.nn.functional.cross_entropy(model(x), y))
                if stop_at is not None and loop.step == stop_at:
                    return {"model": model.state_dict(), "opt": opt.state_dict(), "step": loop.step,
                            "window": loop.window}  # fmt: skip
        return model, lrs, loop

    whole, lrs, loop = run()
    assert [s for s, _ in lrs] == list(range(10)) and loop.step == 10 and len(loop.window) == 10
    assert all(lr == pytest.approx(0.1 * lr_factor(s / 10, 0.2)) for s, lr in lrs)
    resumed, rest, again = run(start_at=run(stop_at=4))
    assert [s for s, _ in rest] == list(range(4, 10)) and again.window == loop.window
    torch.testing.assert_close(resumed.state_dict(), whole.state_dict())

    model = torch.nn.Linear(2, 2)
    opt, params = adamw(model.named_parameters(), lr=0.1, weight_decay=0.0)
    nan_loop = StepLoop(opt, params, lr=0.1, warmup=0.0, grad_clip=0.0, steps=3, label="pretraining")
    with pytest.raises(TrainingDiverged, match="pretraining diverged.*at step 0"), nan_loop:
        for _ in nan_loop:
            nan_loop.update(model(torch.ones(1, 2)).sum() * float("nan"))


@pytest.mark.parametrize("skip", [10, 21])
def test_resumed_batches_go_on_where_an_uninterrupted_run_is(task, skip):
    """Batches skipped for a resumed run (within the second epoch, or past two: 256 examples are 8 batches of
    32) are the ones an uninterrupted run drew, and the next are the ones it draws next; the skipped ones are
    not built (a run resumed late would otherwise pad every batch it passes over)."""
    from unittest import mock

    import xsearch.tasks.base as task_base
    from xsearch.training.loop import endless_batches

    whole = endless_batches(task, 32, seed=3)
    drawn = [next(whole) for _ in range(skip + 2)]
    built = mock.Mock(wraps=task_base.pad_batch)
    with mock.patch.object(task_base, "pad_batch", built):
        resumed = endless_batches(task, 32, seed=3, skip=skip)
        for expected in drawn[skip:]:
            for a, b in zip(next(resumed), expected, strict=True):
                assert torch.equal(a, b)
    assert built.call_count == 2
    assert not torch.equal(drawn[0][0], drawn[8][0])  # the second epoch is reshuffled


def test_resumed_lm_windows_go_on_where_an_uninterrupted_run_is():
    from xsearch.training.loop import endless_batches

    lm = get_task("lm", max_len=32)
    whole = endless_batches(lm, 4, seed=1)
    drawn = [next(whole) for _ in range(7)]
    resumed = endless_batches(lm, 4, seed=1, skip=5)
    for expected in drawn[5:]:
        for a, b in zip(next(resumed), expected, strict=True):
            assert torch.equal(a, b)
    assert not torch.equal(drawn[5][0], drawn[6][0])


def test_training_on_the_named_device_is_training_where_the_model_is(task):
    torch.manual_seed(3)
    here, named = small_model(task), small_model(task)
    xsearch.train(here, task, steps=6, batch_size=16, progress=False)
    xsearch.train(named, task, steps=6, batch_size=16, progress=False, device="cpu")
    for (name, a), b in zip(here.state_dict().items(), named.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_cuda_without_a_gpu_is_refused_before_any_step(task):
    from xsearch.errors import XSearchError
    from xsearch.supernet import build_supernet, train_supernet
    from xsearch.supernet.settings import SupernetTrainSettings
    from xsearch.training.settings import TrainSettings

    model = small_model(task)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(XSearchError, match=r"^device 'cuda': torch .* sees no CUDA GPU"):
        xsearch.train(model, task, steps=2, progress=False, device="cuda")
    assert all(torch.equal(before[k], v) and v.device.type == "cpu" for k, v in model.state_dict().items())
    config = small_model(task).config
    with pytest.raises(XSearchError, match="device 'cuda'"):
        xsearch.train_model(config, task, TrainSettings(steps=2, device="cuda"))
    sn = build_supernet("tiny", task.model_fields())
    with pytest.raises(XSearchError, match="device 'cuda'"):
        train_supernet(sn, task, SupernetTrainSettings(steps=2, device="cuda"), progress=False)
    from xsearch.training.pretrain import pretrain
    from xsearch.training.settings import PretrainSettings

    with pytest.raises(XSearchError, match="device 'cuda:0'"):
        pretrain(model, task, PretrainSettings(steps=2, device="cuda:0"), progress=False)
    assert all(torch.equal(before[k], v) and v.device.type == "cpu" for k, v in model.state_dict().items())


def test_an_unknown_device_is_refused_by_name():
    from xsearch.errors import XSearchError
    from xsearch.training.device import resolve_device
    from xsearch.training.settings import TrainSettings

    with pytest.raises(ValueError, match="tpu"):
        TrainSettings(steps=1, device="tpu")
    with pytest.raises(XSearchError, match=r"unknown device 'tpu' \(valid: cpu, cuda, cuda:N\)"):
        resolve_device("tpu")
    for bad in ("cuda:", "cuda:one", "cuda:-1", "CUDA", "cpu:0"):
        with pytest.raises(ValueError, match=bad):
            TrainSettings(steps=1, device=bad)
        with pytest.raises(XSearchError, match=f"unknown device '{bad}'"):
            resolve_device(bad)


def test_one_gpu_of_several_is_named_cuda_n():
    from xsearch.errors import XSearchError
    from xsearch.training.device import resolve_device
    from xsearch.training.settings import TrainSettings

    assert TrainSettings(steps=1, device="cuda:1").device == "cuda:1"
    assert resolve_device(torch.device("cpu")) == torch.device("cpu") == resolve_device("cpu")
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        assert resolve_device(f"cuda:{n - 1}") == torch.device("cuda", n - 1)
        wanted = f"device 'cuda:{n}': torch sees {n} CUDA GPU"
    else:
        wanted = r"device 'cuda:1': torch .* sees no CUDA GPU"
        n = 1
    with pytest.raises(XSearchError, match=wanted):
        resolve_device(f"cuda:{n}")
    with pytest.raises(XSearchError, match=wanted):
        resolve_device(torch.device("cuda", n))


def _spy_on_moves(module, monkeypatch):
    """The devices ``module.to`` is called with, in order (and the move is made)."""
    moves, to = [], module.to

    def recorded(device, *args, **kwargs):
        moves.append(torch.device(device))
        return to(device, *args, **kwargs)

    monkeypatch.setattr(module, "to", recorded)
    return moves


def test_an_interrupted_run_hands_the_model_back_where_it_was(task, monkeypatch):
    from xsearch.supernet import build_supernet, train_supernet
    from xsearch.supernet.settings import SupernetTrainSettings
    from xsearch.training.settings import TrainSettings

    class Interrupted(Exception):
        pass

    def interrupt(*args, **kwargs):
        raise Interrupted

    cpu = torch.device("cpu")
    model = small_model(task)
    moves = _spy_on_moves(model, monkeypatch)
    with pytest.raises(Interrupted):
        xsearch.train(model, task, steps=3, progress=False, device="cpu", loss_fn=interrupt)
    assert moves == [cpu, cpu]  # there, then back: the second move is the one a raise used to skip
    moves.clear()
    monkeypatch.setattr("xsearch.training.loop.task_loss", interrupt)
    with pytest.raises(Interrupted):
        xsearch.train_model(model.config, task, TrainSettings(steps=3, device="cpu"), init=model, progress=False)
    assert moves and moves[-1] == cpu and len(moves) % 2 == 0  # every move undone, the outer one last
    sn = build_supernet("tiny", task.model_fields())
    moves = _spy_on_moves(sn, monkeypatch)
    with pytest.raises(Interrupted):
        train_supernet(sn, task, SupernetTrainSettings(steps=3, batch_size=4), progress=False)
    assert moves == [cpu, cpu]
    from xsearch.training.pretrain import pretrain
    from xsearch.training.settings import PretrainSettings

    model = small_model(task)
    moves = _spy_on_moves(model, monkeypatch)
    monkeypatch.setattr("xsearch.training.pretrain.denoising_loss", interrupt)
    with pytest.raises(Interrupted):
        pretrain(model, task, PretrainSettings(steps=3, batch_size=4), progress=False)
    assert moves == [cpu, cpu]
