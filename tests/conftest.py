import pytest
import torch

import xsearch

D_MODEL, N_HEADS, MAX_LEN = 32, 4, 64


def small_attention(name: str, *, causal: bool = False, max_len: int = MAX_LEN, **overrides):
    """A small instance of variant ``name`` with its spec's ``small_params``."""
    params = {**xsearch.attention_spec(name).small_params, **overrides}
    return xsearch.build_attention(name, D_MODEL, N_HEADS, causal=causal, max_len=max_len, **params)


def modes():
    """(name, causal) for every registered variant and each mode it supports."""
    out = []
    for name in xsearch.list_attentions():
        out.append(pytest.param(name, False, id=f"{name}"))
        if xsearch.attention_spec(name).causal:
            out.append(pytest.param(name, True, id=f"{name}-causal"))
    return out


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
