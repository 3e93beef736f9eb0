"""Compression: pruning for every variant, distillation, adapters, torch-side quantization."""

import numpy as np
import pytest
import torch

import xsearch
from tests.conftest import MAX_LEN
from xsearch.compress import add_adapters, distill, load_adapters, merge_adapters, prune, quantize, save_adapters
from xsearch.export import Predictor, to_onnx
from xsearch.tasks import get_task


@pytest.fixture(scope="module")
def task():
    return get_task("listops", n_train=256, n_valid=64, n_test=64, min_len=8, max_len=MAX_LEN, max_depth=4, seed=3)


def model_for(task, name, causal=False, d_model=32, n_layers=2, **kw):
    torch.manual_seed(0)
    fields = task.model_fields()
    if causal:
        fields.update(head="lm", causal=True)
        fields.pop("n_classes")
    cfg = xsearch.ModelConfig(**fields, d_model=d_model, n_layers=n_layers, n_heads=4, attention=name,
                              attention_params=dict(xsearch.attention_spec(name).small_params), **kw)  # fmt: skip
    return xsearch.build_model(cfg).eval()


def batch(n=30):
    ids = torch.randint(1, 16, (3, n))
    mask = torch.ones(3, n, dtype=torch.bool)
    mask[1, n // 2 :] = False
    ids[1, n // 2 :] = 0
    return ids, mask


def prune_modes():
    out = [pytest.param(n, False, id=n) for n in xsearch.list_attentions()]
    out += [pytest.param(n, True, id=f"{n}-causal") for n in ("reformer", "routing", "xl")]  # tied QK, per-head bufs
    return out


def slices_own_parameters(name: str) -> bool:
    """Whether pruning a variant's heads slices parameters of its own (a ``prune_head_params`` of its class)
    beyond the q/k/v/out projections every variant shares."""
    from xsearch.attention._base import Attention
    from xsearch.attention._registry import attention_class

    return attention_class(name).prune_head_params is not Attention.prune_head_params


@pytest.mark.parametrize("name,causal", prune_modes())
def test_prune_every_variant_saves_loads_and_exports(name, causal, task, tmp_path):
    """Every variant prunes, saves and loads; the pruned model exports with parity where pruning sliced
    something of the variant's own (the shared projections' export is covered by ``full``): an export is
    about 8 s, and the rest of the variants' pruned graphs differ from the unpruned, exported in test_export,
    only in the projections' widths."""
    model = model_for(task, name, causal)
    before = xsearch.count_parameters(model)
    prune(model, heads=0.5, ffn=0.5)
    after = xsearch.count_parameters(model)
    assert model.config.n_heads == 2 and model.config.ffn_dims == [64, 64]
    assert all(layer.attn.n_heads == 2 for layer in model.layers())
    assert after <= 0.6 * before, (name, before, after)
    ids, mask = batch()
    out = model(ids, mask)
    assert torch.isfinite(out).all()
    xsearch.save_model(model, tmp_path / "m")
    loaded = xsearch.load_model(tmp_path / "m")
    torch.testing.assert_close(loaded(ids, mask), out, atol=0, rtol=0)
    if name == "full" or slices_own_parameters(name):
        report = to_onnx(loaded, tmp_path / "m.onnx")
        assert report.max_abs_diff <= 1e-4


def test_pruning_keeps_the_most_important_heads_exactly(task):
    """Zeroing a head's weights makes it the least important; pruning it leaves the function unchanged."""
    model = model_for(task, "full", n_layers=1)
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.out_proj.weight[:, 8:16] = 0  # head 1 contributes nothing
        attn.q_proj.weight[8:16] = 0
    ids, mask = batch()
    ref = model(ids, mask)
    prune(model, heads=0.25, ffn=0.0)
    assert model.config.n_heads == 3
    torch.testing.assert_close(model(ids, mask), ref, atol=1e-5, rtol=1e-4)


def test_prune_taylor_and_errors(task):
    model = model_for(task, "local")
    prune(model, heads=0.5, ffn=0.25, importance="taylor", task=task, batches=2)
    assert model.config.n_heads == 2 and model.config.ffn_dims == [96, 96]
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="task="):
        prune(model_for(task, "full"), importance="taylor")
    with pytest.raises(ValueError, match="fisher"):
        prune(model_for(task, "full"), importance="fisher")
    with pytest.raises(ValueError, match="heads"):
        prune(model_for(task, "full"), heads=1.0)


def test_prune_shared_weights(task, tmp_path):
    model = model_for(task, "linear", weight_sharing="all")
    prune(model, heads=0.5, ffn=0.5)
    xsearch.save_model(model, tmp_path / "m")
    ids, mask = batch()
    torch.testing.assert_close(xsearch.load_model(tmp_path / "m")(ids, mask), model(ids, mask), atol=0, rtol=0)


def _kl_to_teacher(student, teacher, task):
    tot = 0.0
    with torch.no_grad():
        for ids, mask, _ in task.batches("valid", 64):
            t = torch.log_softmax(teacher(ids, mask), -1)
            s = torch.log_softmax(student(ids, mask), -1)
            tot += torch.nn.functional.kl_div(s, t, log_target=True, reduction="sum").item()
    return tot


def test_distillation_brings_the_student_closer_to_the_teacher(task):
    teacher = model_for(task, "full", d_model=64)
    xsearch.train(teacher, task, steps=150, batch_size=32, lr=3e-3, progress=False)
    plain = model_for(task, "linear", n_layers=1)
    xsearch.train(plain, task, steps=80, batch_size=32, lr=3e-3, progress=False, seed=1)
    student = model_for(task, "linear", n_layers=1)
    distill(student, teacher, task, steps=80, alpha=0.9, temperature=2.0, batch_size=32, lr=3e-3, progress=False,
            seed=1)  # fmt: skip
    assert _kl_to_teacher(student, teacher, task) < _kl_to_teacher(plain, teacher, task)
    hidden = model_for(task, "linear", n_layers=1)
    distill(hidden, teacher, task, steps=5, hidden=True, progress=False)
    assert not hasattr(hidden, "distill_projection")


@pytest.mark.parametrize("kind", ["bottleneck", "lora"])
def test_adapters_train_save_load(kind, task, tmp_path):
    base = model_for(task, "linformer", d_model=64)
    xsearch.save_model(base, tmp_path / "base")
    model = add_adapters(xsearch.load_model(tmp_path / "base"), kind=kind, size=4, n_classes=3)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or "adapter_" in n or n.startswith("head.") for n in trainable)
    three = [(s, y % 3) for s, y in zip(*task.data["train"])]
    task3 = get_task("listops", n_train=8, n_valid=8, n_test=8, min_len=8, max_len=MAX_LEN, max_depth=4)
    task3.n_classes, task3.label_names = 3, ["a", "b", "c"]
    task3.data["train"] = ([s for s, _ in three], [y for _, y in three])
    task3.data["valid"] = task3.data["train"]
    frozen_before = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    xsearch.train(model, task3, steps=10, batch_size=16, lr=1e-2, progress=False)
    for n, p in model.named_parameters():
        if n in frozen_before:
            assert torch.equal(p, frozen_before[n]), f"frozen {n} changed"
    ids, mask = batch()
    out = model(ids, mask)
    assert out.shape == (3, 3)
    save_adapters(model, tmp_path / "ad")
    size = (tmp_path / "ad" / "adapters.safetensors").stat().st_size
    assert size < 0.1 * (tmp_path / "base" / "model.safetensors").stat().st_size
    fresh = load_adapters(xsearch.load_model(tmp_path / "base"), tmp_path / "ad")
    torch.testing.assert_close(fresh(ids, mask), out, atol=0, rtol=0)
    # the same base still serves its own 10-class task
    assert xsearch.load_model(tmp_path / "base")(ids, mask).shape == (3, 10)
    if kind == "lora":
        merged = merge_adapters(fresh)
        assert not any("lora_" in n for n, _ in merged.named_parameters())
        torch.testing.assert_close(merged(ids, mask), out, atol=1e-5, rtol=1e-5)
    else:  # bottleneck adapters export as modules
        report = to_onnx(model, tmp_path / "a.onnx")
        np.testing.assert_allclose(Predictor(tmp_path / "a.onnx").logits(ids.numpy(), mask.numpy()),
                                   out.detach().numpy(), atol=1e-4)  # fmt: skip
        assert report.max_abs_diff <= 1e-4


