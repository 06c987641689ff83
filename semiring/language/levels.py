"""The wavefront, found symbolically: an affine *level* per chart, and the order of charts within a level.

Every chart ``X`` gets a level function ``τ_X(i_1, .., i_k) = Σ c_d i_d`` with ``c_d`` in {-1, 0, 1}
(``t - s`` for the span charts of Eisner or CKY, ``i`` for a chain's ``alpha[i, c]``), such that every
rule ``H[h] += .. T[t] ..`` reads ``T`` at a level no higher than the one it writes:
``τ_H(h) - τ_T(t) >= 0`` wherever the rule's ``for`` ranges, ``if`` conditions and input indices
allow (:func:`~.polyhedra.implied`). Reads at the same level must go from chart to chart without
a cycle; that order is the *stratum* order (in Eisner, ``C[s, t]`` reads ``I[s, t]`` of the same
width, so ``I`` comes first). Only charts that read each other (one strongly connected component
of the read graph) need a common level function: the components form *phases*, run one after
another in an order where a chart reads only its own phase and earlier ones, so a chart that reads
a finished one anywhere (``r[i] += f[4-i]``) needs no level function that relates the two. The
levels then serve every input size: nothing here looks at shapes. A program for which no such
functions exist is reported as such (``None``).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from functools import lru_cache

from .polyhedra import affine, implied, plus, scale
from .syntax import GOAL, Affine, Const, Rule, Syntax

MAX_TRIES = 20_000
MAX_SEARCHED = 12  # charts: longer programs only get the first fitting candidate of each chart


@dataclass
class Levels:
    coeffs: dict[str, tuple[int, ...]]  # chart -> its level function's coefficient per dimension
    strata: list[str]  # the charts in the order they are computed within one level
    phases: dict[str, int]  # chart -> its phase: every level of a phase runs before the next phase

    def of(self, chart: str, indices) -> Affine:
        """The level of ``chart[indices]`` as an affine expression of the indices' variables."""
        out = affine({})
        for c, ix in zip(self.coeffs[chart], indices):
            if c:
                out = plus(out, ix, c)
        return out


def static_constraints(rule: Rule, syntax: Syntax) -> list[Affine]:
    """What holds for every instance of ``rule`` at any input size (as ``e >= 0``)."""
    cons = []
    for r in rule.ranges:
        v = affine({r.var: 1})
        cons += [plus(v, r.lo, -1), plus(r.hi, v, -1)]
    for c in rule.conds:
        d = plus(c.left, c.right, -1)
        cons += {"<": [scale(d, -1).shifted(-1)], "<=": [scale(d, -1)], ">": [d.shifted(-1)], ">=": [d],
                 "==": [d, scale(d, -1)], "!=": []}[c.op]
    for t in rule.reads:
        if t.name in syntax.inputs or t.name in syntax.lookups:
            cons += [ix for ix in t.indices if isinstance(ix, Affine) and ix.coeffs]
    return cons


@lru_cache(maxsize=256)
def _candidates(rank: int, labels: frozenset[int]) -> tuple[tuple[int, ...], ...]:
    """The level functions a chart of this rank may have, simplest first (``labels``: its dimensions
    indexed by constants, which take no part); remembered, the charts of a program share a few ranks."""
    free = [d for d in range(rank) if d not in labels]
    out = []
    for values in itertools.product((0, 1, -1), repeat=len(free)):
        c = [0] * rank
        for d, x in zip(free, values):
            c[d] = x
        out.append(tuple(c))
    return tuple(sorted(out, key=lambda c: (sum(map(abs, c)), [-x for x in c])))


