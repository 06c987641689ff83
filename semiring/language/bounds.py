"""Interval bounds: the index box of every chart at given input sizes.

A rule's variables are bounded by interval propagation over its linear constraints (input
shapes, ``for`` ranges, ``if`` conditions, label constants, and the boxes of the charts it reads
and writes); a chart's box is the hull of every read and write of it, iterated to a fixpoint
(:func:`extents`). This is all the compiler asks of the sizes before it plans (:mod:`.plan`):
O(rules x sweeps) arithmetic, never an enumeration of rule instances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from .factor import ELIMINATED_PREFIX, SUBSUM_PREFIX
from .syntax import Affine, Const, Rule, Syntax, Term

MADE = (ELIMINATED_PREFIX, SUBSUM_PREFIX)  # the charts the compiler makes (:mod:`.factor`)


@dataclass
class Space:
    """A chart's dense index box: dimension d runs over ``lo[d]..hi[d]``."""

    lo: list[int]
    hi: list[int]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(max(0, h - l + 1) for l, h in zip(self.lo, self.hi))

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def bounds(rule: Rule, shapes, extents: dict[str, Space], labels, head: bool = True,
           demand: bool = False) -> dict[str, tuple[float, float]]:
    """Interval bounds of the rule's variables: by inputs, ranges and conditions first; by chart
    extents only where those leave a variable unbounded (so a chart's partial extent, while it is
    still being found, never clips a rule that its inputs bound). With ``demand`` (a chart the
    compiler made, read only by the rule it came from), by its head's extent before the extents of
    the charts it reads."""
    given = propagate(rule, constraints(rule, shapes, {}, labels))
    if _bounded(given):
        return given
    # A variable the inputs bound keeps those bounds: a chart's extent, still growing while
    # :func:`extents` sweeps, bounds only the others (``y`` in ``_part0[j, c, y] += alpha[j-k-1, y] *
    # seg[j-1, k, c]``; clipping ``j`` to it too would grow ``alpha`` one segment per sweep).
    frozen = {v for v, (lo, hi) in given.items() if math.isfinite(lo) and math.isfinite(hi)}
    if demand and rule.head.name in extents:
        # Its items are those its reader reads: the charts it reads must reach them (the ITG's
        # ``_part0[s, t, u, v, w] += X[s, k, u, w] * X[k+1, t, w+1, v]`` reads the one-word spans
        # ``X[s, s, u, u]``, which only such reads bound), not clip them.
        box = _tighten(dict(given), constraints(rule, shapes, {rule.head.name: extents[rule.head.name]}, labels), frozen)
        if _bounded(box):
            return box
    box = _tighten(dict(given), constraints(rule, shapes, extents, labels, head, open_growth=True), frozen)
    if _bounded(box):
        return box
    # Only its own chart bounds it (``x[i+1] += x[i]``): it grows one step per sweep, and
    # :func:`extents` reports a chart that never stops.
    return _tighten(dict(given), constraints(rule, shapes, extents, labels, head), frozen)


def _bounded(box: dict[str, tuple[float, float]]) -> bool:
    return all(math.isfinite(lo) and math.isfinite(hi) for lo, hi in box.values())


