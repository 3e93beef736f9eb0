"""The supernet's sampling rules: the sandwich rule's largest and smallest subnets, its in-place distillation,
progressive shrinking's schedule, and trainings that resume exactly."""

import dataclasses

import pytest
import torch

from tests.conftest import MAX_LEN
from xsearch.search_spaces import load_space
from xsearch.supernet import build_supernet, draw_subnets, sandwich_loss, train_supernet
from xsearch.supernet.settings import SupernetTrainSettings
from xsearch.tasks import get_task
from xsearch.training.loop import task_loss

FIELDS = {"vocab_size": 20, "max_len": 512, "head": "classify", "n_classes": 10}


def killed_at_step(monkeypatch, module, loss_name: str, step: int, run, *args, **kwargs) -> None:
    """Call ``run(*args, **kwargs)`` with ``module.loss_name`` raising at its ``step``-th call (a kill in that
    step), then put the loss back."""
    calls, real = [], getattr(module, loss_name)

    def dies(*args):
        calls.append(1)
        if len(calls) == step:
            raise RuntimeError("killed")
        return real(*args)

    monkeypatch.setattr(module, loss_name, dies)
    with pytest.raises(RuntimeError, match="killed"):
        run(*args, **kwargs)
    monkeypatch.setattr(module, loss_name, real)


@pytest.mark.parametrize("name", ["default", "per_layer"])
def test_the_sandwich_draws_the_largest_the_smallest_and_uniform_subnets(name):
    space = load_space(name, max_len=512)
    for step in range(5):
        largest, smallest, *rest = draw_subnets(space, FIELDS, 0, step, "sandwich", n_random=3)
        assert len(rest) == 3
        assert (largest.d_model, largest.n_layers) == (256, 4)
        assert (smallest.d_model, smallest.n_layers) == (64, 1)
        for layer in largest.layer_configs():
            assert (layer["attention"], layer["n_heads"], layer["d_ff"]) == ("full", 8, 1024)
        assert smallest.layer_configs()[0]["n_heads"] == 2 and smallest.layer_configs()[0]["d_ff"] == 64
        if name == "default":
            assert largest.weight_sharing == "none"
        # the smallest subnet takes each numeric parameter of its (drawn) variant at its bottom
        bottoms = {p: min(d.values()) for p, d in space.attention[smallest.attention].items()
                   if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in d.values())}  # fmt: skip
        assert all(smallest.attention_params[p] == v for p, v in bottoms.items())
    # the same seed and step draw the same subnets (a resumed run trains what the killed one would have)
    assert draws_described(space, 7) == draws_described(space, 7) != draws_described(space, 8)
    # the smallest's attention is drawn, so the sandwich trains every variant's smallest size over the steps
    assert len({draw_subnets(space, FIELDS, 0, s, "sandwich")[1].attention for s in range(40)}) > 5
    with pytest.raises(ValueError, match="unknown sampling rule 'greedy'"):
        draw_subnets(space, FIELDS, 0, 0, "greedy")


def draws_described(space, step):
    return [c.to_dict() for c in draw_subnets(space, FIELDS, 0, step, "sandwich")]


def test_sandwich_loss_is_the_teachers_cross_entropy_plus_the_students_kl_to_its_detached_predictions():
    space = load_space("tiny", max_len=MAX_LEN)
    fields = {**FIELDS, "max_len": MAX_LEN, "n_classes": 5}
    sn = build_supernet(space, fields, seed=1).eval()
    g = torch.Generator().manual_seed(0)
    ids, mask = torch.randint(1, 20, (4, MAX_LEN), generator=g), torch.ones(4, MAX_LEN, dtype=torch.bool)
    labels = torch.randint(0, 5, (4,), generator=g)
    big, small, *_ = draw_subnets(space, fields, 0, 0, "sandwich")

    # a subnet distilled from itself adds nothing: no loss, and no gradient (the teacher's side is detached)
    ce = task_loss(sn.bind(big), ids, mask, labels)
    (grad_ce,) = torch.autograd.grad(ce, [sn.tensor("embed.weight")])
    same = sandwich_loss(sn, [big, big], ids, mask, labels)
    (grad_same,) = torch.autograd.grad(same, [sn.tensor("embed.weight")])
    torch.testing.assert_close(same, ce / 2)
    torch.testing.assert_close(grad_same, grad_ce / 2)

    # a student: its KL to the teacher's probabilities
    t = sn(ids, mask, subnet=big).log_softmax(-1)
    s = sn(ids, mask, subnet=small).log_softmax(-1)
    kl = (t.exp() * (t - s)).sum(-1).mean()
    torch.testing.assert_close(sandwich_loss(sn, [big, small], ids, mask, labels), (ce + kl) / 2)