def find_levels(rules: list[Rule], syntax: Syntax) -> Levels | None:
    """Level functions and strata for the charts of ``rules`` (the goal excluded), or None."""
    charts = list(dict.fromkeys(r.head.name for r in rules if r.head.name != GOAL))
    rank = {r.head.name: len(r.head.indices) for r in rules}
    labels = {c: set() for c in charts}
    for r in rules:
        for t in (r.head, *r.terms):
            if t.name in labels:
                labels[t.name] |= {d for d, ix in enumerate(t.indices) if isinstance(ix, Const)}
    edges = []  # (head chart, read chart, τ_H(h) - τ_T(t) as a function of the coefficients, constraints)
    for r in rules:
        if r.head.name == GOAL:
            continue
        cons = static_constraints(r, syntax)
        for t in r.terms:
            if t.name in labels:
                edges.append((r.head.name, t.name, r.head.indices, t.indices, cons))
    phases = components(charts, [(e[0], e[1]) for e in edges])
    edges = [e for e in edges if phases[e[0]] == phases[e[1]]]  # a read of an earlier phase is always done
    order = {c: i for i, c in enumerate(charts)}
    by_late: dict[str, list] = {c: [] for c in charts}  # edges by the later of their two charts
    for e in edges:
        by_late[max(e[0], e[1], key=order.get)].append(e)
    heads: dict[str, list[Rule]] = {c: [] for c in charts}
    for r in rules:
        if r.head.name in heads:
            heads[r.head.name].append(r)
    chosen: dict[str, tuple[int, ...]] = {}
    same: dict[str, set[str]] = {c: set() for c in charts}  # chart -> charts it reads at its own level
    tries = [0]

    def level(chart, indices):
        out = affine({})
        for c, ix in zip(chosen[chart], indices):
            if c and isinstance(ix, Affine):
                out = plus(out, ix, c)
        return out

    def fits(chart: str) -> list[tuple[str, str]] | None:
        sames = []
        for head, read, h, t, cons in by_late[chart]:
            delta = plus(level(head, h), level(read, t), -1)
            if implied(delta.shifted(-1), cons):
                continue
            if head == read or not implied(delta, cons):
                return None
            sames.append((head, read))
        for r in heads[chart]:  # a head's level must pin one of its variables, or be constant
            lv = level(chart, r.head.indices)
            if lv.coeffs and not any(abs(a) == 1 for _, a in lv.coeffs):
                return None
        return sames

    def search(group: list[str], i: int) -> bool:
        if i == len(group):
            return _strata(group, same) is not None
        chart = group[i]
        for c in _candidates(rank[chart], frozenset(labels[chart])):
            tries[0] += 1
            if tries[0] > MAX_TRIES:
                return False
            chosen[chart] = c
            sames = fits(chart)
            if sames is None:
                continue
            for head, read in sames:
                same[head].add(read)
            if search(group, i + 1):
                return True
            for head, read in sames:
                same[head].discard(read)
        del chosen[chart]
        return False

    def greedy(group: list[str]) -> bool:
        """The first fitting candidate of every chart in turn, never going back (long programs)."""
        for chart in group:
            for c in _candidates(rank[chart], frozenset(labels[chart])):
                chosen[chart] = c
                sames = fits(chart)
                if sames is not None:
                    for head, read in sames:
                        same[head].add(read)
                    break
            else:
                return False
        return _strata(group, same) is not None

    # Phases read each other's finished levels only, so each is searched alone: one chart of an
    # unrelated phase no longer multiplies the tries of another's search.
    groups: dict[int, list[str]] = {}
    for c in charts:
        groups.setdefault(phases[c], []).append(c)
    for group in groups.values():
        if greedy(group):
            continue
        for c in group:
            chosen.pop(c, None)
            same[c] = set()
        tries[0] = 0
        if len(group) > MAX_SEARCHED or not search(group, 0):
            return None
    return Levels(dict(chosen), _strata(charts, same), phases)


def components(charts: list[str], reads: list[tuple[str, str]]) -> dict[str, int]:
    """Per chart, the number of its strongly connected component of the read graph (edges: a
    rule's head chart reads a chart), numbered so that a chart reads only its own and lower ones:
    Tarjan's algorithm (iterative: a chain of thousands of charts is a path that deep), which
    finishes a component after every component it reads."""
    succ: dict[str, list[str]] = {c: [] for c in charts}
    for head, read in reads:
        succ[head].append(read)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    out: dict[str, int] = {}
    stack: list[str] = []
    components = 0

    def enter(c: str) -> None:
        index[c] = low[c] = len(index)
        stack.append(c)
        work.append((c, iter(succ[c])))

    for root in charts:
        if root in index:
            continue
        work: list[tuple[str, object]] = []
        enter(root)
        while work:
            c, todo = work[-1]
            d = next(todo, None)
            if d is not None:
                if d not in index:
                    enter(d)
                elif d not in out:  # on the stack: in c's component
                    low[c] = min(low[c], index[d])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[c])
            if low[c] == index[c]:
                while True:
                    d = stack.pop()
                    out[d] = components
                    if d == c:
                        break
                components += 1
    return out


def _strata(charts: list[str], same: dict[str, set[str]]) -> list[str] | None:
    """The charts in an order where each comes after those it reads at its own level (None: a
    cycle); program order where nothing else decides (Kahn's algorithm)."""
    waiting = {c: set(same[c]) for c in charts}
    readers: dict[str, list[str]] = {c: [] for c in charts}
    for c in charts:
        for d in same[c]:
            readers[d].append(c)
    ready = deque(c for c in charts if not waiting[c])
    out = []
    while ready:
        c = ready.popleft()
        out.append(c)
        for r in readers[c]:
            waiting[r].discard(c)
            if not waiting[r]:
                ready.append(r)
    return out if len(out) == len(charts) else None
