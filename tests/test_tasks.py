import collections
import json
import random
import statistics

import pytest
import torch

from xsearch.errors import MissingPathError, XSearchError
from xsearch.jsonl import read_jsonl
from xsearch.tasks import check_task_options, get_task, listops, listops_samples
from xsearch.tasks.base import Task
from xsearch.tasks.encoding import BYTES
from xsearch.tasks.listops import evaluate_expression, listops_samples_and_draws


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Each test its own task cache (none shared with the user's or another test's)."""
    monkeypatch.setenv("XSEARCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("XSEARCH_NO_TASK_CACHE", raising=False)


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


def test_batches_by_length_hold_the_same_examples_with_less_padding():
    t = get_task("listops", n_train=10, n_valid=50, n_test=10, min_len=16, max_len=64, seed=2)

    def examples(batches):
        return [(tuple(row[m].tolist()), int(y)) for ids, mask, ys in batches for row, m, y in zip(ids, mask, ys)]

    def padded_tokens(batches):
        return sum(ids.numel() for ids, _, _ in batches)

    plain, sorted_ = list(t.batches("valid", 8)), list(t.batches("valid", 8, by_length=True))
    assert sorted(examples(plain)) == sorted(examples(sorted_))  # the same examples with their labels
    lengths = [len(x) for x, _ in examples(sorted_)]
    assert lengths == sorted(lengths) and padded_tokens(sorted_) < padded_tokens(plain)
    # with max_batches, the same examples are chosen as without sorting
    first = list(t.batches("valid", 8, max_batches=2))
    assert sorted(examples(first)) == sorted(examples(t.batches("valid", 8, max_batches=2, by_length=True)))


@pytest.mark.parametrize("kind", ["listops", "lm"])
def test_batches_skip_passes_over_the_first_batches(kind):
    t = get_task(kind, max_len=32) if kind == "lm" else get_task("listops", n_train=10, n_valid=50, n_test=10,
                                                                 min_len=16, max_len=64, seed=2)  # fmt: skip
    for shuffle in (False, True):
        whole = list(t.batches("valid", 8, shuffle=shuffle, seed=4, max_batches=5))
        later = list(t.batches("valid", 8, shuffle=shuffle, seed=4, max_batches=2, skip=3))
        assert len(later) == 2
        for got, expected in zip(later, whole[3:], strict=True):
            assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    with pytest.raises(ValueError, match="skip must be >= 0, got -1"):
        next(t.batches("valid", 8, skip=-1))
    with pytest.raises(ValueError, match="skip=2 with by_length"):
        next(t.batches("valid", 8, skip=2, by_length=True))


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


# -- the ListOps generator ---------------------------------------------------------------
def node_depths(tokens):
    """Depth of every node (root 1) and the argument count of every operator, from the tokens alone."""
    depths, args, stack = [], [], []
    for tok in tokens:
        if tok == "]":
            args.append(stack.pop())
            continue
        depths.append(len(stack) + 1)
        if stack:
            stack[-1] += 1
        if tok.startswith("["):
            stack.append(0)
    assert not stack
    return depths, args


@pytest.mark.parametrize(
    "min_len, max_len, max_depth, max_args",
    [(64, 64, 10, 10), (8, 200, 10, 10), (40, 120, 4, 5), (10, 26, 3, 4), (7, 40, 6, 2)],
)
def test_listops_generator_lengths_labels_and_limits(min_len, max_len, max_depth, max_args):
    n = 300
    samples, draws = listops_samples_and_draws(
        n, seed=11, min_len=min_len, max_len=max_len, max_depth=max_depth, max_args=max_args
    )
    assert len(samples) == n and draws <= n + n // 20  # one draw per expression, bar a few duplicates
    texts = [t for t, _ in samples]
    assert len(set(texts)) == n
    deepest, lengths = 0, collections.Counter()
    for text, label in samples:
        toks = text.split()
        lengths[len(toks)] += 1
        assert min_len <= len(toks) <= max_len
        assert toks[0].startswith("[")  # the root is an operator
        assert label == evaluate_expression(text) == reference_value(toks)
        depths, args = node_depths(toks)
        assert max(depths) <= max_depth and all(2 <= a <= max_args for a in args)
        deepest = max(deepest, max(depths))
    if min_len == max_len:
        assert set(lengths) == {min_len}
    assert deepest == max_depth  # deep nesting happens, down to the limit
    again, _ = listops_samples_and_draws(
        n, seed=11, min_len=min_len, max_len=max_len, max_depth=max_depth, max_args=max_args
    )
    assert again == samples


def test_listops_generator_covers_the_length_range_evenly():
    samples, _ = listops_samples_and_draws(2000, seed=0, min_len=64, max_len=256)
    lengths = [len(t.split()) for t, _ in samples]
    quarters = collections.Counter((n - 64) * 4 // 193 for n in lengths)
    assert min(lengths) == 64 and max(lengths) == 256
    assert all(400 <= quarters[q] <= 600 for q in range(4))  # target lengths are uniform
    # operators take a mix of digit and operator arguments (LRA's process: about 1 in 6 is an operator)
    operators = mixed = operator_args = all_args = 0
    for text, _ in samples:
        stack = []
        for tok in text.split():
            if tok == "]":
                digits, ops = stack.pop()
                operators += 1
                mixed += digits > 0 and ops > 0
                operator_args += ops
                all_args += digits + ops
                if stack:
                    stack[-1][1] += 1
            elif tok.startswith("["):
                stack.append([0, 0])
            else:
                stack[-1][0] += 1
    assert 0.4 < mixed / operators < 0.7 and 0.1 < operator_args / all_args < 0.25
    labels = collections.Counter(label for _, label in samples)
    assert set(labels) == set(range(10)) and max(labels.values()) / len(samples) < 0.25


def lra_shapes(depth, length, max_depth, max_args):
    """Every shape ('d' for a digit) of a subtree of ``length`` tokens and its probability under LRA's process."""
    out = []
    if length == 1:
        out.append(("d", 1.0 if depth == max_depth else 0.75))
    if depth < max_depth and length >= 4:
        for k in range(2, max_args + 1):

            def compositions(rest, parts):
                if parts == 0:
                    if rest == 0:
                        yield []
                    return
                for first in range(1, rest + 1):
                    for tail in compositions(rest - first, parts - 1):
                        yield [first, *tail]

            for sizes in compositions(length - 2, k):
                seqs = [([], 1.0)]
                for size in sizes:
                    seqs = [
                        (s + [t], w * v) for s, w in seqs for t, v in lra_shapes(depth + 1, size, max_depth, max_args)
                    ]
                out += [(f"[ {' '.join(s)} ]", w * 0.25 / (max_args - 1)) for s, w in seqs]
    return out


