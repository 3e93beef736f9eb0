"""ListOps (Nangia & Bowman; the Long Range Arena version): nested list operations over digits.

Operators: ``MIN``, ``MAX``, ``MED`` (median, truncated to int), ``SM`` (sum mod 10). An
expression is written as space-separated tokens, e.g. ``"[MAX 2 9 [MIN 4 7 ] 0 ]"``, and its
label (0-9) is its value. Pure Python and numpy (no torch).

The generator draws from LRA's branching process *conditioned on the length*: it draws a target
length uniformly from the lengths in ``[min_len, max_len]`` that an expression can have, then an
expression of exactly that length with the probability LRA's process gives it among those of that
length. LRA's process: the root (depth 1) is an operator; a node at depth ``d < max_depth`` is an
operator with probability 1/4 (else a digit), one at ``max_depth`` is a digit; an operator has
2..``max_args`` arguments (uniform); operators and digits are uniform. So brackets nest at most
``max_depth - 1`` deep. The weights of subtrees by depth and length (a dynamic programme over
convolutions) make every draw land on its target length; only duplicates are drawn again.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import random
from dataclasses import dataclass
from math import comb
from typing import Any, ClassVar

import numpy as np

from xsearch.errors import XSearchError
from xsearch.settings import option
from xsearch.tasks.common import SplitSizes, checked
from xsearch.tasks.encoding import Encoding

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
CLOSE = "]"
DIGITS = tuple(str(d) for d in range(10))
ENCODING = Encoding("tokens", ("<pad>", *OPERATORS, CLOSE, *DIGITS))
BRANCH_P = 0.25  # LRA: probability that a node below max depth is an operator
SHORTEST = 4  # the shortest expression, e.g. "[MIN 1 2 ]"
MIN_LEN_FRACTION = 0.25  # min_len when not given: this share of max_len (LRA: 500 of 2000)
GENERATOR_VERSION = 2  # bump whenever the samples drawn for given options change (it keys the task cache)

#: The answer is decided by the outermost operator, always the first token: the head reads that token's state (Long
#: Range Arena's ListOps models pool their first token too). bench/lra_listops.py measures mean pooling beside it.
MODEL_DEFAULTS = {"pooling": "first"}

LRA_PRESET = {"max_len": 2000, "n_train": 96_000, "n_valid": 2_000, "n_test": 2_000}  # min_len: 500 by the rule


def default_min_len(max_len: int) -> int:
    """``min_len`` when it is not given: a quarter of ``max_len``, at least the shortest expression."""
    return max(SHORTEST, int(max_len * MIN_LEN_FRACTION))


@dataclass
class ListOpsOptions(SplitSizes):
    """The options of the ``listops`` task (and of the generator: the lengths, depth and width)."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {"lra": LRA_PRESET}

    preset: str | None = option(None, "'lra': Long Range Arena's lengths and sizes", choices=("lra",))
    min_len: int | None = option(None, "shortest expression (default: a quarter of max_len)", ge=1)
    max_len: int = option(256, "longest expression, in tokens", ge=SHORTEST)
    max_depth: int = option(10, "depth of the deepest node (a digit); brackets nest max_depth - 1 deep", ge=2)
    max_args: int = option(10, "most arguments of an operator", ge=2)
    seed: int = option(0, "seeds the generator")

    def rules(self) -> None:
        if self.min_len is None:
            self.min_len = default_min_len(self.max_len)
        _lengths_in(self.min_len, self.max_len, self.max_depth, self.max_args)


_DIGIT, _OP, _CLOSE = 0, 1, 2  # an expression's shape, before its symbols are drawn
_MEMO_TOTAL = 160  # splits of up to this many tokens are kept as lists (the many small operators deep down)


