"""Decoder export: prefill and step graphs for every causal variant, generation parity with torch,
int8, the onnxruntime-only Generator, ``xsearch generate`` and ``POST /generate``."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

import xsearch
from xsearch.export import Generator, quantize_onnx, to_onnx
from xsearch.export.metadata import step_path_for

CAUSAL = xsearch.list_attentions(causal=True)
VOCAB, MAX_LEN = 29, 64
TOKENS = 30  # greedy tokens compared (the export's own check compares 24 more, logits included)


def _lm(name: str, **over) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = dict(
        attention=name, attention_params=dict(xsearch.attention_spec(name).small_params), d_model=32, n_heads=4,
        n_layers=1, d_ff=48, vocab_size=VOCAB, max_len=MAX_LEN, causal=True, head="lm",
    )  # fmt: skip
    cfg.update(over)
    model = xsearch.build_model(xsearch.ModelConfig(**cfg)).eval()
    with torch.no_grad():  # sharper logits than at init, so greedy choices are far from ties
        model.head.weight.mul_(4.0)
    return model


@pytest.fixture(scope="module")
def lm_export(tmp_path_factory):
    """A tiny byte-level LM (untrained) exported as a decoder, with the lm task's encoding."""
    from xsearch.tasks import get_task

    task = get_task("lm", max_len=MAX_LEN)
    cfg = xsearch.ModelConfig(attention="linear", d_model=32, n_heads=4, n_layers=1, d_ff=48, **task.model_fields())
    torch.manual_seed(0)
    model = xsearch.build_model(cfg).eval()
    path = tmp_path_factory.mktemp("lm") / "lm.onnx"
    to_onnx(model, path, decoder=True, task=task.describe())
    return path, model, task


@pytest.mark.parametrize("name", CAUSAL)
def test_greedy_generation_from_onnx_equals_torch(name, tmp_path):
    model = _lm(name)
    report = to_onnx(model, tmp_path / "lm.onnx", decoder=True)
    assert report.max_abs_diff is not None and report.max_abs_diff < 1e-4
    assert (tmp_path / "lm.onnx").is_file() and (tmp_path / "lm.step.onnx").is_file()
    gen = Generator(tmp_path / "lm.onnx", threads=1)
    prompts = [[3, 1, 4, 1, 5, 9, 2], [2, 7]]  # a batch of two prompt lengths
    want = xsearch.generate(model, prompts, max_new_tokens=TOKENS, temperature=0)
    assert gen.generate(prompts, TOKENS, temperature=0) == want
    assert all(len(w) == TOKENS for w in want)
    # sampling draws the same tokens from either runtime for a seed
    kw = dict(temperature=0.8, top_k=5, seed=7)
    assert gen.generate(prompts[0], TOKENS, **kw) == xsearch.generate(model, prompts[0], max_new_tokens=TOKENS, **kw)


def test_state_names_follow_the_conventions(tmp_path):
    model = _lm("full", layers=[{"attention": "full"}, {"attention": "linear"}], n_layers=2)
    to_onnx(model, tmp_path / "m.onnx", decoder=True)
    step = onnx.load(str(tmp_path / "m.step.onnx"))
    inputs = [i.name for i in step.graph.input]
    outputs = [o.name for o in step.graph.output]
    assert inputs == ["input_ids", "past_length", "past_key_values.0.key", "past_key_values.0.value",
                      "state.0.prompt_length", "state.1.kv", "state.1.z"]  # fmt: skip
    assert outputs == ["logits", "present_length", "present.0.key", "present.0.value", "present_state.0.prompt_length",
                       "present_state.1.kv", "present_state.1.z"]  # fmt: skip
    prefill = onnx.load(str(tmp_path / "m.onnx"))
    assert [i.name for i in prefill.graph.input] == ["input_ids", "attention_mask"]
    # the KV cache's past length and the batch are dynamic
    dims = step.graph.input[2].type.tensor_type.shape.dim
    assert not dims[0].HasField("dim_value") and not dims[2].HasField("dim_value")
    assert dims[1].dim_value == 4 and dims[3].dim_value == 8


def test_dynamic_int8_decoder(lm_export, tmp_path):
    path, _, _ = lm_export
    out = quantize_onnx(path, tmp_path / "q" / "lm.int8.onnx")
    assert out.is_file() and step_path_for(out).is_file()
    for f in (out, step_path_for(out)):
        ops = {n.op_type for n in onnx.load(str(f)).graph.node}
        assert "DynamicQuantizeLinear" in ops or "MatMulInteger" in ops, sorted(ops)
    gen, ref = Generator(out, threads=1), Generator(path, threads=1)
    ids, mask = np.array([[3, 1, 4, 1, 5]], dtype=np.int64), np.ones((1, 5), dtype=bool)
    a, b = gen.prefill(ids, mask)[0], ref.prefill(ids, mask)[0]
    assert np.abs(a - b).max() < 0.1 * np.abs(b).max()  # int8 weights: close, not equal
    assert len(gen.generate([3, 1, 4], 20, temperature=0)) == 20
    with pytest.raises(ValueError, match="step graph"):
        quantize_onnx(step_path_for(path), tmp_path / "x.onnx")
    with pytest.raises(ValueError, match="static-int8"):
        quantize_onnx(path, tmp_path / "s.onnx", "static-int8", calibration=[])