def test_sandwich_training_resumes_exactly_and_counts_its_subnet_passes(tmp_path, monkeypatch):
    import xsearch.supernet.train as training

    task = get_task("listops", n_train=64, n_valid=16, n_test=16, min_len=8, max_len=32)
    space = load_space("tiny", max_len=32)
    settings = SupernetTrainSettings(steps=6, lr=3e-3, batch_size=8, sampling="sandwich", sandwich_random=1,
                                     checkpoint_every=3)  # fmt: skip
    whole = build_supernet(space, task.model_fields())
    record = train_supernet(whole, task, settings, progress=False)
    assert record["steps"] == 6 and record["subnet_passes"] == 18

    fresh = build_supernet(space, task.model_fields())
    killed_at_step(monkeypatch, training, "sandwich_loss", 5, train_supernet, fresh, task, settings, out=tmp_path,
                   progress=False)  # fmt: skip
    resumed = build_supernet(space, task.model_fields())
    again = train_supernet(resumed, task, settings, out=tmp_path, progress=False)
    assert again["steps"] == 6 and again["final_loss"] == pytest.approx(record["final_loss"], abs=1e-6)
    for name in whole.shapes:
        torch.testing.assert_close(resumed.tensor(name), whole.tensor(name), atol=1e-6, rtol=0)


def test_a_checkpoint_older_than_an_option_resumes_and_other_settings_are_refused_by_name(tmp_path, monkeypatch):
    import xsearch.training.loop as loop_module
    from xsearch.errors import XSearchError
    from xsearch.serialization import read_checkpoint, write_checkpoint
    from xsearch.supernet.train import CHECKPOINT_FILE

    task = get_task("listops", n_train=64, n_valid=16, n_test=16, min_len=8, max_len=32)
    space = load_space("tiny", max_len=32)
    settings = SupernetTrainSettings(steps=4, lr=3e-3, batch_size=8, checkpoint_every=2)
    build = lambda: build_supernet(space, task.model_fields())  # noqa: E731
    whole = build()
    record = train_supernet(whole, task, settings, progress=False)

    # a run killed at its third step, its step-2 checkpoint then made to look written before sandwich_random
    # existed (its settings lack the key)
    killed_at_step(monkeypatch, loop_module, "task_loss", 3, train_supernet, build(), task, settings, out=tmp_path,
                   progress=False)  # fmt: skip
    state, tensors = read_checkpoint(tmp_path / CHECKPOINT_FILE, "checkpoint")
    assert state["steps"] == 2
    assert "device" not in state["settings"]  # (not the recipe: a run may resume on another device)
    state["settings"] = {k: v for k, v in state["settings"].items() if k != "sandwich_random"}
    write_checkpoint(tmp_path / CHECKPOINT_FILE, tensors, state)

    resumed = build()
    again = train_supernet(resumed, task, settings, out=tmp_path, progress=False)
    assert again["steps"] == 4 and again["final_loss"] == pytest.approx(record["final_loss"], abs=1e-6)
    for name in whole.shapes:
        torch.testing.assert_close(resumed.tensor(name), whole.tensor(name), atol=1e-6, rtol=0)

    other = SupernetTrainSettings(steps=4, lr=1e-3, batch_size=8, checkpoint_every=2)
    with pytest.raises(XSearchError, match=r"lr 0\.003 there, 0\.001 now") as err:
        train_supernet(build(), task, other, out=tmp_path, progress=False)
    assert "batch_size" not in str(err.value)


def test_subnets_per_step_counts_the_sandwich_rules_passes():
    assert SupernetTrainSettings(steps=1).subnets_per_step == 1
    assert SupernetTrainSettings(steps=1, sampling="sandwich", sandwich_random=3).subnets_per_step == 5