def _apply(op: str, args: list[int]) -> int:
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[SM":
        return sum(args) % 10
    ordered = sorted(args)  # [MED: median, truncated toward zero like int(np.median)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return int((ordered[mid - 1] + ordered[mid]) / 2)


def evaluate_expression(expression: str | list[str]) -> int:
    """Value of a ListOps expression (a stack machine over the tokens).

    Raises:
        XSearchError: a malformed expression (unknown token, unbalanced brackets, empty operator).
    """
    tokens = expression.split() if isinstance(expression, str) else list(expression)
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for tok in tokens:
        if tok in OPERATORS:
            stack.append((tok, []))
        elif tok == CLOSE:
            if not stack:
                raise XSearchError(f"unbalanced ']' in ListOps expression {' '.join(tokens)[:80]!r}")
            op, args = stack.pop()
            if not args:
                raise XSearchError(f"operator {op} without arguments")
            value = _apply(op, args)
            if stack:
                stack[-1][1].append(value)
            else:
                result = value
        elif tok in DIGITS:
            if stack:
                stack[-1][1].append(int(tok))
            else:
                result = int(tok)
        else:
            raise XSearchError(f"unknown ListOps token {tok!r}")
    if stack or result is None:
        raise XSearchError(f"incomplete ListOps expression {' '.join(tokens)[:80]!r}")
    return result


def _conv(x: np.ndarray, y: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` terms of the convolution of ``x`` and ``y``, computed over their non-zero spans."""
    out = np.zeros(n)
    nx, ny = np.flatnonzero(x), np.flatnonzero(y)
    if len(nx) == 0 or len(ny) == 0 or nx[0] + ny[0] >= n:
        return out
    xa, ya = int(nx[0]), int(ny[0])
    xb, yb = min(int(nx[-1]), n - 1 - ya), min(int(ny[-1]), n - 1 - xa)
    full = np.convolve(x[xa : xb + 1], y[ya : yb + 1])
    start = xa + ya
    m = min(len(full), n - start)
    out[start : start + m] = full[:m]
    return out


class _Tables:
    """Weights of LRA's process by depth and length (index = length in tokens, up to ``max_len``).

    ``zop[d][L]``: probability that a node at depth ``d`` is an operator subtree of ``L`` tokens.
    ``power[d][m][s]``: the same for ``m`` operator siblings at depth ``d`` of ``s`` tokens in all.
    An operator whose ``k`` arguments sit at depth ``d`` and take ``R`` tokens together has ``j``
    digit arguments with weight ``coef[d][(k, j)] * power[d][k - j][R - j]``.
    """

    def __init__(self, max_len: int, max_depth: int, max_args: int) -> None:
        n = max_len + 1
        op_weight = BRANCH_P / (max_args - 1)  # an operator, and its number of arguments
        max_args = min(max_args, max(max_len - 2, 2))  # more arguments than that never fit
        self.pairs = [(k, j) for k in range(2, max_args + 1) for j in range(k + 1)]
        self.zop: dict[int, np.ndarray] = {max_depth: np.zeros(n)}
        self.power: dict[int, list[np.ndarray]] = {}
        self.coef: dict[int, list[float]] = {}
        for d in range(max_depth, 1, -1):  # argument depth d, their operator at d - 1
            power = [np.zeros(n)]
            power[0][0] = 1.0
            for _ in range(max_args):
                power.append(_conv(power[-1], self.zop[d], n))
            self.power[d] = power
            digit = 1.0 if d == max_depth else 1.0 - BRANCH_P
            self.coef[d] = [comb(k, j) * digit**j for k, j in self.pairs]
            arguments = np.zeros(n)  # weight of the arguments of an operator, by their length
            for (k, j), c in zip(self.pairs, self.coef[d]):
                if j < n:
                    arguments[j:] += c * power[k - j][: n - j]
            self.zop[d - 1] = np.zeros(n)
            self.zop[d - 1][2:] = op_weight * arguments[: n - 2]
        self._rows: dict[tuple[int, int], list[float]] = {}
        self._splits: dict[tuple[int, int, int], list[float]] = {}
        self.lengths = np.flatnonzero(self.zop[1])  # the lengths an expression (root at depth 1) can have

    def expression(self, rng: random.Random, length: int) -> list[str]:
        """An expression of ``length`` tokens: its shape first, then its operators and digits."""
        shape: list[int] = []
        self._operator(rng, 1, length, shape)
        n_ops = shape.count(_OP)
        symbols = {_OP: iter(rng.choices(OPERATORS, k=n_ops)), _DIGIT: iter(rng.choices(DIGITS, k=length - 2 * n_ops))}
        return [CLOSE if s == _CLOSE else next(symbols[s]) for s in shape]

    def _row(self, depth: int, rest: int) -> list[float]:
        """Cumulative weights of the ``pairs`` of an operator whose arguments (at ``depth``) take ``rest`` tokens."""
        key = (depth, rest)
        row = self._rows.get(key)
        if row is None:
            power = self.power[depth]
            weights = (
                c * float(power[k - j][rest - j]) if j <= rest else 0.0
                for (k, j), c in zip(self.pairs, self.coef[depth])
            )
            row = self._rows[key] = list(itertools.accumulate(weights))
        return row

    def _split(self, depth: int, left: int, total: int) -> list[float]:
        """Cumulative weights of the lengths 4, 5, ... of one of ``left + 1`` operators sharing ``total`` tokens."""
        key = (depth, left, total)
        w = self._splits.get(key)
        if w is None:
            zop, power = self.zop[depth], self.power[depth]
            w = (zop[SHORTEST : total - SHORTEST * left + 1] * power[left][SHORTEST * left : total - 3][::-1]).cumsum()
            w = w.tolist()
            if total <= _MEMO_TOTAL:
                self._splits[key] = w
        return w

    def _operator(self, rng: random.Random, depth: int, length: int, out: list[int]) -> None:
        out.append(_OP)
        d, rest = depth + 1, length - 2
        row = self._row(d, rest)
        k, j = self.pairs[bisect.bisect_right(row, rng.random() * row[-1])]
        m = k - j  # operator arguments, sharing rest - j tokens
        if m == 0:
            out.extend([_DIGIT] * k)
            out.append(_CLOSE)
            return
        sizes = []
        total = rest - j
        for left in range(m - 1, 0, -1):  # each but the last: its length given what the others can take
            w = self._split(d, left, total)
            size = SHORTEST + bisect.bisect_right(w, rng.random() * w[-1])
            sizes.append(size)
            total -= size
        sizes.append(total)
        where = [rng.randrange(k)] if m == 1 else sorted(rng.sample(range(k), m))
        at = 0
        for i, size in zip(where, sizes):
            out.extend([_DIGIT] * (i - at))
            self._operator(rng, d, size, out)
            at = i + 1
        out.extend([_DIGIT] * (k - at))
        out.append(_CLOSE)


@functools.lru_cache(maxsize=4)
def _tables(max_len: int, max_depth: int, max_args: int) -> _Tables:
    return _Tables(max_len, max_depth, max_args)


def longest_expression(max_depth: int, max_args: int) -> int:
    """Tokens in the longest expression with these limits (every operator full, down to ``max_depth``)."""
    size = 1
    for _ in range(max_depth - 1):
        size = 2 + max_args * size
    return size


def realisable_lengths(min_len: int | None, max_len: int, max_depth: int = 10, max_args: int = 10) -> list[int]:
    """The lengths in ``[min_len, max_len]`` an expression with these limits can have (non-empty).

    ``min_len=None`` is ``default_min_len(max_len)``.

    Raises:
        XSearchError: a limit outside its declared range (``ListOpsOptions``), or no such length (the
            message names the values).
    """
    o = checked(ListOpsOptions, "listops", {"min_len": min_len, "max_len": max_len, "max_depth": max_depth,
                                            "max_args": max_args})  # fmt: skip
    return _lengths_in(o.min_len, o.max_len, o.max_depth, o.max_args)


def _lengths_in(min_len: int, max_len: int, max_depth: int, max_args: int) -> list[int]:
    if min_len > max_len:
        raise XSearchError(f"task 'listops': need min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    lengths = _tables(max_len, max_depth, max_args).lengths
    inside = [int(n) for n in lengths if n >= min_len]
    if inside:
        return inside
    longest = longest_expression(max_depth, max_args)
    why = f"the longest has {longest} tokens" if longest < min_len else f"the longest up to {max_len} has {lengths[-1]}"
    raise XSearchError(
        f"task 'listops': no expression has a length in [{min_len}, {max_len}] with max_depth={max_depth}, "
        f"max_args={max_args} ({why})"
    )


def listops_samples_and_draws(
    n: int,
    *,
    seed: int = 0,
    min_len: int | None = None,
    max_len: int = 256,
    max_depth: int = 10,
    max_args: int = 10,
) -> tuple[list[tuple[str, int]], int]:
    """``listops_samples`` (with its options as keywords) and the number of expressions it drew (``n`` plus
    the duplicates drawn again)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise XSearchError(f"n must be an integer >= 0, got {n!r}")
    lengths = realisable_lengths(min_len, max_len, max_depth, max_args)
    tables = _tables(int(max_len), int(max_depth), int(max_args))
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[tuple[str, int]] = []
    draws = 0
    budget = 10 * n + 1000
    while len(out) < n:
        if draws >= budget:
            raise XSearchError(
                f"found only {len(out)} distinct ListOps expressions of {n} in {draws} draws with lengths in "
                f"[{lengths[0]}, {max_len}] (max_depth={max_depth}, max_args={max_args}); widen the length range"
            )
        draws += 1
        tokens = tables.expression(rng, lengths[rng.randrange(len(lengths))])
        text = " ".join(tokens)
        if text in seen:
            continue
        seen.add(text)
        out.append((text, evaluate_expression(tokens)))
    return out, draws


def listops_samples(n: int, **options: Any) -> list[tuple[str, int]]:
    """``n`` distinct ListOps expressions with ``min_len <= length <= max_len`` tokens, and their labels.

    Options (keywords): ``seed`` (0), ``min_len`` (``default_min_len(max_len)``), ``max_len`` (256),
    ``max_depth`` (10), ``max_args`` (10). Each draw picks a length uniformly among those in the
    range an expression can have, then an expression of that length from LRA's process (see the
    module docstring). Fully determined by ``seed`` (and ``GENERATOR_VERSION``).

    Raises:
        XSearchError: limits no expression meets, or fewer than ``n`` distinct expressions found.
    """
    return listops_samples_and_draws(n, **options)[0]
