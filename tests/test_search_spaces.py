import random

import pytest
import torch

import xsearch
from xsearch.search_spaces import RandomDraw, SpaceError, list_spaces, load_space, space_from_yaml


def write(tmp_path, text):
    p = tmp_path / "space.yaml"
    p.write_text(text)
    return p


GOOD = """
name: mine
reference: {attention: full, d_model: 32, n_layers: 1, n_heads: 2}
model:
  d_model: [32, 64]
  n_layers: {low: 1, high: 2}
  n_heads: [2, 4]
attention:
  full: {}
  local: {block_size: [8, 16, 128]}
  linformer: {k: [8]}
"""


def test_a_user_space_loads_and_suggests(tmp_path):
    import optuna

    space = load_space(write(tmp_path, GOOD), max_len=64)
    assert space.name == "mine" and set(space.attention) == {"full", "local", "linformer"}
    assert space.attention["local"]["block_size"].choices == (8, 16)  # 128 > max_len dropped
    study = optuna.create_study(directions=["maximize", "minimize"])
    fields = {"vocab_size": 16, "max_len": 64, "head": "classify", "n_classes": 10}
    for _ in range(6):
        trial = study.ask()
        cfg = space.suggest(trial, fields)
        assert isinstance(cfg, xsearch.ModelConfig) and cfg.d_model in (32, 64)
        for p in trial.params:
            assert p in ("attention", "d_model", "n_layers", "n_heads") or p.startswith(f"attention.{cfg.attention}.")
        study.tell(trial, [0.0, 1.0])
    ref = space.reference_config(fields)
    assert ref.attention == "full" and ref.d_model == 32 and ref.n_layers == 1


@pytest.mark.parametrize(
    "text,needle",
    [
        (GOOD.replace("\nmodel:", "\nmodle:"), "unknown key 'modle'"),
        (GOOD.replace("n_heads: [2, 4]", "n_heads: [2, 4]\n  depth: [1]"), "unknown model key 'depth'"),
        (GOOD.replace("linformer: {k: [8]}", "linformr: {k: [8]}"), "unknown attention 'linformr'"),
        (GOOD.replace("linformer: {k: [8]}", "linformer: {rank: [8]}"), "attention.linformer.rank"),
        (GOOD.replace("linformer: {k: [8]}", "linformer: {k: [0]}"), "attention.linformer.k"),
        (GOOD.replace("linformer: {k: [8]}", "linformer: {k: ['8']}"), "must be int"),
        (GOOD.replace("{low: 1, high: 2}", "{low: 3, high: 2}"), "low=3 is greater than high=2"),
        (GOOD.replace("{low: 1, high: 2}", "{lo: 1, high: 2}"), "unknown range key 'lo'"),
        (GOOD.replace("d_model: [32, 64]", "d_model: [30, 64]"), "not divisible"),
        (GOOD.replace("d_model: 32,", "d_model: 48,"), "reference.d_model=48"),
        (GOOD.replace("attention: full,", "attention: sparse,"), "reference.attention"),
        ("model: [unclosed", "malformed YAML"),
        (GOOD.replace("n_heads: [2, 4]", "n_heads: [2, 4]\n  pooling: [mean, cls]"), "model.pooling 'cls'"),
    ],
)
def test_validation_errors_name_key_and_value(tmp_path, text, needle):
    with pytest.raises(SpaceError, match=needle.replace("[", r"\[").replace("(", r"\(")):
        load_space(write(tmp_path, text))


def test_unknown_and_missing_spaces(tmp_path):
    with pytest.raises(SpaceError, match="unknown search space 'nope'.*default"):
        load_space("nope")
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        load_space(tmp_path / "missing.yaml")


def test_task_exclusions():
    lm = load_space("default", causal=True, max_len=128)
    assert set(lm.excluded) == {"linformer", "bigbird", "etc", "set"}
    assert all(xsearch.attention_spec(a).causal for a in lm.attention)
    short = load_space("default", max_len=24)
    assert "local" not in short.attention and "every block_size" in short.excluded["local"]


