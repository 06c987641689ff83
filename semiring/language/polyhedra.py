"""Systems of affine inequalities over integer variables, and the little the compiler asks of them.

A constraint is an :class:`~.syntax.Affine` ``e`` read as ``e >= 0``. The compiler needs to project
a rule's constraints onto a few variables (Fourier-Motzkin elimination: exact over the rationals,
and the rules' coefficients are ±1 almost always, where it is exact over the integers too), to read
off a variable's lower and upper bounds as affine functions of others, and to decide whether an
affine expression is non-negative wherever some constraints hold (a sufficient test: the expression
minus a few of the constraints is a non-negative constant).
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache, reduce

from .syntax import Affine

TAU = "@level"  # the level variable: no program variable can be named so


def affine(coeffs: dict[str, int], const: int = 0) -> Affine:
    return Affine(tuple(sorted((v, a) for v, a in coeffs.items() if a)), const)


def plus(a: Affine, b: Affine, k: int = 1) -> Affine:
    """``a + k * b``."""
    c = dict(a.coeffs)
    for v, x in b.coeffs:
        c[v] = c.get(v, 0) + k * x
    return affine(c, a.const + k * b.const)


def scale(a: Affine, k: int) -> Affine:
    if not k:
        return Affine((), 0)
    return Affine(tuple((v, k * x) for v, x in a.coeffs), k * a.const)  # (still sorted, no zero)


def coeff(a: Affine, v: str) -> int:
    return dict(a.coeffs).get(v, 0)


def substitute(a: Affine, v: str, by: Affine) -> Affine:
    """``a`` with ``v`` replaced by the expression ``by``."""
    k = coeff(a, v)
    if not k:
        return a
    return plus(affine({u: x for u, x in a.coeffs if u != v}, a.const), by, k)


def evaluate(a: Affine, values: dict[str, int]) -> int:
    return a.const + sum(x * values[v] for v, x in a.coeffs)


def _normal(e: Affine) -> Affine:
    g = reduce(math.gcd, (abs(x) for _, x in e.coeffs), 0)
    if g <= 1:
        return e
    return Affine(tuple((v, x // g) for v, x in e.coeffs), math.floor(e.const / g))  # e >= 0 over the integers


class Infeasible(Exception):
    """The constraints have no solution."""


def normalize(cons: list[Affine]) -> list[Affine]:
    """Deduplicated constraints, tightened over the integers; trivially true ones dropped.
    Raises :class:`Infeasible` on a constant negative one."""
    out: dict[tuple, Affine] = {}
    for e in cons:
        e = _normal(e)
        if not e.coeffs:
            if e.const < 0:
                raise Infeasible
            continue
        key = e.coeffs
        if key not in out or e.const < out[key].const:
            out[key] = e
    return list(out.values())


def eliminate(cons: list[Affine], v: str) -> list[Affine]:
    """Fourier-Motzkin: the constraints on the other variables implied by ``cons`` (over the rationals)."""
    lower = [e for e in cons if coeff(e, v) > 0]
    upper = [e for e in cons if coeff(e, v) < 0]
    rest = [e for e in cons if not coeff(e, v)]
    for lo, up in itertools.product(lower, upper):
        a, b = coeff(lo, v), -coeff(up, v)
        rest.append(plus(scale(lo, b), up, a))
    return normalize(rest)


def project(cons: list[Affine], keep: set[str]) -> list[Affine]:
    """The constraints implied on ``keep`` alone (eliminating the variable with the fewest pairs
    first). Remembered: rules of one program often pose the same system."""
    return list(_project(tuple(cons), frozenset(keep)))


@lru_cache(maxsize=8192)
def _project(cons: tuple[Affine, ...], keep: frozenset[str]) -> tuple[Affine, ...]:
    cons = normalize(list(cons))
    while True:
        others = {v for e in cons for v, _ in e.coeffs} - keep
        if not others:
            return tuple(cons)
        v = min(sorted(others), key=lambda u: sum(coeff(e, u) > 0 for e in cons) * sum(coeff(e, u) < 0 for e in cons))
        cons = eliminate(cons, v)


def bounds_of(cons: list[Affine], v: str) -> tuple[tuple[tuple[Affine, int], ...], tuple[tuple[Affine, int], ...]]:
    """``(lower, upper)``: for each constraint on ``v``, ``(r, a)`` with ``v >= r / a`` (lower) or
    ``v <= r / a`` (upper), ``a > 0``, ``r`` free of ``v``. Remembered, as projections are."""
    return _bounds_of(tuple(cons), v)


@lru_cache(maxsize=8192)
def _bounds_of(cons: tuple[Affine, ...], v: str) -> tuple[tuple[tuple[Affine, int], ...], tuple[tuple[Affine, int], ...]]:
    lower, upper = [], []
    for e in cons:
        a = coeff(e, v)
        r = affine({u: x for u, x in e.coeffs if u != v}, e.const)
        if a > 0:
            lower.append((scale(r, -1), a))
        elif a < 0:
            upper.append((r, -a))
    return tuple(lower), tuple(upper)


def implied(expr: Affine, cons: list[Affine], most: int = 2) -> bool:
    """Whether ``expr >= 0`` wherever ``cons`` hold: ``expr`` minus a sum of at most ``most`` of them
    is a non-negative constant (sufficient, not necessary)."""
    for k in range(most + 1):
        for chosen in itertools.combinations(cons, k):
            r = expr
            for e in chosen:
                r = plus(r, e, -1)
            if not r.coeffs and r.const >= 0:
                return True
    return False
