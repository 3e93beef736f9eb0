"""ListOps (Nangia & Bowman; the Long Range Arena version): nested list operations over digits.

Operators: ``MIN``, ``MAX``, ``MED`` (median, truncated to int), ``SM`` (sum mod 10). An
expression is written as space-separated tokens, e.g. ``"[MAX 2 9 [MIN 4 7 ] 0 ]"``, and its
label (0-9) is its value. Pure Python (no torch).
"""

from __future__ import annotations

import random

from xsearch.tasks.encoding import Encoding

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
CLOSE = "]"
DIGITS = tuple(str(d) for d in range(10))
ENCODING = Encoding("tokens", ("<pad>", *OPERATORS, CLOSE, *DIGITS))
BRANCH_P = 0.25  # LRA: probability that a node below max depth is an operator

LRA_PRESET = {"min_len": 500, "max_len": 2000, "n_train": 96_000, "n_valid": 2_000, "n_test": 2_000}


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
        ValueError: a malformed expression (unknown token, unbalanced brackets, empty operator).
    """
    tokens = expression.split() if isinstance(expression, str) else list(expression)
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for tok in tokens:
        if tok in OPERATORS:
            stack.append((tok, []))
        elif tok == CLOSE:
            if not stack:
                raise ValueError(f"unbalanced ']' in ListOps expression {' '.join(tokens)[:80]!r}")
            op, args = stack.pop()
            if not args:
                raise ValueError(f"operator {op} without arguments")
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
            raise ValueError(f"unknown ListOps token {tok!r}")
    if stack or result is None:
        raise ValueError(f"incomplete ListOps expression {' '.join(tokens)[:80]!r}")
    return result


class _TooLong(Exception):
    pass


def _generate(rng: random.Random, max_depth: int, max_args: int, limit: int) -> list[str]:
    """One random expression (root always an operator); abandoned once it exceeds ``limit`` tokens."""
    out: list[str] = []

    def node(depth: int, force_op: bool = False) -> None:
        if len(out) > limit:
            raise _TooLong
        if force_op or (depth < max_depth and rng.random() < BRANCH_P):
            out.append(rng.choice(OPERATORS))
            for _ in range(rng.randint(2, max_args)):
                node(depth + 1)
            out.append(CLOSE)
        else:
            out.append(rng.choice(DIGITS))

    try:
        node(1, force_op=True)
    except _TooLong:
        return []
    return out


def listops_samples(
    n: int,
    *,
    seed: int = 0,
    min_len: int = 64,
    max_len: int = 256,
    max_depth: int = 10,
    max_args: int = 10,
) -> list[tuple[str, int]]:
    """``n`` distinct ListOps expressions with ``min_len <= length <= max_len`` tokens, and labels.

    The generator re-implements LRA's: a node below ``max_depth`` is an operator with
    probability 0.25 and then has 2..``max_args`` arguments, otherwise a digit; samples outside
    the length range are rejected and duplicates dropped. The root is always an operator (LRA's
    digit-only roots are always rejected by the length filter). Fully determined by ``seed``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if min_len < 1 or max_len < min_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    if max_len < 4:
        raise ValueError(f"max_len={max_len} is too short for any ListOps expression (shortest has 4 tokens)")
    if max_depth < 1 or max_args < 2:
        raise ValueError(f"need max_depth >= 1 and max_args >= 2, got {max_depth}, {max_args}")
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[tuple[str, int]] = []
    attempts = 0
    budget = 2000 * max(n, 1) + 100_000
    while len(out) < n:
        attempts += 1
        if attempts > budget:
            raise ValueError(
                f"could not generate {n} ListOps samples with lengths in [{min_len}, {max_len}] "
                f"(max_depth={max_depth}, max_args={max_args}); widen the length range"
            )
        tokens = _generate(rng, max_depth, max_args, max_len)
        if not min_len <= len(tokens) <= max_len:
            continue
        text = " ".join(tokens)
        if text in seen:
            continue
        seen.add(text)
        out.append((text, evaluate_expression(tokens)))
    return out