def test_listops_generator_draws_lra_process_conditioned_on_length():
    exact = collections.Counter()
    for shape, weight in lra_shapes(1, 12, 4, 3):
        exact[shape] += weight
    total = sum(exact.values())
    n = 3000
    samples = listops_samples(n, seed=0, min_len=12, max_len=12, max_depth=4, max_args=3)
    seen = collections.Counter(
        " ".join("d" if t.isdigit() else "[" if t.startswith("[") else "]" for t in text.split()) for text, _ in samples
    )
    assert set(seen) <= set(exact) and len(exact) == 28
    tv = sum(abs(exact[s] / total - seen[s] / n) for s in set(exact) | set(seen)) / 2
    assert tv < 0.06


def test_listops_generator_rejects_unrealisable_lengths():
    with pytest.raises(XSearchError, match="'max_len' must be >= 4, got 3"):
        listops_samples(3, min_len=1, max_len=3)
    with pytest.raises(XSearchError, match="'max_depth' must be >= 2, got 1"):
        listops_samples(3, max_depth=1)
    with pytest.raises(XSearchError, match=r"min_len=30, max_len=20"):
        listops_samples(3, min_len=30, max_len=20)
    with pytest.raises(XSearchError, match=r"\[30, 40\].*max_depth=3.*max_args=4.*longest has 26"):
        listops_samples(3, min_len=30, max_len=40, max_depth=3, max_args=4)
    with pytest.raises(XSearchError, match=r"\[65, 65\].*max_args=2"):  # two arguments: lengths 1 mod 3 only
        listops_samples(3, min_len=65, max_len=65, max_args=2)
    with pytest.raises(XSearchError, match="distinct"):  # 400 expressions of 4 tokens exist
        listops_samples(401, min_len=4, max_len=4)
    assert len(listops_samples(400, min_len=4, max_len=4)) == 400


