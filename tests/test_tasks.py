import json
import statistics

import pytest
import torch

from xsearch.tasks import get_task, listops_samples
from xsearch.tasks.listops import evaluate_expression


def reference_value(tokens):
    """An independent ListOps evaluator: parse into a tree recursively, then fold."""

    def parse(i):
        tok = tokens[i]
        if tok.isdigit():
            return int(tok), i + 1
        op, args, i = tok[1:], [], i + 1
        while tokens[i] != "]":
            value, i = parse(i)
            args.append(value)
        fold = {
            "MIN": min,
            "MAX": max,
            "SM": lambda a: sum(a) % 10,
            "MED": lambda a: int(statistics.median(a)),
        }[op]
        return fold(args), i + 1

    value, end = parse(0)
    assert end == len(tokens)
    return value


def test_listops_labels_match_an_independent_evaluator():
    samples = listops_samples(300, seed=3, min_len=8, max_len=200)
    for text, label in samples:
        assert label == reference_value(text.split()) == evaluate_expression(text)
    assert len({label for _, label in samples}) == 10


def test_listops_evaluator_examples():
    assert evaluate_expression("[MAX 2 9 [MIN 4 7 ] 0 ]") == 9
    assert evaluate_expression("[MED 1 2 3 4 ]") == 2  # median 2.5 truncated
    assert evaluate_expression("[SM 9 9 [MIN 5 6 ] ]") == 3
    for bad in ("[MAX 2 9", "[MAX ]", "2 ]", "[FOO 1 2 ]"):
        with pytest.raises(ValueError):
            evaluate_expression(bad)


def test_listops_generator_contract():
    a = listops_samples(50, seed=7, min_len=20, max_len=120, max_depth=6, max_args=5)
    assert a == listops_samples(50, seed=7, min_len=20, max_len=120, max_depth=6, max_args=5)
    assert a != listops_samples(50, seed=8, min_len=20, max_len=120, max_depth=6, max_args=5)
    texts = [t for t, _ in a]
    assert len(set(texts)) == len(texts)
    for t in texts:
        toks = t.split()
        assert 20 <= len(toks) <= 120
        assert toks[0].startswith("[") and toks[-1] == "]"
        depth = max_depth = 0
        for tok in toks:
            depth += tok.startswith("[")
            depth -= tok == "]"
            max_depth = max(max_depth, depth)
        assert max_depth <= 6
        # no operator takes more than max_args arguments
        stack = []
        for tok in toks:
            if tok.startswith("["):
                stack.append(0)
            elif tok == "]":
                n = stack.pop()
                assert 2 <= n <= 5
                if stack:
                    stack[-1] += 1
            else:
                stack[-1] += 1
    with pytest.raises(ValueError, match="max_len"):
        listops_samples(3, max_len=3, min_len=1)


def test_listops_task_splits_and_batches():
    t = get_task("listops", n_train=40, n_valid=10, n_test=10, min_len=16, max_len=64, seed=1)
    assert t.size("train") == 40 and t.n_classes == 10
    seen = set()
    for split in ("train", "valid", "test"):
        for ids, mask, _labels in t.batches(split, 16):
            assert ids.dtype == torch.long and mask.dtype == torch.bool and ids.shape == mask.shape
            assert ((ids != 0) == mask).all() and ids.shape[1] <= 64
            for row, m in zip(ids, mask):
                seen.add(tuple(row[m].tolist()))
    assert len(seen) == 60  # no example shared between splits
    assert t.model_fields() == {"vocab_size": 16, "max_len": 64, "head": "classify", "n_classes": 10}
    with pytest.raises(ValueError, match="bogus"):
        get_task("listops", bogus=1)
    with pytest.raises(ValueError, match="unknown task"):
        get_task("imagenet")


def test_text_task_from_jsonl(tmp_path):
    rows = [{"text": f"good {i} ünïcode", "label": "pos"} for i in range(20)]
    rows += [{"text": f"bad {i}", "label": "neg"} for i in range(20)]
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    t = get_task("text", data=str(p), max_len=12)
    assert t.label_names == ["neg", "pos"] and t.n_classes == 2
    assert sum(t.size(s) for s in ("train", "valid", "test")) == 40
    ids, mask = t.encode(["good"])
    assert ids.tolist() == [[ord(c) + 1 for c in "good"]]
    with pytest.raises(ValueError, match="max_len=12"):
        t.encode(["x" * 13])
    assert t.encode(["x" * 13], truncate=True)[0].shape == (1, 12)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a", "label": 1}\n{oops\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        get_task("text", data=str(bad))
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        get_task("text", data=str(tmp_path / "missing.jsonl"))
    tr = tmp_path / "tr.jsonl"
    tr.write_text("\n".join(json.dumps(r) for r in rows[:15] + rows[20:35]))
    te = tmp_path / "te.jsonl"
    te.write_text(json.dumps({"text": "x", "label": "other"}))
    with pytest.raises(ValueError, match="'other'"):
        get_task("text", train=str(tr), test=str(te))


def test_lm_task_default_corpus_and_windows(tmp_path):
    t = get_task("lm", max_len=64)
    assert t.kind == "lm" and t.size("train") > 100_000
    ids, mask, labels = next(t.batches("valid", 4))
    assert ids.shape == labels.shape == (4, 64) and mask.all()
    assert torch.equal(ids[0, 1:], labels[0, :-1])  # next-byte targets
    assert torch.equal(ids[1, 0], labels[0, -1])  # consecutive windows
    p = tmp_path / "tiny.txt"
    p.write_text("short")
    with pytest.raises(ValueError, match="too short"):
        get_task("lm", path=str(p))