@pytest.mark.parametrize("name", ["default", "per_layer"])
def test_progressive_shrinking_starts_at_the_top_and_lets_the_ranges_down_to_uniform(name):
    from xsearch.search_spaces import BoundaryDraw, RandomDraw, ShrinkingDraw

    space = load_space(name, max_len=512)
    draw = lambda s: draw_subnets(space, FIELDS, 0, s, "progressive", steps=100, shrink_fraction=0.5)[0]  # noqa: E731
    # step 0: every number at its top, the reference's sharing; the attention is still drawn
    firsts = [draw_subnets(space, FIELDS, seed, 0, "progressive", steps=100)[0] for seed in range(30)]
    for cfg in firsts:
        assert (cfg.d_model, cfg.n_layers, cfg.weight_sharing) == (256, 4, "none")
        assert all((lay["n_heads"], lay["d_ff"]) == (8, 1024) for lay in cfg.layer_configs())
    assert len({lay["attention"] for cfg in firsts for lay in cfg.layer_configs()}) > 5
    # half way through the ramp, only the top half of each range: d_model 128 or 256, 3 or 4 layers
    mid = [draw_subnets(space, FIELDS, seed, 25, "progressive", steps=100)[0] for seed in range(60)]
    assert {c.d_model for c in mid} == {128, 256} and {c.n_layers for c in mid} == {3, 4}
    # from shrink_fraction * steps on, the whole space: the bottoms come in
    late = [draw(s) for s in range(50, 100)]
    assert min(c.d_model for c in late) == 64 and min(c.n_layers for c in late) == 1
    # the same seed and step draw the same subnet (a resumed run trains what the killed one would have)
    assert draw(30).to_dict() == draw(30).to_dict()
    with pytest.raises(ValueError, match="needs the run's steps"):
        draw_subnets(space, FIELDS, 0, 0, "progressive")

    # the draw itself: reach 0 is BoundaryDraw("max") on numbers, reach 1 spans each range as RandomDraw does
    import random

    top = ShrinkingDraw(random.Random(0), 0.0, {"weight_sharing": "none"})
    largest = BoundaryDraw(random.Random(0), "max", {"weight_sharing": "none"})
    assert top.suggest_int("n", 1, 7, step=2) == largest.suggest_int("n", 1, 7, step=2) == 7
    assert top.suggest_float("x", 0.0, 1.0, step=0.25) == 1.0 and top.suggest_categorical("k", [16, 64, 32]) == 64
    whole = ShrinkingDraw(random.Random(0), 1.0)
    assert {whole.suggest_int("n", 1, 7, step=2) for _ in range(200)} == {1, 3, 5, 7}
    assert {whole.suggest_categorical("k", [16, 64, 32]) for _ in range(200)} == {16, 32, 64}
    half = ShrinkingDraw(random.Random(0), 0.5)
    assert {half.suggest_int("n", 1, 9) for _ in range(300)} == {5, 6, 7, 8, 9}
    assert all(0.5 <= half.suggest_float("x", 0.0, 1.0) <= 1.0 for _ in range(100))
    assert {RandomDraw(random.Random(i)).suggest_int("n", 1, 9) for i in range(300)} == set(range(1, 10))
    with pytest.raises(ValueError, match="reach must be in"):
        ShrinkingDraw(random.Random(0), 1.5)


def test_progressive_training_resumes_exactly_and_needs_a_budget_in_steps(tmp_path, monkeypatch):
    import xsearch.training.loop as loop_module
    from xsearch.errors import SettingError

    task = get_task("listops", n_train=64, n_valid=16, n_test=16, min_len=8, max_len=32)
    space = load_space("tiny", max_len=32)
    settings = SupernetTrainSettings(steps=6, lr=3e-3, batch_size=8, sampling="progressive", checkpoint_every=3)
    whole = build_supernet(space, task.model_fields())
    record = train_supernet(whole, task, settings, progress=False)
    assert record["steps"] == 6 and record["subnet_passes"] == 6

    build = lambda: build_supernet(space, task.model_fields())  # noqa: E731
    killed_at_step(monkeypatch, loop_module, "task_loss", 5, train_supernet, build(), task, settings, out=tmp_path,
                   progress=False)  # fmt: skip
    resumed = build()
    again = train_supernet(resumed, task, settings, out=tmp_path, progress=False)
    assert again["final_loss"] == pytest.approx(record["final_loss"], abs=1e-6)
    for name in whole.shapes:
        torch.testing.assert_close(resumed.tensor(name), whole.tensor(name), atol=1e-6, rtol=0)

    # another shrink schedule is another recipe: refused by name
    from xsearch.errors import XSearchError

    faster = dataclasses.replace(settings, shrink_fraction=0.25)
    with pytest.raises(XSearchError, match="shrink_fraction"):
        train_supernet(build(), task, faster, out=tmp_path, progress=False)
    with pytest.raises(SettingError, match="progressive shrinks on a schedule of steps: give steps, not seconds"):
        SupernetTrainSettings(seconds=5.0, sampling="progressive")
