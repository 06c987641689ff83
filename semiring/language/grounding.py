"""Grounding: from rules and input shapes to every item, every derivation step, and their order.

For given input shapes, each rule is instantiated at every assignment of its variables that keeps
all of its indices in range (inputs by their shapes, charts by their extents, ``for`` ranges,
``if`` conditions) and reads only items some rule defines. The *level* of an item is the length of
the longest chain of items below it: items of one level depend only on lower levels, so a level is
one vectorized step — the position for chain programs, the span width for span programs, found
rather than declared. An item that depends on itself has no level and is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .syntax import GOAL, Affine, Const, Rule, Syntax, Term

MAX_BOX = 200_000_000


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
        return int(np.prod(self.shape, dtype=np.int64))

    def flat(self, coords: list[np.ndarray], size: int) -> np.ndarray:
        out = np.zeros(size, dtype=np.int64)
        for c, l, s in zip(coords, self.lo, self.shape):
            out = out * s + (c - l)
        return out


@dataclass
class Ground:
    """Every instantiation of one rule: ``head[g]`` and, per term, the item or entry it reads."""

    rule: Rule
    head: np.ndarray  # global item id
    reads: list[np.ndarray | None]  # per term: global item id (chart), flat entry (input), None (one)


@dataclass
class Grounding:
    charts: dict[str, Space]
    offsets: dict[str, int]  # chart -> first global item id
    grounds: list[Ground]
    level: np.ndarray  # per global item; -1 for undefined items
    lengths: np.ndarray  # the values of n the goal is defined at (or [0] without n)
    goal_items: np.ndarray  # global item id of goal per entry of ``lengths``
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def chart_of(self, item: np.ndarray) -> np.ndarray:
        names = list(self.offsets)
        starts = np.array([self.offsets[c] for c in names])
        return np.searchsorted(starts, item, side="right") - 1


# ---------------------------------------------------------------- bounds


def _bounds(rule: Rule, shapes, extents: dict[str, Space], labels, head: bool = True) -> dict[str, tuple[float, float]]:
    """Interval bounds of the rule's variables: by inputs, ranges and conditions first; by chart
    extents only where those leave a variable unbounded (so a chart's partial extent, while it is
    still being found, never clips a rule that its inputs bound)."""
    box = _propagate(rule, _constraints(rule, shapes, {}, labels))
    if all(math.isfinite(lo) and math.isfinite(hi) for lo, hi in box.values()):
        return box
    return _propagate(rule, _constraints(rule, shapes, extents, labels, head))


def _constraints(rule: Rule, shapes: dict[str, tuple[int, ...]], extents: dict[str, Space], labels, head: bool = True):
    """Linear constraints ``lo <= expr <= hi`` on the rule's variables (the head's chart extent among
    them unless ``head`` is false)."""
    cons: list[tuple[Affine, float, float]] = []

    def index_in(t: Term, bounds: list[tuple[int, int]] | None):
        if bounds is None:
            return
        for ix, (lo, hi) in zip(t.indices, bounds):
            if isinstance(ix, Affine) and ix.coeffs:
                cons.append((ix, lo, hi))

    for t in rule.terms:
        if t.is_one:
            continue
        if t.name not in shapes:  # a chart
            sp = extents.get(t.name)
            index_in(t, None if sp is None else list(zip(sp.lo, sp.hi)))
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


def _propagate(rule: Rule, cons) -> dict[str, tuple[float, float]]:
    """Interval bounds of every variable of ``rule`` under ``cons``."""
    return _tighten({v: (-math.inf, math.inf) for v in rule.variables}, cons)


def _tighten(box: dict[str, tuple[float, float]], cons) -> dict[str, tuple[float, float]]:
    for _ in range(100):
        changed = False
        for expr, lo, hi in cons:
            for v, a in expr.coeffs:
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


def _index_hull(ix, box, syntax: Syntax) -> tuple[float, float]:
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


def _extents(rules: list[Rule], syntax: Syntax, shapes, labels) -> dict[str, Space]:
    """The index box of every chart: the hull of every write and read of it by a rule whose
    variables are bounded, found by iterating to a fixpoint. A rule whose variables only the chart
    itself bounds (``C[s, s, d] = 1``) ranges over what the other rules write and read."""
    hulls: dict[str, list[list[float]]] = {}

    def boxes():
        return {c: Space([int(l) for l, _ in h], [int(u) for _, u in h]) for c, h in hulls.items()
                if all(math.isfinite(l) for l, _ in h)}

    for sweep in range(len(rules) + 3):
        changed, grown = False, []
        for rule in rules:
            # What a rule with a body writes is bounded by what it reads, not by the extent found so
            # far for its head: ``x[i+1] += x[i]`` grows ``x`` (and is reported), it is not clipped.
            reads = any(not t.is_one for t in rule.terms)
            box = _bounds(rule, shapes, boxes(), labels, head=not reads)
            for t in (rule.head, *rule.terms):
                if t.is_one or t.name in shapes:
                    continue
                h = hulls.setdefault(t.name, [[math.inf, -math.inf] for _ in t.indices])
                for d, ix in enumerate(t.indices):
                    vs = ix.variables
                    if any(box[v][0] > box[v][1] or not math.isfinite(box[v][0] - box[v][1]) for v in vs):
                        continue
                    lo, hi = _index_hull(ix, box, syntax)
                    if lo < h[d][0] or hi > h[d][1]:
                        h[d] = [min(lo, h[d][0]), max(hi, h[d][1])]
                        changed = True
                        grown.append(rule)
        if not changed:
            out = boxes()
            for c, h in hulls.items():
                out.setdefault(c, Space([0] * len(h), [-1] * len(h)))
            return out
    feeds_itself = [r for r in grown if any(t.name == r.head.name for t in r.terms)]
    raise (feeds_itself or grown)[0].error("cannot bound the index arithmetic of this rule: its chart grows without limit")


# ---------------------------------------------------------------- instantiation


def _instantiate(rule: Rule, syntax: Syntax, shapes, extents, labels) -> dict[str, np.ndarray]:
    variables = sorted(rule.variables, key=lambda v: (v not in rule.head.variables, str(rule).find(v)))
    box = _bounds(rule, shapes, extents, labels)
    for v in variables:
        lo, hi = box[v]
        if lo > hi:
            return {u: np.zeros(0, dtype=np.int64) for u in variables}
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise rule.error(f"cannot bound the index variable '{v}': no input, chart extent, 'for' range or condition limits it")
    sizes = [int(box[v][1] - box[v][0] + 1) for v in variables]
    if math.prod(sizes) > MAX_BOX:
        raise rule.error(f"this rule has more than {MAX_BOX} instances at these shapes")
    grids = np.meshgrid(*[np.arange(box[v][0], box[v][1] + 1, dtype=np.int64) for v in variables], indexing="ij")
    values = {v: g.ravel() for v, g in zip(variables, grids)}
    keep = np.ones(math.prod(sizes), dtype=bool)
    for expr, lo, hi in _constraints(rule, shapes, extents, labels):
        e = _eval(expr, values, keep.shape[0])
        keep &= (e >= lo) & (e <= hi)
    for c in rule.conds:
        if c.op == "!=":
            keep &= _eval(c.left, values, keep.shape[0]) != _eval(c.right, values, keep.shape[0])
    return {v: a[keep] for v, a in values.items()}


def _eval(ix, values: dict[str, np.ndarray], size: int, syntax: Syntax | None = None) -> np.ndarray:
    if isinstance(ix, Const):
        return np.full(size, syntax.constants[ix.name], dtype=np.int64)
    out = np.full(size, ix.const, dtype=np.int64)
    for v, a in ix.coeffs:
        out = out + a * values[v]
    return out


def ground(rules: list[Rule], syntax: Syntax, shapes: dict[str, tuple[int, ...]]) -> Grounding:
    labels = label_dims(rules, syntax)
    extents = _extents(rules, syntax, shapes, labels)
    for rule in rules:
        extents.setdefault(rule.head.name, Space([0] * len(rule.head.indices), [-1] * len(rule.head.indices)))
        if extents[rule.head.name].size == 0:  # an empty chart: is an index of this head free?
            others = {c: sp for c, sp in extents.items() if c != rule.head.name}
            box = _bounds(rule, shapes, others, labels)
            free = [v for v in sorted(rule.head.variables) if not all(map(math.isfinite, box[v]))]
            if free:
                raise rule.error(f"cannot bound the index variable '{free[0]}': no input, chart extent, "
                                 "'for' range or condition limits it", rule.head.col)
    offsets, total = {}, 0
    for name, sp in extents.items():
        offsets[name] = total
        total += sp.size

    def item_ids(t: Term, values, size):
        sp = extents[t.name]
        return offsets[t.name] + sp.flat([_eval(ix, values, size, syntax) for ix in t.indices], size)

    def in_box(t: Term, values, size):
        sp = extents[t.name]
        ok = np.ones(size, dtype=bool)
        for ix, lo, hi in zip(t.indices, sp.lo, sp.hi):
            c = _eval(ix, values, size, syntax)
            ok &= (c >= lo) & (c <= hi)
        return ok

    grounds: list[Ground] = []
    for rule in rules:
        values = _instantiate(rule, syntax, shapes, extents, labels)
        size = len(next(iter(values.values()))) if values else 1
        keep = np.ones(size, dtype=bool)
        for t in (rule.head, *rule.terms):
            if t.name in extents:
                keep &= in_box(t, values, size)
        values = {v: a[keep] for v, a in values.items()}
        size = int(keep.sum())
        reads: list[np.ndarray | None] = []
        for t in rule.terms:
            if t.is_one:
                reads.append(None)
            elif t.name in extents:
                reads.append(item_ids(t, values, size))
            else:
                shape = shapes[t.name]
                coords = [_eval(ix, values, size, syntax) for ix in t.indices]
                flat = np.zeros(size, dtype=np.int64)
                for c, s in zip(coords, shape):
                    flat = flat * s + c
                reads.append(flat)
        grounds.append(Ground(rule, item_ids(rule.head, values, size), reads))

    # Only items some instance defines exist; instances reading others are dropped, to a fixpoint.
    while True:
        defined = np.zeros(total, dtype=bool)
        for g in grounds:
            defined[g.head] = True
        dropped = False
        for g in grounds:
            ok = np.ones(len(g.head), dtype=bool)
            for t, r in zip(g.rule.terms, g.reads):
                if r is not None and t.name in extents:
                    ok &= defined[r]
            if not ok.all():
                g.head = g.head[ok]
                g.reads = [None if r is None else r[ok] for r in g.reads]
                dropped = True
        if not dropped:
            break

    level = _levels(grounds, extents, total, defined)
    goal_space = extents[GOAL]
    goal_ids = offsets[GOAL] + np.arange(goal_space.size)
    present = defined[goal_ids]
    if syntax.uses_length:
        lengths = np.arange(goal_space.lo[0], goal_space.hi[0] + 1)[present]
    else:
        lengths = np.zeros(int(present.sum()), dtype=np.int64)
    return Grounding(extents, offsets, grounds, level, lengths, goal_ids[present], dict(shapes))


def _levels(grounds: list[Ground], extents, total: int, defined: np.ndarray) -> np.ndarray:
    """Longest-path depth of every defined item (Kahn's algorithm, one level at a time)."""
    src, dst = [], []
    for g in grounds:
        for t, r in zip(g.rule.terms, g.reads):
            if r is not None and t.name in extents:
                src.append(r)
                dst.append(g.head)
    src_a = np.concatenate(src) if src else np.zeros(0, dtype=np.int64)
    dst_a = np.concatenate(dst) if dst else np.zeros(0, dtype=np.int64)
    pending = np.bincount(dst_a, minlength=total)
    order = np.argsort(src_a, kind="stable")
    src_sorted, consumers = src_a[order], dst_a[order]
    starts = np.searchsorted(src_sorted, np.arange(total + 1))
    level = np.full(total, -1, dtype=np.int64)
    frontier = np.flatnonzero(defined & (pending == 0))
    depth = 0
    while frontier.size:
        level[frontier] = depth
        lo, hi = starts[frontier], starts[frontier + 1]
        counts = hi - lo
        idx = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        hit = consumers[idx]
        pending = pending - np.bincount(hit, minlength=total)
        cand = np.unique(hit)
        frontier = cand[pending[cand] == 0]
        depth += 1
    stuck = defined & (level < 0)
    if stuck.any():
        # Items downstream of a cycle are stuck too; peel off those that feed no stuck item, so
        # what is left lies on a cycle, and report a rule that defines one of them from another.
        on_cycle = stuck.copy()
        while True:
            live = on_cycle[src_a] & on_cycle[dst_a]
            feeds = np.zeros(total, dtype=bool)
            feeds[src_a[live]] = True
            if not (on_cycle & ~feeds).any():
                break
            on_cycle &= feeds
        for g in grounds:
            for t, r in zip(g.rule.terms, g.reads):
                if r is not None and t.name in extents and (on_cycle[g.head] & on_cycle[r]).any():
                    raise g.rule.error("an item depends on itself (a cycle among the rules)")
    return level
