import dataclasses

import pytest

import xsearch


def test_list_and_spec():
    names = xsearch.list_attentions()
    assert names == sorted(names)
    assert {"full", "local", "sparse", "linformer", "performer", "linear"} <= set(names)
    causal = xsearch.list_attentions(causal=True)
    assert "linformer" not in causal and "full" in causal
    assert set(causal) < set(names)
    spec = xsearch.attention_spec("linformer")
    assert isinstance(spec, xsearch.AttentionSpec)
    assert spec.family == ("LR",) and spec.params["k"] == 256 and spec.causal is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "x"


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown attention 'nope'.*linformer"):
        xsearch.build_attention("nope", 32, 4)
    with pytest.raises(ValueError, match="nope"):
        xsearch.attention_spec("nope")


def test_bad_parameters():
    with pytest.raises(ValueError, match="'block_size'"):
        xsearch.build_attention("local", 32, 4, block_size=0)
    with pytest.raises(ValueError, match="'block_size' must be int"):
        xsearch.build_attention("local", 32, 4, block_size="8")
    with pytest.raises(ValueError, match="'bogus'"):
        xsearch.build_attention("local", 32, 4, bogus=1)
    with pytest.raises(ValueError, match="cannot be causal"):
        xsearch.build_attention("linformer", 32, 4, causal=True, max_len=64)
    with pytest.raises(ValueError, match="max_len"):
        xsearch.build_attention("linformer", 32, 4)
    with pytest.raises(ValueError, match="divisible"):
        xsearch.build_attention("full", 30, 4)


def test_import_xsearch_is_light():
    import subprocess
    import sys

    code = "import sys, xsearch, xsearch.tasks.encoding; assert 'torch' not in sys.modules, 'torch loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_zoo_holds_the_survey_models():
    names = xsearch.list_attentions()
    assert len(names) == 19
    assert len(xsearch.list_attentions(causal=True)) == 15
    for name in ("linformer", "bigbird", "etc", "set"):
        assert not xsearch.attention_spec(name).causal
        with pytest.raises(ValueError, match="cannot be causal"):
            xsearch.build_attention(name, 32, 4, causal=True, max_len=64)