def test_listops_min_len_scales_with_max_len():
    t = get_task("listops", max_len=64, n_train=30, n_valid=5, n_test=5)
    assert t.options["min_len"] == 16 and t.options["max_len"] == 64
    lengths = [int(m.sum()) for split in ("train", "valid", "test") for _, m, _ in t.batches(split, 64) for m in m]
    assert min(lengths) >= 16 and max(lengths) <= 64 and len(lengths) == 40
    assert check_task_options("listops", {})["min_len"] == 64  # 256 / 4, today's pair
    assert check_task_options("listops", {"preset": "lra"})["min_len"] == 500  # LRA's 500 / 2000
    lra = check_task_options("listops", {"preset": "lra", "max_len": 1000, "n_train": 10})
    assert (lra["min_len"], lra["max_len"], lra["n_train"], lra["n_test"]) == (250, 1000, 10, 2000)
    assert check_task_options("listops", {"max_len": 8})["min_len"] == 4  # never below the shortest
    assert check_task_options("listops", {"max_len": 64, "min_len": 60})["min_len"] == 60


# -- options checked before any work ---------------------------------------------------
@pytest.fixture
def no_generation(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("generated data")

    from xsearch.tasks import pathfinder

    monkeypatch.setattr(listops, "listops_samples", boom)
    monkeypatch.setattr(listops, "listops_samples_and_draws", boom)
    monkeypatch.setattr(pathfinder, "pathfinder_samples", boom)


@pytest.mark.parametrize(
    "name, options, pattern",
    [
        ("imagenet", {}, r"unknown task 'imagenet'.*listops"),
        ("listops", {"bogus": 1}, r"no option 'bogus' \(valid: .*max_len.*n_train"),
        ("listops", {"n_train": "64"}, r"'n_train' must be an integer, got '64'"),
        ("listops", {"n_train": True}, r"'n_train' must be an integer, got True"),
        ("listops", {"max_len": 64.0}, r"'max_len' must be an integer, got 64.0"),
        ("listops", {"n_train": 0}, r"task 'listops': option 'n_train' must be >= 1, got 0"),
        ("listops", {"max_len": 3}, r"'max_len' must be >= 4, got 3"),
        ("listops", {"max_depth": 1}, r"'max_depth' must be >= 2, got 1"),
        ("listops", {"preset": "lrb"}, r"'preset' must be one of lra, got 'lrb'"),
        ("listops", {"min_len": 80, "max_len": 64}, r"min_len=80, max_len=64"),
        ("listops", {"min_len": 30, "max_len": 40, "max_depth": 3, "max_args": 4}, r"\[30, 40\].*max_depth=3"),
        ("pathfinder", {"size": 8}, r"'size' must be >= 16, got 8"),
        ("pathfinder", {"curvature": "0.3"}, r"'curvature' must be a number, got '0.3'"),
        ("pathfinder", {"curvature": float("nan")}, r"'curvature' must be >= 0, got nan"),
        ("text", {}, r"needs data=PATH"),
        ("text", {"data": 3}, r"'data' must be a string, got 3"),
        ("text", {"data": "x.jsonl", "valid_fraction": 1.0}, r"'valid_fraction' must be < 1, got 1.0"),
        (
            "text",
            {"data": "x.jsonl", "valid_fraction": 0.5, "test_fraction": 0.5},
            r"option 'valid_fraction' \+ option 'test_fraction' must be < 1",
        ),
        ("text", {"data": "a.jsonl", "train": "b.jsonl"}, r"not both"),
        ("lm", {"valid_fraction": 0}, r"'valid_fraction' must be > 0, got 0"),
        ("lm", {"max_len": -1}, r"'max_len' must be >= 1, got -1"),
    ],
)
def test_check_task_options_names_the_bad_value(name, options, pattern, no_generation):
    with pytest.raises(XSearchError, match=pattern):
        check_task_options(name, options)
    with pytest.raises(XSearchError, match=pattern):  # get_task fails the same way, before any work
        get_task(name, **options)


def test_check_task_options_names_a_missing_file(tmp_path, no_generation):
    missing = tmp_path / "nowhere" / "reviews.jsonl"
    for name, options in (("text", {"data": missing}), ("text", {"train": str(missing)}), ("lm", {"path": missing})):
        with pytest.raises(MissingPathError, match=str(missing)) as e:
            check_task_options(name, options)
        assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, ValueError)
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"text": "a", "label": "x"}\n')
    with pytest.raises(MissingPathError, match="test.jsonl"):
        check_task_options("text", {"train": ok, "test": tmp_path / "test.jsonl"})
    with pytest.raises(MissingPathError, match="not a file"):
        check_task_options("lm", {"path": tmp_path})