def test_adapters_refuse_another_base(task, tmp_path):
    model = add_adapters(model_for(task, "full"), kind="lora", size=2)
    save_adapters(model, tmp_path / "ad")
    with pytest.raises(ValueError, match="another base model.*d_model"):
        load_adapters(model_for(task, "full", d_model=64), tmp_path / "ad")
    with pytest.raises(ValueError, match="not a Linear"):
        add_adapters(model_for(task, "full"), kind="lora", targets=("nope",))


@pytest.mark.parametrize("name", ["local", "linformer", "reformer", "memory_compressed"])
def test_quantize_modes_keep_predictions(name, task):
    model = model_for(task, name)
    xsearch.train(model, task, steps=60, batch_size=32, lr=3e-3, progress=False)
    ids, mask, _ = next(task.batches("test", 64))
    with torch.no_grad():
        ref = model(ids, mask).argmax(-1)
        for mode in ("bf16", "fp16", "dynamic-int8"):
            q = quantize(model, mode)
            agree = (q(ids, mask).float().argmax(-1) == ref).float().mean().item()
            assert agree > 0.95, (name, mode, agree)
    assert next(model.parameters()).dtype == torch.float32  # the input model is unchanged
    with pytest.raises(ValueError, match="int4"):
        quantize(model, "int4")


