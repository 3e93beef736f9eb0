from collections import deque

import numpy as np
import pytest

from xsearch.errors import XSearchError
from xsearch.tasks import check_task_options, get_task
from xsearch.tasks.pathfinder import LINK, MARKER, pathfinder_samples


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XSEARCH_CACHE_DIR", str(tmp_path / "cache"))


def components(points: set, radius: int) -> list[set]:
    """Groups of points joined by steps of Chebyshev length <= radius (a plain BFS)."""
    left, out = set(points), []
    while left:
        start = left.pop()
        comp, todo = {start}, deque([start])
        while todo:
            y, x = todo.popleft()
            for dy in range(-radius, radius + 1):
                for dx in range(-radius, radius + 1):
                    q = (y + dy, x + dx)
                    if q in left:
                        left.remove(q)
                        comp.add(q)
                        todo.append(q)
        out.append(comp)
    return out


def markers_connected(img: np.ndarray) -> bool:
    marks = components({tuple(p) for p in np.argwhere(img == MARKER)}, 1)
    assert len(marks) == 2, "exactly two markers"
    ink = {tuple(p) for p in np.argwhere(img > 0)}
    for comp in components(ink, LINK):
        if marks[0] <= comp:
            return marks[1] <= comp
    raise AssertionError("marker not on ink")


def test_labels_agree_with_flood_fill():
    samples = pathfinder_samples(120, seed=5)
    for img, label in samples:
        assert img.shape == (32, 32) and img.dtype == np.uint8
        assert markers_connected(img) == bool(label)
    labels = [label for _, label in samples]
    assert 40 <= sum(labels) <= 80  # roughly balanced


def test_deterministic_by_seed_and_sizes():
    a = pathfinder_samples(6, seed=1)
    b = pathfinder_samples(6, seed=1)
    assert all(np.array_equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b))
    assert not all(np.array_equal(x[0], y[0]) for x, y in zip(a, pathfinder_samples(6, seed=2)))
    for img, label in pathfinder_samples(10, seed=3, size=48):
        assert img.shape == (48, 48) and markers_connected(img) == bool(label)
    with pytest.raises(XSearchError, match="n_paths"):
        pathfinder_samples(2, n_paths=1)


def test_pathfinder_task_tokens():
    t = get_task("pathfinder", n_train=8, n_valid=4, n_test=4)
    assert t.max_len == 1024 and t.n_classes == 2 and t.encoding.vocab_size == 257
    ids, mask, labels = next(t.batches("train", 8))
    assert ids.shape == (8, 1024) and mask.all() and ids.min() >= 1 and ids.max() <= 256


def test_pathfinder_options():
    opts = check_task_options("pathfinder", {"size": 20})
    assert opts == {"n_train": 2000, "n_valid": 200, "n_test": 200, "size": 20, "n_paths": 3, "path_len": 14,
                    "curvature": 0.3, "seed": 0}  # fmt: skip
    for bad, pattern in (({"n_paths": 1}, "'n_paths' must be >= 2, got 1"),
                         ({"path_len": 2}, "'path_len' must be >= 4, got 2"),
                         ({"curvature": -0.1}, "'curvature' must be >= 0, got -0.1")):  # fmt: skip
        with pytest.raises(XSearchError, match=pattern):
            get_task("pathfinder", **bad)