def test_check_task_options_resolves_without_generating(tmp_path, no_generation):
    opts = check_task_options("listops", {"max_len": 128, "seed": 3})
    assert opts == {"n_train": 2000, "n_valid": 200, "n_test": 200, "min_len": 32, "max_len": 128,
                    "max_depth": 10, "max_args": 10, "seed": 3}  # fmt: skip
    assert check_task_options("listops", opts) == opts  # resolved options resolve to themselves
    pf = check_task_options("pathfinder", {"size": 48, "curvature": 1})
    assert pf["path_len"] == 33 and pf["curvature"] == 1.0 and isinstance(pf["curvature"], float)
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a", "label": "x"}\n')
    assert check_task_options("text", {"data": data})["data"] == str(data)  # a Path is kept as its string
    assert check_task_options("lm", {})["path"] is None
    import numpy as np

    assert check_task_options("listops", {"n_train": np.int64(5)})["n_train"] == 5


# -- chance level ------------------------------------------------------------------------
def test_chance_is_the_majority_share_of_the_split():
    t = get_task("listops", n_train=60, n_valid=30, n_test=25, min_len=8, max_len=32, max_depth=4, seed=5)
    for split in ("train", "valid", "test"):
        labels = [int(y) for _, _, ys in t.batches(split, 16) for y in ys]
        assert t.chance(split) == max(labels.count(c) for c in range(10)) / len(labels)
    with pytest.raises(XSearchError, match="split"):
        t.chance("dev")


def test_the_loss_chance_is_the_entropy_of_the_splits_label_frequencies():
    t = get_task("listops", n_train=60, n_valid=30, n_test=25, min_len=8, max_len=32, max_depth=4, seed=5)
    for split in ("valid", "test"):
        labels = torch.tensor([int(y) for _, _, ys in t.batches(split, 16) for y in ys])
        prior = torch.bincount(labels, minlength=10).double() / len(labels)
        # the cross-entropy of always answering the split's label frequencies, which no constant answer beats
        always = torch.nn.functional.cross_entropy(prior.clamp_min(1e-12).log().expand(len(labels), 10), labels)
        assert t.loss_chance(split) == pytest.approx(always.item(), rel=1e-9)
        other = torch.full((len(labels), 10), 0.1).log()  # uniform: no better
        assert t.loss_chance(split) <= torch.nn.functional.cross_entropy(other, labels).item()