def test_cli_compress_and_adapt(task, tmp_path, capsys):
    import json

    from xsearch.cli import main

    opts = ["--task", "listops", "--task-opt", "n_train=64", "--task-opt", "n_valid=16", "--task-opt", "n_test=32",
            "--task-opt", "min_len=8", "--task-opt", "max_depth=4", "--max-len", "64"]  # fmt: skip
    assert main(["train", *opts, "--attention", "local", "--set", "block_size=16", "--d-model", "64", "--layers",
                 "2", "--heads", "4", "--steps", "20", "--quiet", "--out", str(tmp_path / "m")]) == 0  # fmt: skip
    assert main(["train", *opts, "--attention", "full", "--d-model", "64", "--layers", "2", "--heads", "4",
                 "--steps", "20", "--quiet", "--out", str(tmp_path / "teacher")]) == 0  # fmt: skip
    capsys.readouterr()
    rc = main(["compress", str(tmp_path / "m"), "--prune-heads", "0.5", "--prune-ffn", "0.5", "--distill-from",
               str(tmp_path / "teacher"), "--finetune-steps", "5", "--int8", "--quiet", "--threads", "1",
               "--out", str(tmp_path / "small")])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "before (fp32)" in printed and "after (int8)" in printed and "ratio" in printed
    small = xsearch.load_model(tmp_path / "small")
    assert small.config.n_heads == 2 and small.config.ffn_dims == [128, 128]
    assert (tmp_path / "small" / "model.int8.onnx").is_file()
    assert main(["compress", str(tmp_path / "m"), "--distill-from", str(tmp_path / "teacher"), "--out",
                 str(tmp_path / "x")]) == 2  # fmt: skip
    # adapters for a text task with its own labels, on the same base
    data = tmp_path / "d.jsonl"
    rows = [{"text": f"[MAX {i % 10} 1 ]", "label": "hi" if i % 10 > 4 else "lo"} for i in range(60)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    bytes_model = tmp_path / "bytes"
    assert main(["train", "--task", "text", "--data", str(data), "--max-len", "64", "--d-model", "32", "--layers",
                 "1", "--heads", "2", "--steps", "3", "--quiet", "--out", str(bytes_model)]) == 0  # fmt: skip
    assert main(["adapt", str(bytes_model), "--task", "text", "--data", str(data), "--max-len", "64", "--kind",
                 "lora", "--size", "4", "--steps", "5", "--quiet", "--out", str(tmp_path / "ad")]) == 0  # fmt: skip
    doc = json.loads((tmp_path / "ad" / "adapters.json").read_text())
    assert doc["adapter"]["kind"] == "lora" and doc["adapter"]["n_classes"] == 2
