import numpy as np
import pytest

from xsearch.tasks import cache, get_task, listops, pathfinder

OPTS = {"n_train": 40, "n_valid": 10, "n_test": 10, "max_len": 48, "max_depth": 5, "seed": 1}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XSEARCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("XSEARCH_NO_TASK_CACHE", raising=False)
    return tmp_path / "tasks"


def boom(*args, **kwargs):
    raise AssertionError("generated again")


def files(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_second_build_reads_the_cache(cache_dir, monkeypatch):
    first = get_task("listops", **OPTS)
    (name,) = files(cache_dir)
    assert name.startswith("listops-") and name.endswith(".npz")
    real = listops.listops_samples
    monkeypatch.setattr(listops, "listops_samples", boom)
    second = get_task("listops", **OPTS)
    assert second.data == first.data and second.options == first.options
    assert get_task("listops", **OPTS, min_len=12).data == first.data  # the default spelled out: the same task
    for changed in ({"seed": 2}, {"max_args": 4}, {"n_test": 11}):  # changed options miss
        with pytest.raises(AssertionError, match="generated again"):
            get_task("listops", **{**OPTS, **changed})
    calls = []
    monkeypatch.setattr(listops, "listops_samples", lambda *a, **k: calls.append(1) or real(*a, **k))
    get_task("listops", **{**OPTS, "seed": 2})
    get_task("listops", **{**OPTS, "seed": 2})
    assert len(calls) == 1 and len(files(cache_dir)) == 2


def test_file_layout_without_pickle(cache_dir):
    t = get_task("listops", **OPTS)
    (path,) = cache_dir.iterdir()
    with np.load(path, allow_pickle=False) as f:
        assert f["train_tokens"].dtype == np.uint8 and f["train_labels"].dtype == np.uint8
        assert f["train_offsets"][0] == 0 and len(f["test_offsets"]) == 11
        seqs, labels = t.data["valid"]
        flat, offsets = f["valid_tokens"], f["valid_offsets"]
        assert [flat[a:b].tolist() for a, b in zip(offsets, offsets[1:])] == seqs
        assert f["valid_labels"].tolist() == labels


def test_cached_and_uncached_builds_agree(cache_dir, monkeypatch):
    cached_once = get_task("listops", **OPTS)
    cached_twice = get_task("listops", **OPTS)
    monkeypatch.setenv("XSEARCH_NO_TASK_CACHE", "1")
    before = files(cache_dir)
    uncached = get_task("listops", **{**OPTS, "seed": 9})
    assert files(cache_dir) == before  # nothing written
    uncached = get_task("listops", **OPTS)
    assert cached_once.data == cached_twice.data == uncached.data


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "foreign", "bad offsets"])
def test_a_damaged_file_is_rebuilt_and_rewritten(cache_dir, damage, monkeypatch):
    good = get_task("listops", **OPTS)
    (path,) = cache_dir.iterdir()
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"not a zip file at all")
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "foreign":  # a whole file of other options under this name
        other = cache.cache_path("listops", {**good.options, "seed": 5}, listops.GENERATOR_VERSION)
        get_task("listops", **{**OPTS, "seed": 5})
        path.write_bytes(other.read_bytes())
    else:
        with np.load(path) as f:
            arrays = dict(f)
        arrays["train_offsets"] = arrays["train_offsets"][::-1].copy()
        with path.open("wb") as f:
            np.savez(f, **arrays)
    rebuilt = get_task("listops", **OPTS)
    assert rebuilt.data == good.data
    assert cache.load(path, cache._meta("listops", good.options, listops.GENERATOR_VERSION)) == good.data
    assert not [n for n in files(cache_dir) if n.endswith(".tmp")]


def test_pathfinder_is_cached(cache_dir, monkeypatch):
    opts = {"n_train": 4, "n_valid": 2, "n_test": 2, "seed": 3}
    first = get_task("pathfinder", **opts)
    (path,) = cache_dir.iterdir()
    with np.load(path, allow_pickle=False) as f:
        assert f["train_tokens"].dtype == np.uint16  # ids up to 256
    monkeypatch.setattr(pathfinder, "pathfinder_samples", boom)
    second = get_task("pathfinder", **opts, path_len=22)  # the default, spelled out
    assert second.data == first.data and second.max_len == 1024


def test_an_unwritable_cache_only_warns(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XSEARCH_CACHE_DIR", str(blocker))
    t = get_task("listops", **OPTS)
    assert t.size("train") == 40 and "could not write" in caplog.text


def test_text_and_lm_tasks_are_not_cached(cache_dir, tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("".join(f'{{"text": "t{i}", "label": "{i % 2}"}}\n' for i in range(20)))
    get_task("text", data=p)
    get_task("lm", max_len=32)
    assert files(cache_dir) == []