def test_chance_of_a_text_task(tmp_path):
    tr, te = tmp_path / "tr.jsonl", tmp_path / "te.jsonl"
    tr.write_text("".join(json.dumps({"text": f"t{i}", "label": "a" if i % 4 else "b"}) + "\n" for i in range(20)))
    te.write_text("".join(json.dumps({"text": f"u{i}", "label": lb}) + "\n" for i, lb in enumerate("bbbab")))
    t = get_task("text", train=tr, test=te, valid_fraction=0.2)
    assert t.chance("test") == 0.8  # 'b' is the test split's majority, though 'a' is train's
    train = [t.label_names[int(y)] for _, _, ys in t.batches("train", 8) for y in ys]
    assert len(train) == 16 and t.chance("train") == train.count("a") / 16


def test_chance_of_lm_is_unigram_bits_per_byte(tmp_path):
    rng = random.Random(0)
    stream = torch.tensor([rng.randrange(256) + 1 for _ in range(200_000)])
    t = Task("lm", "lm", BYTES, 64, data={"train": stream[:150_000], "valid": stream[150_000:175_000],
                                          "test": stream[175_000:]})  # fmt: skip
    assert abs(t.chance("test") - 8.0) < 0.02 and abs(t.chance("train") - 8.0) < 0.01
    p = tmp_path / "sixty-four.txt"
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
    p.write_text("".join(rng.choice(alphabet) for _ in range(100_000)))
    lm = get_task("lm", path=p, max_len=32)
    assert abs(lm.chance("valid") - 6.0) < 0.05
    one = tmp_path / "one.txt"  # a single byte value: the smoothed model is nearly sure of it
    one.write_text("a" * 10_000)
    assert get_task("lm", path=one, max_len=32).chance("test") < 0.05


# -- JSONL that tells the truth ----------------------------------------------------------
@pytest.mark.parametrize(
    "label, shown", [(None, "null"), (["a"], r'\["a"\]'), (True, "true"), ({"x": 1}, r'\{"x": 1\}'), (1.5, "1.5")]
)
def test_text_labels_must_be_strings_or_integers(tmp_path, label, shown):
    p = tmp_path / "reviews.jsonl"
    lines = [json.dumps({"text": f"t{i}", "label": "pos" if i % 2 else "neg"}) for i in range(6)]
    lines.append(json.dumps({"text": "t6", "label": label}))
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(XSearchError, match=rf"reviews.jsonl:7: 'label' must be a string or an integer, got {shown}$"):
        get_task("text", data=p)


def test_text_integer_labels_become_strings(tmp_path):
    p = tmp_path / "ints.jsonl"
    p.write_text("".join(json.dumps({"text": f"t{i}", "label": i % 3}) + "\n" for i in range(30)))
    t = get_task("text", data=p)
    assert t.label_names == ["0", "1", "2"]


def test_non_utf8_jsonl_names_file_and_line(tmp_path):
    p = tmp_path / "latin.jsonl"
    p.write_bytes(b'{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n{"text": "caf\xe9", "label": "x"}\n')
    with pytest.raises(XSearchError, match=r"latin.jsonl:3: not UTF-8 \(byte 0xe9"):
        get_task("text", data=p)
    rows = read_jsonl(p)
    assert next(rows) == (1, {"text": "a", "label": "x"})
    assert next(rows) == (2, {"text": "b", "label": "y"})
    with pytest.raises(XSearchError, match="latin.jsonl:3"):
        next(rows)


def test_read_jsonl_lines_bom_and_missing_file(tmp_path):
    p = tmp_path / "rows.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n\n  \n{"b": "\xe2\x80\xa8"}\n')  # BOM, CRLF, blanks, U+2028 in a string
    assert list(read_jsonl(p)) == [(1, {"a": 1}), (4, {"b": "\u2028"})]
    with pytest.raises(MissingPathError, match="no such file"):
        read_jsonl(tmp_path / "none.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n[1, 2\n')
    with pytest.raises(XSearchError, match=r"bad.jsonl:2: malformed JSON"):
        list(read_jsonl(bad))