def constraints(rule: Rule, shapes: dict[str, tuple[int, ...]], extents: dict[str, Space], labels, head: bool = True,
                open_growth: bool = False):
    """Linear constraints ``lo <= expr <= hi`` on the rule's variables (the head's chart extent among
    them unless ``head`` is false; with ``open_growth``, reads of the head's chart bound it as
    :func:`_open_growth` says)."""
    cons: list[tuple[Affine, float, float]] = []

    def index_in(t: Term, bounds: list[tuple[int, int]] | None):
        if bounds is None:
            return
        for ix, (lo, hi) in zip(t.indices, bounds):
            if isinstance(ix, Affine) and ix.coeffs:
                cons.append((ix, lo, hi))

    for t in rule.reads:
        if t.is_one:
            continue
        if t.name not in shapes:  # a chart
            sp = extents.get(t.name)
            box = None if sp is None else list(zip(sp.lo, sp.hi))
            index_in(t, _open_growth(t, rule.head, box) if box and open_growth and t.name == rule.head.name else box)
        else:
            index_in(t, [(0, s - 1) for s in shapes[t.name]])
    sp = extents.get(rule.head.name) if head else None
    index_in(rule.head, None if sp is None else list(zip(sp.lo, sp.hi)))
    for t in (rule.head, *rule.terms):  # dimensions of named constants hold just those
        for d, ix in enumerate(t.indices):
            codes = labels.get((t.name, d))
            if codes and isinstance(ix, Affine) and ix.coeffs:
                cons.append((ix, min(codes), max(codes)))
    for r in rule.ranges:
        v = Affine(((r.var, 1),))
        cons.append((v.minus(r.lo), 0, math.inf))
        cons.append((r.hi.minus(v), 0, math.inf))
    for c in rule.conds:
        d = c.left.minus(c.right)
        lo, hi = {"<": (-math.inf, -1), "<=": (-math.inf, 0), ">": (1, math.inf), ">=": (0, math.inf),
                  "==": (0, 0), "!=": (-math.inf, math.inf)}[c.op]
        cons.append((d, lo, hi))
    return cons


