"""Sibling steps as one: two steps of a level that do the same arithmetic at different places.

Eisner's two complete spans (``C[s, t, R]`` and ``C[s, t, L]``), written by two rules, are two
steps at every level with the same box and the same strides, reading and writing at different
offsets. Where all charts live in one buffer, the *arena*, any two such steps are one step with a
leading coordinate of size 2 whose stride, in every view, is the distance between the two steps'
positions: half the torch calls, the same arithmetic. A stride must not be negative, so the order
of the charts' buffers in the arena is chosen to make them all positive (a precedence between
buffers for each fused pair; a pair whose precedences would close a cycle stays two steps).

Fused steps serve the in-place runs (:meth:`~.execute.Run.forward` and ``backward``);
the out-of-place and forward-mode runs keep the plan's own levels.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from .plan import Form, Plan, Step, View, _overlap
from .syntax import GOAL, Const

ARENA = "@charts"  # the buffer key of the arena


@dataclass
class Fused:
    """The form of a fused step (what the executor asks of a step's form)."""

    parts: tuple[Form, Form]
    n_free: int
    outer: int
    reads: list
    chart: str


def fuse(plan: Plan) -> None:
    """Set ``plan.fused`` (the levels, sibling steps fused) and ``plan.arena`` (chart buffer key ->
    its first position in the arena; ``plan.arena_size`` positions in all)."""
    keys = [k for c, ks in plan.keys.items() if c != GOAL for k in ks]
    charts = set(keys)
    after: dict[str, set[str]] = {k: set() for k in keys}  # key -> the keys that must come after it
    chosen: list[tuple[int, int, bool]] = []  # (level, index of the first step, swapped)
    for lev, steps in enumerate(plan.levels):
        j = 0
        while j + 1 < len(steps):
            pairs = _congruent(steps[j], steps[j + 1], charts)
            for swapped in (False, True):
                edges = None if pairs is None else _precedences(pairs, swapped)
                if edges is not None and _acyclic(after, edges):
                    for a, b in edges:
                        after[a].add(b)
                    chosen.append((lev, j, swapped))
                    break
            else:
                j += 1
                continue
            j += 2
    base, total = {}, 0
    for k in _order(keys, after):
        base[k] = total
        total += plan.size[k]
    plan.arena, plan.arena_size = base, total
    fused = [list(steps) for steps in plan.levels]
    for lev, j, swapped in reversed(chosen):
        x, y = plan.levels[lev][j: j + 2]
        fused[lev][j: j + 2] = [_fused(y, x, plan) if swapped else _fused(x, y, plan)]
    plan.fused = fused


def _congruent(x: Step, y: Step, charts: set[str]) -> list[tuple[View, View, bool]] | None:
    """The pairs of views (and whether each is a head) of two steps that can be one, else None: the
    same chart, rule shape, box and masks, strided views with the same strides, and ``y`` reading
    none of the items ``x`` writes (they are read before either is written)."""
    fx, fy = x.form, y.form
    if (fx.chart != fy.chart or x.shared or y.shared or x.accumulate or y.accumulate or x.sizes != y.sizes
            or x.masks != y.masks or fx.n_free != fy.n_free or fx.outer != fy.outer or len(x.reads) != len(y.reads)):
        return None
    for t in fy.rule.terms:
        if t.name == fx.chart and _overlap(fx.labels, tuple(ix.name if isinstance(ix, Const) else None for ix in t.indices)):
            return None
    pairs = []
    for vx, vy, head in [*((a, b, False) for a, b in zip(x.reads, y.reads)), *((a, b, True) for a, b in zip(x.heads, y.heads))]:
        if vx is None and vy is None:
            continue
        if vx is None or vy is None or vx.gather or vy.gather or vx.lookups or vy.lookups or vx.strides != vy.strides:
            return None
        if vx.source != vy.source and not (vx.source in charts and vy.source in charts):
            return None
        pairs.append((vx, vy, head))
    return pairs


def _precedences(pairs: list[tuple[View, View, bool]], swapped: bool) -> list[tuple[str, str]] | None:
    """The buffer precedences that make every fused stride positive (a head's: nonzero too) with
    the first step at coordinate 0, else None."""
    edges = []
    for vx, vy, head in pairs:
        a, b = (vy, vx) if swapped else (vx, vy)
        if a.source != b.source:
            edges.append((a.source, b.source))
        elif b.offset < a.offset or (head and b.offset == a.offset):
            return None
    return edges


def _acyclic(after: dict[str, set[str]], edges: list[tuple[str, str]]) -> bool:
    """Whether the precedences stay acyclic with ``edges`` added."""
    new = [(a, b) for a, b in edges if b not in after[a]]
    if not new:
        return True
    graph = {k: set(v) for k, v in after.items()}
    for a, b in new:
        graph[a].add(b)
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(k: str) -> bool:
        state[k] = 1
        for m in graph[k]:
            if state.get(m) == 1 or (m not in state and not visit(m)):
                return False
        state[k] = 2
        return True

    return all(k in state or visit(k) for k in graph)


def _order(keys: list[str], after: dict[str, set[str]]) -> list[str]:
    """The keys in an order that respects the precedences, otherwise as given."""
    rank = {k: i for i, k in enumerate(keys)}
    before = dict.fromkeys(keys, 0)
    for k in keys:
        for m in after[k]:
            before[m] += 1
    ready = [rank[k] for k in keys if not before[k]]
    out: list[str] = []
    while ready:
        k = keys[heapq.heappop(ready)]
        out.append(k)
        for m in after[k]:
            before[m] -= 1
            if not before[m]:
                heapq.heappush(ready, rank[m])
    return out


def _fused(x: Step, y: Step, plan: Plan) -> Step:
    """``x`` and ``y`` as one step: coordinate 0 (of size 2) picks the step."""

    def both(vx: View | None, vy: View | None) -> View | None:
        if vx is None:
            return None
        if vx.source in plan.arena:
            source, bound = ARENA, plan.arena_size
            ox, oy = plan.arena[vx.source] + vx.offset, plan.arena[vy.source] + vy.offset
        else:
            source, bound, ox, oy = vx.source, vx.bound, vx.offset, vy.offset
        return View.strided(source, (2, *vx.sizes), (oy - ox, *vx.strides), ox, bound)

    fx = x.form
    form = Fused((fx, y.form), fx.n_free + 1, fx.outer, fx.reads, fx.chart)
    masks = [({c + 1: a for c, a in coeffs.items()}, const, op) for coeffs, const, op in x.masks]
    return Step(form, (2, *x.sizes), masks, x.i, [both(a, b) for a, b in zip(x.reads, y.reads)],
                [both(a, b) for a, b in zip(x.heads, y.heads)])
