"""Random arithmetic formulas in prefix and infix notation (Kim et al. 2017, §4.1).

A formula of nesting depth ``d`` is ``( op a1 .. ak )`` with ``op`` in ``{+, *}``, ``2..4``
arguments (the paper: at most 4 expressions per parenthesis), numbers ``0..20``; one argument (at a
random place) is a formula of depth ``d-1`` and each other one is a number with probability
``leaf`` or else a formula of a depth drawn uniformly from ``1..d-1``. The paper does not give its
sampling distribution; ``leaf = 0.8`` gives depth-3 prefix formulas of 21 tokens on average, the
length of the paper's depth-3 example (mean lengths at depths 2-6: 13, 21, 32, 43, 57). The infix
form drops the outermost parentheses:

    ( * ( + ( + 15 7 ) 1 8 ) ( + 19 0 11 ) )  =>  ( ( 15 + 7 ) + 1 + 8 ) * ( 19 + 0 + 11 )
"""

from __future__ import annotations

import random
from typing import NamedTuple, Union

OPERATORS = ("+", "*")
NUMBERS = tuple(str(i) for i in range(21))
SYMBOLS = ("(", ")") + OPERATORS + NUMBERS  # the alphabet of both notations

Formula = Union[str, tuple]  # a number, or (operator, [arguments])


class Pair(NamedTuple):
    """One example: the prefix tokens (source), the infix tokens (target) and the nesting depth."""

    prefix: tuple[str, ...]
    infix: tuple[str, ...]
    depth: int


def formula(rng: random.Random, depth: int, leaf: float = 0.8, max_args: int = 4) -> Formula:
    """A random formula of nesting depth exactly ``depth`` (>= 1)."""
    count = rng.randint(2, max_args)
    deep = rng.randrange(count)  # the argument that carries the depth
    args = []
    for i in range(count):
        if depth > 1 and i == deep:
            args.append(formula(rng, depth - 1, leaf, max_args))
        elif depth == 1 or rng.random() < leaf:
            args.append(rng.choice(NUMBERS))
        else:
            args.append(formula(rng, rng.randint(1, depth - 1), leaf, max_args))
    return (rng.choice(OPERATORS), args)


def prefix(f: Formula) -> list[str]:
    """``( op a1 .. ak )`` recursively."""
    if isinstance(f, str):
        return [f]
    return ["(", f[0]] + [t for a in f[1] for t in prefix(a)] + [")"]


def infix(f: Formula, outer: bool = True) -> list[str]:
    """``a1 op a2 .. op ak``, inner formulas in parentheses (the outermost has none)."""
    if isinstance(f, str):
        return [f]
    body = []
    for i, a in enumerate(f[1]):
        body += ([f[0]] if i else []) + infix(a, outer=False)
    return body if outer else ["("] + body + [")"]


def sample_pairs(rng: random.Random, depth: int, count: int, exclude: set, leaf: float = 0.8) -> list[Pair]:
    """``count`` distinct pairs of the given depth whose prefix form is not in ``exclude`` (updated)."""
    out = []
    while len(out) < count:
        f = formula(rng, depth, leaf)
        src = tuple(prefix(f))
        if src in exclude:
            continue
        exclude.add(src)
        out.append(Pair(src, tuple(infix(f)), depth))
    return out