def test_a_task_default_fills_what_the_space_leaves_open(tmp_path):
    """ListOps suggests first-token pooling: a space without a pooling dimension gets it fixed (reference
    included); a space that searches pooling keeps its choices, and its reference takes the task's value."""
    from xsearch.search_spaces import load_space_for_task
    from xsearch.tasks import get_task

    task = get_task("listops", n_train=8, n_valid=4, n_test=4, min_len=8, max_len=64, max_depth=4)
    assert task.model_defaults() == {"pooling": "first"}
    assert get_task("lm", max_len=32).model_defaults() == {}
    fields = task.model_fields()
    fixed = load_space_for_task(write(tmp_path, GOOD), task)
    assert fixed.model["pooling"].choices == ("first",)
    assert fixed.reference_config(fields).pooling == "first"
    assert fixed.suggest(RandomDraw(random.Random(0)), fields).pooling == "first"
    assert "pooling" not in load_space(write(tmp_path, GOOD)).model  # no task: the space as written
    searched = load_space_for_task(
        write(tmp_path, GOOD.replace("n_heads: [2, 4]", "n_heads: [2, 4]\n  pooling: [mean, first]")), task
    )
    assert searched.model["pooling"].choices == ("mean", "first") and searched.reference["pooling"] == "first"
    rng = random.Random(0)
    draws = {searched.suggest(RandomDraw(rng), fields).pooling for _ in range(16)}
    assert draws == {"mean", "first"}
    again = space_from_yaml(fixed.to_yaml(), defaults=task.model_defaults())
    assert again.to_yaml() == fixed.to_yaml()  # a supernet's stored space compares equal


def test_shipped_spaces():
    assert {"default", "causal", "tiny"} <= set(list_spaces())
    assert len(load_space("default").attention) == 19
    assert set(load_space("causal").attention) == set(xsearch.list_attentions(causal=True))


@pytest.mark.parametrize("name", ["default", "causal", "tiny"])
def test_every_choice_of_every_shipped_space_builds_a_model(name):
    """Each value of each parameter and model dimension gives a model that runs (others at their first)."""
    causal = name == "causal"
    max_len = 256
    space = load_space(name, causal=causal, max_len=max_len)
    fields = {"vocab_size": 20, "max_len": max_len, "head": "lm" if causal else "classify", "causal": causal}
    if not causal:
        fields["n_classes"] = 3
    base_dims = {k: d.values()[0] for k, d in space.model.items()}
    base_dims.update(d_model=32, n_heads=2, n_layers=1)
    ids = torch.randint(1, 20, (1, 70))
    for attention, params in space.attention.items():
        first = {p: d.values()[0] for p, d in params.items()}
        variants = [dict(first)] + [{**first, p: v} for p, d in params.items() for v in d.values()]
        for ps in variants:
            cfg = space._config(attention, ps, base_dims, fields, xsearch.ModelConfig)
            out = xsearch.build_model(cfg).eval()(ids)
            assert torch.isfinite(out).all(), (attention, ps)
    for key, dim in space.model.items():
        for v in dim.values():
            dims = {**base_dims, key: v}
            cfg = space._config("full", {}, dims, fields, xsearch.ModelConfig)
            assert xsearch.build_model(cfg)(ids[:, :16]).shape[0] == 1


def test_show_round_trips_through_yaml(tmp_path):
    space = load_space("default")
    again = load_space(write(tmp_path, space.to_yaml()))
    assert again.model == space.model and again.attention == space.attention and again.reference == space.reference


def test_every_value_lists_the_choices_or_each_int_of_a_range_and_refuses_a_float_range():
    from xsearch.search_spaces.dims import parse_dim

    assert parse_dim("d", [64, 128]).every_value() == [64, 128]
    assert parse_dim("d", {"low": 1, "high": 4}).every_value() == [1, 2, 3, 4]
    assert parse_dim("d", {"low": 2, "high": 8, "step": 3}).every_value() == [2, 5, 8]
    with pytest.raises(SpaceError, match="float range"):
        parse_dim("d", {"low": 0.0, "high": 0.5}).every_value()