def _open_growth(read: Term, head: Term, box: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The extent a rule's read of its own chart bounds it by, open on the side the rule grows its
    chart to: where the read's index is the head's shifted by a constant (``alpha[t]`` reading
    ``alpha[t-1]``), that bound only lets the chart grow one step per sweep of :func:`extents`, and
    it is slack at every fixpoint (a write beyond the chart's extent would widen it), so leaving it
    out reaches the same least fixpoint in a few sweeps instead of one sweep per position."""
    out: list[tuple[float, float]] = []
    for ix, hx, (lo, hi) in zip(read.indices, head.indices, box):
        if isinstance(ix, Affine) and isinstance(hx, Affine):
            shift = ix.minus(hx)
            if not shift.coeffs and shift.const < 0:
                hi = math.inf
            elif not shift.coeffs and shift.const > 0:
                lo = -math.inf
        out.append((lo, hi))
    return out


def propagate(rule: Rule, cons) -> dict[str, tuple[float, float]]:
    """Interval bounds of every variable of ``rule`` under ``cons``. Remembered per system: the
    rules of one program often pose the same (a chain of charts, a rule per label)."""
    return dict(_propagated(tuple(sorted(rule.variables)), tuple((e.coeffs, e.const, lo, hi) for e, lo, hi in cons)))


@lru_cache(maxsize=8192)
def _propagated(variables: tuple[str, ...], cons: tuple[tuple, ...]) -> tuple[tuple[str, tuple[float, float]], ...]:
    box = _tighten({v: (-math.inf, math.inf) for v in variables}, [(Affine(c, k), lo, hi) for c, k, lo, hi in cons])
    return tuple(box.items())


def _tighten(box: dict[str, tuple[float, float]], cons, frozen: frozenset[str] | set[str] = frozenset()
             ) -> dict[str, tuple[float, float]]:
    """``box`` narrowed by ``cons`` to a fixpoint, leaving the variables in ``frozen`` as they are."""
    for _ in range(100):
        changed = False
        for expr, lo, hi in cons:
            for v, a in expr.coeffs:
                if v in frozen:
                    continue
                rest_lo = rest_hi = float(expr.const)
                for u, b in expr.coeffs:
                    if u == v:
                        continue
                    ends = [b * box[u][0], b * box[u][1]]
                    ends = [0.0 if math.isnan(e) else e for e in ends]
                    rest_lo += min(ends)
                    rest_hi += max(ends)
                lo_v, hi_v = (lo - rest_hi) / a, (hi - rest_lo) / a
                if a < 0:
                    lo_v, hi_v = hi_v, lo_v
                new_lo = max(box[v][0], math.ceil(lo_v) if math.isfinite(lo_v) else lo_v)
                new_hi = min(box[v][1], math.floor(hi_v) if math.isfinite(hi_v) else hi_v)
                if (new_lo, new_hi) != box[v]:
                    box[v] = (new_lo, new_hi)
                    changed = True
        if not changed:
            break
    return box


def index_hull(ix, box, syntax: Syntax) -> tuple[float, float]:
    if isinstance(ix, Const):
        code = syntax.constants[ix.name]
        return code, code
    lo = hi = float(ix.const)
    for v, a in ix.coeffs:
        ends = [a * box[v][0], a * box[v][1]]
        lo += min(ends)
        hi += max(ends)
    return lo, hi


def label_dims(rules: list[Rule], syntax: Syntax) -> dict[tuple[str, int], set[int]]:
    """(chart or input, dimension) -> the codes of the constants that index it."""
    out: dict[tuple[str, int], set[int]] = {}
    for rule in rules:
        for t in (rule.head, *rule.terms):
            for d, ix in enumerate(t.indices):
                if isinstance(ix, Const):
                    out.setdefault((t.name, d), set()).add(syntax.constants[ix.name])
    return out


def extents(rules: list[Rule], syntax: Syntax, shapes, labels) -> dict[str, Space]:
    """The index box of every chart: the hull of every write and read of it by a rule whose
    variables are bounded, found by iterating to a fixpoint. A rule whose variables only the chart
    itself bounds (``C[s, s, d] = 1``) ranges over what the other rules write and read."""
    hulls: dict[str, list[list[float]]] = {}
    boxes: dict[str, Space] = {}  # the charts whose hulls are bounded, kept up to date
    version: dict[str, int] = {}  # per chart: how many times its box was set
    seen: dict[int, tuple[int, ...]] = {}  # per rule: the versions of its charts' boxes when it last ran

    def update(chart: str) -> None:
        h = hulls[chart]
        if all(math.isfinite(l) for l, _ in h):
            boxes[chart] = Space([int(l) for l, _ in h], [int(u) for _, u in h])
            version[chart] = version.get(chart, 0) + 1

    # What a rule with a body writes is bounded by what it reads, not by the extent found so far for
    # its head: ``x[i+1] += x[i]`` grows ``x`` (and is reported), it is not clipped.
    heads = [not any(not t.is_one for t in rule.terms) for rule in rules]
    demands = [rule.head.name.startswith(MADE) for rule in rules]
    # The charts whose boxes a rule's bounds read: where none changed since it last ran, it would widen no hull.
    charts_of = [list(dict.fromkeys([t.name for t in rule.terms if not t.is_one and t.name not in shapes]
                                    + ([rule.head.name] if head or demand else [])))
                 for rule, head, demand in zip(rules, heads, demands)]
    for sweep in range(len(rules) + 3):
        changed, grown = False, []
        for k, rule in enumerate(rules):
            now = tuple(version.get(c, 0) for c in charts_of[k])
            if seen.get(k) == now:
                continue
            seen[k] = now
            box = bounds(rule, shapes, boxes, labels, head=heads[k], demand=demands[k])
            for t in (rule.head, *rule.terms):
                if t.is_one or t.name in shapes:
                    continue
                h = hulls.setdefault(t.name, [[math.inf, -math.inf] for _ in t.indices])
                for d, ix in enumerate(t.indices):
                    vs = ix.variables
                    if any(box[v][0] > box[v][1] or not math.isfinite(box[v][0] - box[v][1]) for v in vs):
                        continue
                    lo, hi = index_hull(ix, box, syntax)
                    if lo < h[d][0] or hi > h[d][1]:
                        h[d] = [min(lo, h[d][0]), max(hi, h[d][1])]
                        changed = True
                        grown.append(rule)
                        update(t.name)
        if not changed:
            out = dict(boxes)
            for c, h in hulls.items():
                out.setdefault(c, Space([0] * len(h), [-1] * len(h)))
            return out
    feeds_itself = [r for r in grown if any(t.name == r.head.name for t in r.terms)]
    rule = (feeds_itself or grown)[0]
    raise rule.error(f"cannot bound the index arithmetic of this rule: chart {rule.head.name!r} grows without limit "
                     "(no input's shape, 'for' range or condition bounds the items it writes)")