def test_generator_errors(lm_export, tmp_path):
    path, model, _ = lm_export
    to_onnx(model, tmp_path / "enc.onnx")
    with pytest.raises(ValueError, match="not a decoder export"):
        Generator(tmp_path / "enc.onnx")
    gen = Generator(step_path_for(path))  # the step file leads to its prefill file
    assert gen.path == str(path)
    with pytest.raises(ValueError, match="max_len=64"):
        gen.generate([1] * 60, 10)
    with pytest.raises(ValueError, match="vocabulary"):
        gen.generate([1, model.config.vocab_size], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen.generate([1, 2], 0)
    with pytest.raises(ValueError, match="top_k"):
        gen.generate([1, 2], 3, top_k=0)
    with pytest.raises(ValueError, match="causal language model"):
        to_onnx(_lm("full", causal=False, head="classify", n_classes=3), tmp_path / "c.onnx", decoder=True)


def test_stop_token_ends_a_row(tmp_path):
    model = _lm("linear")
    greedy = xsearch.generate(model, [3, 1, 4], max_new_tokens=12, temperature=0)
    stop = greedy[5]
    cut = xsearch.generate(model, [3, 1, 4], max_new_tokens=12, temperature=0, stop=stop)
    assert cut == greedy[: greedy.index(stop)]


def test_generator_imports_no_torch(lm_export):
    path, model, _ = lm_export
    want = xsearch.generate(model, [3, 1, 4], max_new_tokens=10, temperature=0)
    code = (
        "import sys\n"
        "from xsearch.export import Generator\n"
        f"print(Generator({str(path)!r}).generate([3, 1, 4], 10, temperature=0))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == want


# -- the command line and the server ---------------------------------------------------------------
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "xsearch.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_generate_command(lm_export):
    path, model, task = lm_export
    r = _cli("generate", path, "--prompt", "The ", "--max-new-tokens", 8, "--temperature", 0)
    assert r.returncode == 0, r.stderr
    want = task.encoding.decode(xsearch.generate(model, task.encoding.encode("The "), max_new_tokens=8, temperature=0))
    assert r.stdout == want + "\n"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--max-new-tokens", "99"], "max_len"),
        (["--max-new-tokens", "3", "--temperature", "-1"], "--temperature"),
        (["--max-new-tokens", "3", "--top-k", "0"], "--top-k"),
        (["--max-new-tokens", "3", "--prompt", ""], "empty"),
    ],
)
def test_generate_command_bad_arguments(lm_export, args, needle):
    path, _, _ = lm_export
    base = ["--prompt", "The "] if "--prompt" not in args else []
    r = _cli("generate", path, *base, *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert needle in lines[-1] and "Traceback" not in r.stderr


def test_generate_command_missing_file_and_encoder(tmp_path, lm_export):
    r = _cli("generate", tmp_path / "nope.onnx", "--prompt", "x", "--max-new-tokens", 2)
    assert r.returncode == 2 and "nope.onnx" in r.stderr and "Traceback" not in r.stderr
    _, model, _ = lm_export
    to_onnx(model, tmp_path / "enc.onnx")
    r = _cli("generate", tmp_path / "enc.onnx", "--prompt", "x", "--max-new-tokens", 2)
    assert r.returncode == 2 and "not a decoder export" in r.stderr and "Traceback" not in r.stderr


def test_post_generate_and_its_limits(lm_export):
    import http.client

    from xsearch.export.serve import Server, ServeSettings

    path, model, task = lm_export

    def call(body):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            conn.request("POST", "/generate", body=json.dumps(body).encode())
            r = conn.getresponse()
            return r.status, json.loads(r.read())
        finally:
            conn.close()

    with Server(path, ServeSettings(port=0, max_prompt_tokens=16, max_new_tokens=8)) as server:
        status, body = call({"prompt": "The ", "max_new_tokens": 6, "temperature": 0})
        assert status == 200, body
        want = xsearch.generate(model, task.encoding.encode("The "), max_new_tokens=6, temperature=0)
        assert body["token_ids"] == want and body["text"] == task.encoding.decode(want)
        status, body = call({"prompt": [5, 6, 7], "max_new_tokens": 3, "seed": 1})
        assert status == 200 and len(body["token_ids"]) <= 3
        for bad, needle in [
            ({"prompt": "x" * 17, "max_new_tokens": 2}, "limit of 16"),
            ({"prompt": "x", "max_new_tokens": 9}, "limit of 8"),
            ({"prompt": "x", "max_new_tokens": 0}, "max_new_tokens"),
            ({"prompt": "x"}, "missing key 'max_new_tokens'"),
            ({"prompt": 5, "max_new_tokens": 2}, "'prompt'"),
            ({"prompt": [1, 999], "max_new_tokens": 2}, "vocabulary"),
            ({"prompt": "x", "max_new_tokens": 2, "top_k": "5"}, "top_k"),
            ({"prompt": "x", "max_new_tokens": 2, "beam": 4}, "unknown key 'beam'"),
            ([1, 2], "expected"),
        ]:
            status, body = call(bad)
            assert status == 400 and needle in body["error"], (bad, status, body)
