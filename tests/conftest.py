import os
import tempfile

import pytest
import torch

import xsearch

D_MODEL, N_HEADS, MAX_LEN = 32, 4, 64

# `make test` runs one pytest-xdist worker per core: each worker, and the processes its tests start, gets one
# torch thread, since two processes with two threads each on two cores slow each other far more than twice.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


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


def padded_batch(n: int = 37, batch_left_pad: bool = True):
    """``x (3, n, D)`` and a mask: row 0 full, row 1 right-padded, row 2 padded on both sides."""
    x = torch.randn(3, n, D_MODEL)
    mask = torch.ones(3, n, dtype=torch.bool)
    mask[1, n - 9 :] = False
    mask[2, : n // 2] = False
    if batch_left_pad:
        mask[2, n - 3 :] = False
    return x, mask


def padded_both_ends(n: int, b: int = 2):
    """``x (b, n, D)`` and a mask whose row 1 is padded 4 tokens at the start and 5 at the end."""
    x = torch.randn(b, n, D_MODEL)
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[1, :4] = False
    mask[1, n - 5 :] = False
    return x, mask


def dense_attention(q, k, v, allowed):
    """Reference softmax attention with a dense bool mask (True = may attend)."""
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


def input_dependence(m, x):
    """Bool (N, N): output i changes when input position j is perturbed (one batch entry per j)."""
    n = x.shape[1]
    xs = x.repeat(n + 1, 1, 1)  # the last entry is the unperturbed baseline
    idx = torch.arange(n)
    xs[idx, idx] += 3.0 * torch.randn(n, x.shape[2])
    with torch.no_grad():
        y = m(xs)
    return ((y[:n] - y[n:]).abs().amax(-1) > 1e-5).T  # (query i, perturbed j)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# The suite keeps what it caches (generated tasks, measured latencies, tracebacks) out of the user's
# ~/.cache/xsearch: one folder per session, shared by its tests and the CLI processes they start.
if "XSEARCH_CACHE_DIR" not in os.environ:
    os.environ["XSEARCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="xsearch-test-cache-")
