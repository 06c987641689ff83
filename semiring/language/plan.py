"""The plan: every rule at every level as one batched step over strided views of the charts.

Built per program from its :class:`~.levels.Levels` and per input *sizes* from the chart extents,
in O(rules x constraints) numpy work over the vector of levels: no rule instance is enumerated.

A rule at level τ ranges over a box of *coordinates*: its head's free variables (the L dimensions:
the items it writes; the head variable the level pins is solved for) and its summed variables
(the K dimensions, ⊕-reduced). Each variable is ``base + coordinate``, where a summed variable's
base may follow the head's (``u = s + 1 + k`` for ``for u in s+1..t``: SuPar's stripe), so that
every term's position in its buffer is affine in the coordinates — a strided view, computed by
arithmetic — and every rule's box at level τ is a rectangle. Where the rectangle holds instances
the rule does not have (a triangle's corner, an ``if``), a mask, evaluated on the device from the
same affine forms, marks them; a read that could leave its buffer there is a gather at clamped
positions instead of a view.

Charts live in dense buffers ``[*, B, box]`` over their index boxes, in one or two *layouts*:
each read over K instances uses the layout where they are adjacent, so that it is a unit-stride
view; every level's items are written to each layout. A layout is an order of the box's dimensions,
or, for a chart no rule sums over whose levels run along a diagonal (an alignment's ``A[i, j]`` at
level ``i + j``), the level itself outermost (``A[i + j, i]``): a level's items are then adjacent
too, where along the diagonal each would be on a cache line of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache, reduce
from typing import Callable

import numpy as np

from .bounds import Space, bounds, constraints, extents, index_hull, label_dims, propagate
from .levels import Levels, static_constraints
from .polyhedra import TAU, Infeasible, affine, bounds_of, coeff, plus, project, scale, substitute
from .syntax import GOAL, Affine, Const, Lookup, ProgramError, Rule, Syntax, Term


@dataclass
class Expr:
    """``const[τ] + Σ coeffs[c] * coordinate c``: an affine form of the coordinates whose constant
    varies with the level (a vector over the rule's levels)."""

    coeffs: dict[int, int]  # coordinate number -> coefficient
    const: np.ndarray

    def add(self, other: "Expr", k: int = 1) -> "Expr":
        c = dict(self.coeffs)
        for i, a in other.coeffs.items():
            c[i] = c.get(i, 0) + k * a
        return Expr({i: a for i, a in c.items() if a}, self.const + k * other.const)

    def low(self, sizes: list[np.ndarray]) -> np.ndarray:
        """Its least value over the box (exact: the form is affine)."""
        return self.const + sum(np.minimum(0, a * (sizes[i] - 1)) for i, a in self.coeffs.items())

    def high(self, sizes: list[np.ndarray]) -> np.ndarray:
        return self.const + sum(np.maximum(0, a * (sizes[i] - 1)) for i, a in self.coeffs.items())


@dataclass
class Read:
    """A term as a view ``[*, B, *coords]`` of a buffer: position ``offset[τ] + Σ strides * coords``."""

    source: str  # buffer key (a chart's layout or an input)
    offset: np.ndarray  # per level
    strides: tuple[int, ...]  # per coordinate (0: the term does not vary with it)
    gather: np.ndarray  # per level: whether positions may leave the buffer (read by a clamped gather)
    bound: int  # the buffer's size
    lookups: list = field(default_factory=list)  # (stride, Read of an integer input): positions added from data


@dataclass
class Form:
    """One rule at every level it fires at, at one set of sizes."""

    rule: Rule
    index: int  # the rule's number in the program
    chart: str
    levels: np.ndarray  # the levels τ it fires at (ascending)
    n_free: int  # coordinates 0..n_free-1 are the head's (L), the rest summed (K)
    sizes: list[np.ndarray]  # per coordinate, per level
    reads: list[Read | None]  # per term (None: the semiring one)
    heads: list[Read]  # per layout of the chart: where the items go
    masks: list[tuple[Expr, str]]  # (form, op): an instance is real where form >= 0 (op ">=") or != 0 ("!=")
    outer: int  # the last ``outer`` terms are ⊗-multiplied after the ⊕
    needed: list[np.ndarray] = field(default_factory=list)  # per mask, per level: whether the box holds instances it excludes

    def at(self, i: int) -> "Step":
        """The step at the rule's ``i``-th level."""
        sizes = tuple(int(s[i]) for s in self.sizes)
        masks = [(e.coeffs, int(e.const[i]), op) for (e, op), needed in zip(self.masks, self.needed) if needed[i]]
        first_outer = len(self.reads) - self.outer
        reads = [None if rd is None else View.of(rd, i, sizes if j < first_outer else sizes[: self.n_free])
                 for j, rd in enumerate(self.reads)]
        heads = [View.of(rd, i, sizes[: self.n_free]) for rd in self.heads]
        return Step(self, sizes, masks, i, reads, heads)

    @property
    def labels(self) -> tuple:
        """The head's constants per dimension (None: a variable)."""
        return tuple(ix.name if isinstance(ix, Const) else None for ix in self.rule.head.indices)


@dataclass
class View:
    """A read or write of one step: positions ``offset + Σ strides * coords`` of buffer ``source``
    over the box ``sizes`` (a strided view, or where they may leave the buffer a clamped gather)."""

    source: str
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    gather: bool
    bound: int  # the buffer's size
    narrow: tuple[int, ...]  # sizes, 1 where the stride is 0: what a gradient is summed down to
    broad: tuple[int, ...]  # the coordinates the view is broadcast over (stride 0, size > 1)
    injective: bool  # the narrowed view touches each position once (gradients add in place)
    whole: bool = False  # every position of the buffer, in order
    lookups: tuple = ()  # (stride, View of an integer input): positions added from data, per example

    @staticmethod
    def of(rd: Read, i: int, sizes: tuple[int, ...]) -> "View":
        v = View.strided(rd.source, sizes, rd.strides[: len(sizes)], int(rd.offset[i]), rd.bound, bool(rd.gather[i]))
        v.lookups = tuple((stride, View.of(lk, i, sizes)) for stride, lk in rd.lookups)
        return v

    @staticmethod
    def strided(source: str, sizes: tuple[int, ...], strides: tuple[int, ...], offset: int, bound: int, gather: bool = False) -> "View":
        narrow, broad, injective, whole = _geometry(sizes, strides, bound, gather)
        return View(source, sizes, strides, offset, gather, bound, narrow, broad, injective, whole and offset == 0)


@lru_cache(maxsize=65536)
def _geometry(sizes: tuple[int, ...], strides: tuple[int, ...], bound: int, gather: bool
              ) -> tuple[tuple[int, ...], tuple[int, ...], bool, bool]:
    """A view's ``narrow``, ``broad``, ``injective``, and whether at offset 0 it is ``whole``
    (remembered without the offset, which varies from level to level where nothing else does)."""
    narrow = tuple(1 if s == 0 else n for s, n in zip(strides, sizes))
    broad = tuple(d for d, (s, n) in enumerate(zip(strides, sizes)) if s == 0 and n > 1)
    whole = not gather and math.prod(sizes) == bound and strides == tuple(
        math.prod(sizes[d + 1:]) for d in range(len(sizes)))
    return narrow, broad, not gather and _injective(strides, narrow), whole


def _injective(strides, shape) -> bool:
    """Whether a strided view (no stride-0 dimension of size > 1) touches each position once."""
    dims = sorted((s, n) for s, n in zip(strides, shape) if n > 1)
    reach = 0
    for s, n in dims:
        if s <= reach:
            return False
        reach += s * (n - 1)
    return True


@dataclass
class Step:
    form: Form
    sizes: tuple[int, ...]  # per coordinate
    masks: list[tuple[dict[int, int], int, str]]
    i: int  # the level's number among the form's
    reads: list[View | None]  # per term (outer terms over the L coordinates only)
    heads: list[View]  # per layout of the chart
    accumulate: bool = False  # an earlier step of this level wrote some of the same items: ⊕ into them
    shared: bool = False  # several steps of this level write some of the same items

    @property
    def L(self) -> tuple[int, ...]:
        return self.sizes[: self.form.n_free]

    @property
    def K(self) -> tuple[int, ...]:
        return self.sizes[self.form.n_free:]


@dataclass
class Scan:
    """Levels ``start..stop-1`` of a chain, ``chart[τ, l] = (⊕_k chart[τ-1, k] ⊗ matrix[τ, k, l]) ⊗
    unary[τ, l]``, run as one :meth:`~semiring.semirings.Semiring.scan`: the views span the levels."""

    start: int
    stop: int
    init: View  # [K]: the items of level start-1
    matrix: View  # [T, K, L] (T of stride 0: one matrix for every level)
    unary: View | None  # [T, L]
    heads: list[View]  # [T, L] per layout of the chart


DELTAS, VALID = "#deltas", "#valid"  # the inputs of a goal at each example's lengths, made per run (:class:`PerExample`)
EACH = 8192  # the goal's positions times its rules from which a run given lengths computes it at each example's only
# (30-150 us of numpy a run: CTC's T x (S+1) x 2 at T = 200, S = 40 gains 1.12x; an alignment's n x m x 1 at 64 breaks even)


@dataclass
class PerExample:
    """How a run computes the goal at each example's own lengths only (:func:`build` with
    ``each``), where a plan of every length computes its whole box: each goal rule's items are one,
    and a read that moves with the lengths adds its offset at the example's lengths, looked up in
    ``DELTAS [B, reads]``; a term ``VALID [B, rules]`` is 0 where the rule holds at the example's
    lengths, else -inf. The rules' item coordinates, all in a row: coordinate ``i`` is length
    ``dims[i]`` minus ``bases[i]``, within ``0..sizes[i]-1``, rule ``j``'s from ``starts[j]``."""

    dims: np.ndarray
    bases: np.ndarray
    sizes: np.ndarray
    starts: np.ndarray
    rule_of: np.ndarray  # per coordinate, its rule
    masks: list[tuple[int, dict[int, int], int, str]]  # (rule, coefficients of its coordinates, constant, op)
    strides: np.ndarray  # [coordinates, reads]: each read's offset per unit of a coordinate of its rule


@dataclass
class Plan:
    """Everything a run at one set of input sizes needs."""

    shapes: dict[str, tuple[int, ...]]  # per input
    boxes: dict[str, Space]  # per chart
    layouts: dict[str, list[Layout]]  # per chart
    keys: dict[str, list[str]]  # per chart: buffer key per layout
    levels: list[list[Step]]  # per level, in order: its steps (strata, then program order)
    goal: list[Step]  # the goal's steps
    lengths: np.ndarray  # the values of n the goal is defined at (one 0 without n)
    length_names: list[str]  # the goal's dimensions: n, and m where the program has it
    allowed: Space  # the goal's box at every length (boxes[GOAL] is its largest lengths alone in a plan for them)
    size: dict[str, int] = field(default_factory=dict)  # buffer key -> number of positions
    scans: dict[int, Scan] = field(default_factory=dict)  # first level -> a run of chain levels
    looked_up: dict[str, int] = field(default_factory=dict)  # integer input -> the largest index it may hold
    per_example: PerExample | None = None  # the goal at each example's lengths only (else at every length)
    fused: list[list[Step]] = field(default_factory=list)  # the levels with sibling steps fused (:mod:`.fuse`)
    arena: dict[str, int] = field(default_factory=dict)  # chart buffer key -> its first position in the arena
    arena_size: int = 0
    packed: object = None  # the fused levels as kernel descriptors (:mod:`.pack`)
    keepable: set[int] | None = None  # the fused steps whose Log weights a run keeps (:meth:`~.execute.Run.keepable`)
    skips: dict[tuple[int, ...], frozenset[int]] = field(default_factory=dict)  # the levels of a set of scans (by their first levels), made once
    work: int | None = None  # terms per example (:mod:`.limits`)
    positions: int = 0  # the charts' buffers' positions per example (:mod:`.limits`)


Layout = tuple[tuple[int, ...], ...]
"""A buffer's layout: rows of integers, outermost first; index ``x`` of the box is at coordinates
``u_k = Σ_d row_k[d] x_d`` of the box they span, row-major. Unit rows order the dimensions."""


def _ordered(perm: tuple[int, ...]) -> Layout:
    """The layout of the box's dimensions in the order ``perm`` (outermost first)."""
    return tuple(tuple(int(d == p) for d in range(len(perm))) for p in perm)


def _placement(lo: list[int], shape: tuple[int, ...], layout: Layout) -> tuple[list[int], int, int]:
    """(per box dimension its stride, the position of index 0, the number of positions) of the box
    ``lo + [0, shape)`` in ``layout``: index ``x`` is at ``base + Σ strides[d] x_d``."""
    if not all(shape):
        return [0] * len(shape), 0, 0
    ulo, ushape = [], []
    for row in layout:
        ends = [(a * l, a * (l + n - 1)) for a, l, n in zip(row, lo, shape)]
        ulo.append(sum(min(e) for e in ends))
        ushape.append(sum(max(e) for e in ends) - ulo[-1] + 1)
    strides, base, acc = [0] * len(shape), 0, 1
    for row, low, n in zip(reversed(layout), reversed(ulo), reversed(ushape)):
        strides = [s + acc * a for s, a in zip(strides, row)]
        base -= acc * low
        acc *= n
    return strides, base, acc


def _innermost(layout: Layout) -> int | None:
    """The dimension whose index advances a position at a time (None: no one dimension's)."""
    last = layout[-1]
    return last.index(1) if sorted(last) == [0] * (len(last) - 1) + [1] else None


def layouts(rules: list[Rule], charts: dict[str, int], summed: dict[int, list[str]],
            levels: dict[str, tuple[int, ...]]) -> dict[str, list[Layout]]:
    """Per chart, one or two dimension orders: one with the dimension that most reads advance
    along (over their innermost summed variable) innermost, and one for the next such dimension;
    a chart no rule sums over whose level (``levels``: its coefficients) is not one dimension's, its
    level outermost, then its dimensions but the last of the level's (the one a level's steps solve
    for), so that a level's items are adjacent."""
    weight: dict[str, dict[int, int]] = {c: {} for c in charts}
    for i, r in enumerate(rules):
        if not summed[i]:
            continue
        inner = summed[i][-1]
        for t in r.terms:
            if t.name in charts:
                moved = [d for d, ix in enumerate(t.indices) if isinstance(ix, Affine) and abs(coeff(ix, inner)) == 1]
                if len(moved) == 1:
                    weight[t.name][moved[0]] = weight[t.name].get(moved[0], 0) + 1
    out = {}
    for c, rank in charts.items():
        dims = sorted(weight[c], key=lambda d: (-weight[c][d], d))[:2]
        level = levels.get(c, ())
        if not dims and sum(map(bool, level)) > 1:
            solved = max(d for d, a in enumerate(level) if a)
            out[c] = [(tuple(level),) + _ordered(tuple(range(rank)))[:solved] + _ordered(tuple(range(rank)))[solved + 1:]]
        else:
            out[c] = [_ordered(tuple(d for d in range(rank) if d != k) + (k,)) for k in dims] or [_ordered(tuple(range(rank)))]
    return out


def summed_variables(rule: Rule) -> list[str]:
    head = rule.head.variables
    return [v for v in dict.fromkeys([r.var for r in rule.ranges] + sorted(rule.variables - head, key=str(rule).find)) if v not in head]


def build(rules: list[Rule], syntax: Syntax, levels: Levels, shapes: dict[str, tuple[int, ...]],
          chart_layouts: dict[str, list[Layout]], longest: bool = False, each: bool = False) -> Plan:
    """The plan at these input sizes (a ``ProgramError`` where it cannot express them); ``longest``:
    its goal only at the largest lengths these shapes allow, for a run whose every example has them
    (every goal item is computed: an alignment's ``A[n-1, m-1]`` at every ``(n, m)`` is a third of
    its items, a chain's goal ``N C`` terms where one length needs ``C``); ``each``: for a run given
    lengths, where the goal's box holds :data:`EACH` instances or more, the goal at each example's
    lengths only (:class:`PerExample`). Every plan tells the lengths allowed (:attr:`Plan.lengths`,
    :attr:`Plan.allowed`)."""
    labels = label_dims(rules, syntax)
    boxes = extents(rules, syntax, shapes, labels)
    charts = {r.head.name: len(r.head.indices) for r in rules}
    for c, rank in charts.items():
        boxes.setdefault(c, Space([0] * rank, [-1] * rank))
    for rule in rules:
        if boxes[rule.head.name].size == 0:  # an empty chart: is an index of this head free?
            box = bounds(rule, shapes, {c: sp for c, sp in boxes.items() if c != rule.head.name}, labels)
            free = [v for v in sorted(rule.head.variables) if not all(map(math.isfinite, box[v]))]
            if free:
                raise _unbounded(rule, free[0])
    boxes = _written(rules, syntax, shapes, boxes, labels)
    allowed = boxes[GOAL]
    if longest and syntax.lengths and allowed.size:
        boxes[GOAL] = Space(list(allowed.hi), list(allowed.hi))
    keys = {c: [c if k == 0 else f"{c}@{k}" for k in range(len(chart_layouts[c]))] for c in charts}
    stored = _stored(boxes)
    size = {key: _placement(stored[c].lo, stored[c].shape, layout)[2] for c in charts for key, layout in zip(keys[c], chart_layouts[c])}
    size.update({name: math.prod(s) for name, s in shapes.items()})
    posed: dict[tuple, tuple[Rule, System | None]] = {}
    systems = {i: sy for i, rule in enumerate(rules) if (sy := _remembered_system(rule, syntax, levels, shapes, boxes, posed)) is not None}
    extra, levels_at = _level_ranges(systems, levels)
    made: dict[tuple, tuple[Form, list[int | None]] | None] = {}
    forms = [f for i, sy in systems.items() if extra[i] is not None
             and (f := _remembered_form(i, sy, extra[i], levels_at(sy), syntax, shapes, stored, chart_layouts, keys, size, made)) is not None]
    rank = {c: k for k, c in enumerate(levels.strata)}
    phases: dict[int, list[Form]] = {}
    for f in sorted((f for f in forms if f.chart != GOAL), key=lambda f: (rank[f.chart], f.index)):
        phases.setdefault(levels.phases[f.chart], []).append(f)
    steps: list[list[Step]] = []
    for _, leveled in sorted(phases.items()):
        for tau in np.unique(np.concatenate([f.levels for f in leveled])):
            here = []
            for f in leveled:
                j = np.searchsorted(f.levels, tau)
                if j < f.levels.size and f.levels[j] == tau:
                    here.append(f.at(int(j)))
            steps.append(_writers(here))
    goal_forms = [f for f in forms if f.chart == GOAL]
    per_example = _per_example(goal_forms, boxes[GOAL]) if each and goal_forms and allowed.size * len(goal_forms) >= EACH else None
    if per_example is not None:
        goal_forms, per_example = per_example
        size.update({GOAL: 1, VALID: len(goal_forms), DELTAS: per_example.strides.shape[1]})
    goal = _writers([f.at(0) for f in goal_forms])
    if longest and not goal and allowed.size:  # (no goal at the largest lengths: the plan of every length tells where)
        return build(rules, syntax, levels, shapes, chart_layouts)
    if syntax.lengths:
        lengths = np.arange(allowed.lo[0], allowed.hi[0] + 1) if allowed.size else np.zeros(0, dtype=np.int64)
    else:
        lengths = np.zeros(1 if goal else 0, dtype=np.int64)
    if not goal:
        lengths = np.zeros(0, dtype=np.int64)
    looked_up: dict[str, int] = {}
    for rule in rules:
        for t in rule.terms:
            for d, ix in enumerate(t.indices):
                if isinstance(ix, Lookup):
                    looked_up[ix.name] = min(looked_up.get(ix.name, math.inf), shapes[t.name][d] - 1)
    return Plan(dict(shapes), boxes, chart_layouts, keys, steps, goal, lengths, list(syntax.lengths), allowed, size,
                _scans(steps, shapes), looked_up, per_example=per_example)


def _per_example(forms: list["Form"], goal: Space) -> tuple[list["Form"], PerExample] | None:
    """The goal's rules at one item each, their reads where they move with the lengths looked up
    (:class:`PerExample`); None where a rule's items do not move with the lengths, its masks tie
    their coordinates to the summed ones, or its reads look positions up that move with them."""
    strides = _placement(list(goal.lo), goal.shape, _ordered(tuple(range(len(goal.shape)))))[0]
    items, starts, on_items, deltas, out = [], [], [], [], []
    for j, f in enumerate(forms):
        nL, head = f.n_free, f.heads[0]
        if len(f.levels) != 1 or len(f.heads) != 1 or not nL:
            return None
        offset = int(head.offset[0])
        starts.append(len(items))
        for c in range(nL):
            d = next((d for d in range(len(strides)) if strides[d] == head.strides[c] and goal.shape[d] > 1), None)
            if d is None:
                return None
            items.append((d, goal.lo[d] + offset // strides[d] % goal.shape[d], int(f.sizes[c][0]), j))
        masks, needed = [], []
        for (e, op), need in zip(f.masks, f.needed):
            if not need[0]:
                continue
            if all(c < nL for c in e.coeffs):
                on_items.append((j, dict(e.coeffs), int(e.const[0]), op))
            elif any(c < nL for c in e.coeffs):
                return None
            else:
                masks.append((e, op))
                needed.append(need)
        reads = [Read(VALID, np.array([j]), (0,) * len(f.sizes), np.zeros(1, dtype=bool), len(forms))]
        for rd in f.reads:
            if rd is None or not any(rd.strides[:nL]):
                reads.append(rd)
                continue
            if any(any(lk.strides[:nL]) for _, lk in rd.lookups):
                return None
            index = Read(DELTAS, np.array([len(deltas)]), (0,) * len(rd.strides), np.zeros(1, dtype=bool), 0)
            deltas.append((starts[j], rd.strides[:nL]))
            reads.append(Read(rd.source, rd.offset, (0,) * nL + tuple(rd.strides[nL:]), np.ones(1, dtype=bool), rd.bound,
                              [*rd.lookups, (1, index)]))
        box = [np.ones(1, dtype=np.int64)] * nL + list(f.sizes[nL:])
        heads = [Read(GOAL, np.zeros(1, dtype=np.int64), (0,) * nL, np.zeros(1, dtype=bool), 1)]
        out.append(Form(f.rule, f.index, GOAL, f.levels, nL, box, reads, heads, masks, f.outer, needed))
    if not deltas:
        return None
    moves = np.zeros((len(items), len(deltas)), dtype=np.int64)
    for r, (first, by) in enumerate(deltas):
        moves[first: first + len(by), r] = by
    dims, bases, sizes, rule_of = (np.array(x, dtype=np.int64) for x in zip(*items))
    return out, PerExample(dims, bases, sizes, np.array(starts, dtype=np.int64), rule_of, on_items, moves)


def _stored(boxes: dict[str, Space]) -> dict[str, Space]:
    """The box each chart's buffers cover: the hull of the boxes of the charts of its rank, where
    that at most doubles its own, so that steps over different charts (Eisner's complete and
    incomplete spans) have the same strides and can be fused (:mod:`.fuse`). Positions outside a
    chart's own box are never written: they read as zero, as items no rule defines do."""
    hulls: dict[int, Space] = {}
    for c, sp in boxes.items():
        if c != GOAL and sp.size:
            h = hulls.get(len(sp.lo))
            hulls[len(sp.lo)] = sp if h is None else Space([min(a, b) for a, b in zip(h.lo, sp.lo)], [max(a, b) for a, b in zip(h.hi, sp.hi)])
    hull_size = {rank: h.size for rank, h in hulls.items()}
    return {c: hulls[len(sp.lo)] if c != GOAL and (n := sp.size) and hull_size[len(sp.lo)] <= 2 * n else sp for c, sp in boxes.items()}


def _chain(step: Step, shapes) -> tuple[View, View, View | None] | None:
    """(row, matrix, unary) where ``step`` is ``chart[l] = (⊕_k row[k] ⊗ matrix[k, l]) ⊗ unary[l]``,
    row read from the step's own chart; None otherwise."""
    f = step.form
    if step.masks or step.shared or f.n_free != 1 or len(step.K) != 1 or any(v is None or v.gather for v in step.reads):
        return None
    first_outer = len(step.reads) - f.outer
    inner, outer = step.reads[:first_outer], step.reads[first_outer:]
    rows = [v for v in inner if v.source not in shapes and v.strides[0] == 0 and v.strides[1]]
    mats = [v for v in inner if v.source in shapes and v.strides[0] and v.strides[1]]
    if len(inner) != 2 or len(rows) != 1 or len(mats) != 1 or len(outer) > 1 or rows[0].source.split("@")[0] != f.chart:
        return None
    if outer and (outer[0].source not in shapes or not outer[0].strides[0]):
        return None
    return rows[0], mats[0], outer[0] if outer else None


def _scans(levels: list[list[Step]], shapes) -> dict[int, Scan]:
    """Maximal runs of two or more consecutive chain levels of one rule, each reading the whole
    previous level, with sizes and level-to-level strides that do not change."""
    out: dict[int, Scan] = {}
    lev = 1
    while lev < len(levels):
        start = lev
        while lev < len(levels) and _reads_previous(levels, lev, shapes) and (
                lev == start or (levels[lev][0].form is levels[start][0].form and levels[lev][0].sizes == levels[start][0].sizes)):
            lev += 1
        if lev - start >= 2 and _uniform([lv[0] for lv in levels[start:lev]], shapes):
            out[start] = _scan(levels, start, lev, shapes)
        lev = max(lev, start + 1)
    return out


def _reads_previous(levels: list[list[Step]], lev: int, shapes) -> bool:
    """Whether level ``lev`` is one chain step whose row is the whole previous level, one step too."""
    if len(levels[lev]) != 1 or len(levels[lev - 1]) != 1:
        return False
    step, prev = levels[lev][0], levels[lev - 1][0]
    parts = _chain(step, shapes)
    if parts is None or prev.form.chart != step.form.chart:
        return False
    row = parts[0]
    written = next((h for h in prev.heads if h.source == row.source), None)
    return written is not None and (written.offset, written.strides, written.sizes) == (row.offset, row.strides[1:], row.sizes[1:])


def _uniform(steps: list[Step], shapes) -> bool:
    """Whether every view of the steps moves by the same offset from one level to the next."""
    parts = [_chain(s, shapes) for s in steps]
    views = [[p[1] for p in parts], *([[p[2] for p in parts]] if parts[0][2] else []), *zip(*[s.heads for s in steps])]
    return all(len(set(np.diff([v.offset for v in vs]).tolist())) == 1 for vs in views)


def _scan(levels: list[list[Step]], start: int, stop: int, shapes) -> Scan:
    first, second = levels[start][0], levels[start + 1][0]
    (row, mat, unary), (_, mat2, unary2) = _chain(first, shapes), _chain(second, shapes)
    T, (L, K) = stop - start, first.sizes
    init = View.strided(row.source, (K,), (row.strides[1],), row.offset, row.bound)
    matrix = View.strided(mat.source, (T, K, L), (mat2.offset - mat.offset, mat.strides[1], mat.strides[0]), mat.offset, mat.bound)
    uv = None if unary is None else View.strided(unary.source, (T, L), (unary2.offset - unary.offset, unary.strides[0]), unary.offset, unary.bound)
    heads = [View.strided(h.source, (T, L), (h2.offset - h.offset, h.strides[0]), h.offset, h.bound) for h, h2 in zip(first.heads, second.heads)]
    return Scan(start, stop, init, matrix, uv, heads)


def _level_ranges(systems: dict[int, System], levels: Levels, narrowing: int = 4
                  ) -> tuple[dict[int, list[Affine] | None], Callable[[System], np.ndarray]]:
    """Per rule, constraints that it reads every chart at the levels that chart has items at (None:
    it never fires), and a function giving the levels a rule fires at under them. A chart's box is
    a box, and its level a function of several indices: the box holds items at levels no rule
    writes (Eisner's spans with t < s), and without this the rules that read them would run there. The least fixpoint of "the levels the rules write, reading
    only levels written", approximated from above as in abstract interpretation: an increasing
    sweep where a bound that moves goes to infinity (the box then limits it), then a few
    decreasing sweeps (each keeps every level that has items)."""
    charts = set(levels.coeffs)
    empty = (math.inf, -math.inf)
    ranges: dict[str, tuple[float, float]] = {c: empty for c in charts}
    known: dict[tuple, np.ndarray] = {}  # per kind of system and ranges it reads: the last sweep and the plan ask again

    def levels_of(sy: System) -> np.ndarray:
        key = (sy.kind, *(ranges[c] for c, _, _ in sy.read_levels))
        if key not in known:
            extra = sy.reads(ranges)
            known[key] = _levels_of(sy, extra) if extra is not None else np.zeros(0, dtype=np.int64)
        return known[key]

    leveled = [sy for sy in systems.values() if sy.rule.head.name in charts]
    changed = True
    while changed:  # widening, each chart's range updated at once: a chain of charts settles in one pass
        changed = False
        for sy in leveled:
            taus, chart = levels_of(sy), sy.rule.head.name
            if not taus.size:
                continue
            (lo, hi), (olo, ohi) = (taus[0], taus[-1]), ranges[chart]
            new = (lo, hi) if olo > ohi else (-math.inf if lo < olo else olo, math.inf if hi > ohi else ohi)
            if new != ranges[chart]:
                ranges[chart], changed = new, True
    for _ in range(narrowing):  # narrowing: the levels every rule of a chart writes, within its range
        fresh = {c: empty for c in charts}
        for sy in leveled:
            taus, chart = levels_of(sy), sy.rule.head.name
            if taus.size:
                fresh[chart] = (min(fresh[chart][0], taus[0]), max(fresh[chart][1], taus[-1]))
        fresh = {c: (max(ranges[c][0], fresh[c][0]), min(ranges[c][1], fresh[c][1])) for c in charts}
        if fresh == ranges:
            break
        ranges = fresh
    return {i: sy.reads(ranges) for i, sy in systems.items()}, levels_of


def _written(rules: list[Rule], syntax: Syntax, shapes, boxes: dict[str, Space], labels, sweeps: int = 8) -> dict[str, Space]:
    """Per chart, the hull of the items its rules write, reading only items written (a decreasing
    iteration from the hull of every read and write): what lies outside is never defined, so a
    buffer need not hold it and a rule's box need not reach it."""
    for _ in range(sweeps):
        hulls: dict[str, list[list[float]]] = {c: [[math.inf, -math.inf] for _ in sp.lo] for c, sp in boxes.items()}
        for rule in rules:
            box = propagate(rule, constraints(rule, shapes, boxes, labels))
            if any(lo > hi for lo, hi in box.values()):
                continue
            h = hulls[rule.head.name]
            for d, ix in enumerate(rule.head.indices):
                lo, hi = index_hull(ix, box, syntax)
                h[d] = [min(lo, h[d][0]), max(hi, h[d][1])]
        new = {c: Space([int(lo) for lo, _ in h], [int(hi) for _, hi in h]) if all(lo <= hi for lo, hi in h)
               else Space([0] * len(h), [-1] * len(h)) for c, h in hulls.items()}
        if new == boxes:
            break
        boxes = new
    return boxes


def _writers(steps: list[Step]) -> list[Step]:
    """Mark the steps of one level that write items an earlier one wrote (by the heads' constants)."""
    by_chart: dict[str, list[Step]] = {}
    for step in steps:
        earlier = by_chart.setdefault(step.form.chart, [])
        for other in earlier:
            if _overlap(other.form.labels, step.form.labels):
                step.accumulate = step.shared = other.shared = True
        earlier.append(step)
    return steps


def _overlap(a: tuple, b: tuple) -> bool:
    """Whether two heads with these constants (None: a variable) can name the same item."""
    return all(x is None or y is None or x == y for x, y in zip(a, b))


@dataclass
class System:
    """A rule's constraints at these sizes, its level solved for one head variable."""

    rule: Rule
    cons: list[Affine]  # each >= 0
    unequal: list[Affine]  # each != 0
    indices: dict[int, list]  # id(term) -> its indices, the pinned variable substituted
    head_vars: list[str]  # the head's variables left (the L coordinates)
    order: list[str]  # every variable, head's first
    read_levels: list[tuple[str, Affine, Affine]]  # per leveled chart read: its name, the level read, minus it
    kind: int = 0  # systems of one kind are equal but for the names of the rule's charts (:func:`_rule_likeness`)

    def reads(self, ranges: dict[str, tuple[float, float]]) -> list[Affine] | None:
        """Constraints that every leveled chart the rule reads is read within the levels its items
        exist at (None: a chart read has no items)."""
        out = []
        for chart, lv, minus in self.read_levels:
            lo, hi = ranges[chart]
            if lo > hi:
                return None
            if math.isfinite(lo):
                out.append(lv.shifted(-int(lo)))
            if math.isfinite(hi):
                out.append(minus.shifted(int(hi)))
        return out


def _remembered_system(rule: Rule, syntax: Syntax, levels: Levels, shapes, boxes: dict[str, Space], posed: dict) -> System | None:
    """:func:`_system`, posed once per :func:`_rule_likeness` (as :func:`_remembered_form`);
    ``posed``: the systems of one plan so far, with the rule each was posed for."""
    like = _rule_likeness(rule, levels, shapes, boxes)
    found = posed.get(like, posed)
    if found is posed:
        sy = _system(rule, syntax, levels, shapes, boxes)
        if sy is not None:
            sy.kind = len(posed)
        found = posed[like] = rule, sy
    first, sy = found
    if sy is None or first is rule:
        return sy
    indices = {k: sy.indices[j] for k, j in zip(_indexed(rule), _indexed(first))}  # (by place: a term may occur twice)
    charts = [t.name for t in rule.terms if t.name in levels.coeffs]
    return System(rule, sy.cons, sy.unequal, indices, sy.head_vars, sy.order,
                  [(c, lv, minus) for c, (_, lv, minus) in zip(charts, sy.read_levels)], sy.kind)


def _indexed(rule: Rule) -> list[int]:
    """The ids :attr:`System.indices` is keyed by: the head, the terms, the indices looked up in them."""
    return [id(rule.head), *map(id, rule.terms), *(id(ix) for t in rule.terms for ix in t.indices if isinstance(ix, Lookup))]


def _rule_likeness(rule: Rule, levels: Levels, shapes, boxes: dict[str, Space]) -> tuple:
    """Everything :func:`_system` reads of a rule but the names of its charts: its indices, ranges
    and conditions, the order of its summed variables (by where they first occur in its text, which
    the names can move), its inputs' names and shapes, and its charts' boxes and level functions."""

    def term(t: Term) -> tuple | None:
        if t.is_one:
            return None
        ixs = _plain(t.indices) + tuple(_plain(ix.indices) for ix in t.indices if isinstance(ix, Lookup))
        if t.name in shapes:
            return t.name, shapes[t.name], ixs
        sp = boxes[t.name]
        return tuple(sp.lo), tuple(sp.hi), levels.coeffs.get(t.name), ixs

    return (rule.head.name == GOAL, tuple(summed_variables(rule)), rule.outer,
            tuple((r.var, r.lo.coeffs, r.lo.const, r.hi.coeffs, r.hi.const) for r in rule.ranges),
            tuple((c.left.coeffs, c.left.const, c.op, c.right.coeffs, c.right.const) for c in rule.conds),
            term(rule.head), *map(term, rule.reads))


def _system(rule: Rule, syntax: Syntax, levels: Levels, shapes, boxes: dict[str, Space]) -> System | None:
    """The rule's constraint system, or None where it has no instance at these sizes."""
    code = syntax.constants
    cons: list[Affine] = static_constraints(rule, syntax)
    for t in (rule.head, *rule.reads):
        if t.is_one:
            continue
        if t.name in shapes:
            bounds = [(0, s - 1) for s in shapes[t.name]]
        else:
            sp = boxes[t.name]
            bounds = list(zip(sp.lo, sp.hi))
        for ix, (lo, hi) in zip(t.indices, bounds):
            if isinstance(ix, Lookup):  # bounded by its data, checked when a run starts
                continue
            if isinstance(ix, Const):
                if not lo <= code[ix.name] <= hi:
                    if t.name in shapes:
                        raise rule.error(f"input {t.name!r} has {hi + 1} entries in this dimension; the constant "
                                         f"{ix.name} needs {code[ix.name] + 1}", t.col)
                    return None
                continue
            cons += [ix.shifted(-lo), scale(ix, -1).shifted(hi)]
    head = rule.head
    head_vars = list(dict.fromkeys(v for ix in head.indices for v in sorted(ix.variables)))
    summed = summed_variables(rule)
    unequal = [plus(c.left, c.right, -1) for c in rule.conds if c.op == "!="]
    indices = {id(t): list(t.indices) for t in (head, *rule.terms)}
    for t in rule.terms:
        for ix in t.indices:
            if isinstance(ix, Lookup):
                indices[id(ix)] = list(ix.indices)
    if head.name != GOAL:
        level = levels.of(head.name, head.indices)
        pinned = next((v for v in reversed(head_vars) if abs(coeff(level, v)) == 1), None)  # the last: strides stay positive
        if pinned is None:  # every item at one level
            cons += [plus(affine({TAU: 1}), level, -1), plus(level, affine({TAU: 1}), -1)]
        else:
            c = coeff(level, pinned)
            solved = scale(plus(affine({TAU: 1}), plus(level, affine({pinned: c}), -1), -1), c)  # c = ±1
            cons = [substitute(e, pinned, solved) for e in cons]
            unequal = [substitute(e, pinned, solved) for e in unequal]
            for k in indices:
                indices[k] = [ix if isinstance(ix, (Const, Lookup)) else substitute(ix, pinned, solved) for ix in indices[k]]
            head_vars.remove(pinned)
    order = head_vars + summed
    order += sorted({v for e in cons + unequal for v, _ in e.coeffs} - set(order) - {TAU})  # in conditions only: summed
    read_levels = [(t.name, lv, scale(lv, -1)) for t in rule.terms if t.name in levels.coeffs
                   for lv in [levels.of(t.name, indices[id(t)])]]
    return System(rule, cons, unequal, indices, head_vars, order, read_levels)


def _levels_of(sy: System, extra: list[Affine]) -> np.ndarray:
    """The levels at which the rule can have instances."""
    if sy.rule.head.name == GOAL:
        return np.zeros(1, dtype=np.int64)
    try:
        taus = _tau_range(sy.cons + extra)
    except Infeasible:
        return np.zeros(0, dtype=np.int64)
    if taus is None:
        raise sy.rule.error(f"cannot bound the levels of the items of chart {sy.rule.head.name!r} this rule writes")
    return taus


def _remembered_form(i: int, sy: System, extra: list[Affine], taus: np.ndarray, syntax: Syntax, shapes,
                     stored: dict[str, Space], chart_layouts, keys, size, made: dict) -> Form | None:
    """:func:`_form`, computed once per :func:`_likeness`: rules that differ only in the names of the
    charts they read and write (a chain of charts, a rule per label) share the computation, each
    its own charts' buffers. ``made``: the forms of one plan so far."""
    like = _likeness(sy, extra, taus, shapes, stored, chart_layouts, keys, size)
    found = made.get(like, made)
    if found is made:
        found = made[like] = _form(i, sy, extra, taus, syntax, shapes, stored, chart_layouts, keys, size)
    if found is None:
        return None
    form, which = found
    if form.rule is sy.rule:
        return form
    rule = sy.rule
    reads = [rd if k is None else Read(keys[t.name][k], rd.offset, rd.strides, rd.gather, rd.bound, rd.lookups)
             for t, rd, k in zip(rule.terms, form.reads, which)]
    heads = [Read(key, rd.offset, rd.strides, rd.gather, rd.bound, rd.lookups) for key, rd in zip(keys[rule.head.name], form.heads)]
    return Form(rule, i, rule.head.name, form.levels, form.n_free, form.sizes, reads, heads, form.masks, form.outer, form.needed)


def _likeness(sy: System, extra: list[Affine], taus: np.ndarray, shapes, stored: dict[str, Space], chart_layouts, keys,
              size) -> tuple:
    """Everything :func:`_form` reads of a rule but the names of its charts: its system's kind (the
    rule but those names, and the boxes of its charts), the levels it fires at, and its charts'
    buffers. Two rules alike in it have forms alike but for the charts' buffers."""

    def buffers(t: Term) -> tuple | None:
        if t.is_one or t.name in shapes:
            return None
        sp = stored[t.name]
        return tuple(sp.lo), sp.shape, tuple(chart_layouts[t.name]), tuple(size[k] for k in keys[t.name])

    return sy.kind, _plain(extra), taus.tobytes(), buffers(sy.rule.head), *map(buffers, sy.rule.terms)


def _plain(xs: list) -> tuple:
    """Affine forms as tuples of their coefficients and constant (hashed and compared without a
    Python call each; other indices as they are)."""
    return tuple((x.coeffs, x.const) if isinstance(x, Affine) else x for x in xs)


def _form(i: int, sy: System, extra: list[Affine], taus: np.ndarray, syntax: Syntax, shapes, stored: dict[str, Space],
          chart_layouts, keys, size) -> tuple[Form, list[int | None]] | None:
    """The rule at every level it fires at (``taus``, those ``extra`` allows), and per term the
    layout of its chart read (None: an input or the one); None where it never fires at these sizes
    (``stored``: the boxes the charts' buffers cover)."""
    code = syntax.constants
    rule, head, cons, unequal, indices = sy.rule, sy.rule.head, sy.cons + extra, sy.unequal, sy.indices
    head_vars, order = sy.head_vars, sy.order
    if taus.size == 0:
        return None
    sizes: list[np.ndarray] = []
    value: dict[str, Expr] = {}  # variable -> its base plus its coordinate
    exprs: dict[Affine, Expr] = {}  # remembered: constraints and indices repeat the same forms

    def to_expr(a: Affine) -> Expr:
        out = exprs.get(a)
        if out is None:
            out = Expr({}, coeff(a, TAU) * taus + a.const)  # (a new int64 vector over the levels)
            for v, k in a.coeffs:
                if v != TAU:
                    out = out.add(value[v], k)
            exprs[a] = out
        return out

    try:
        for j, v in enumerate(order):
            proj = project(cons, {TAU, *order[: j + 1]})
            lo_n, hi_n = bounds_of(project(proj, {TAU, v}), v)
            if not lo_n or not hi_n:
                raise _unbounded(rule, v)
            lo = reduce(np.maximum, [_ceil(to_expr(r).const, a) for r, a in lo_n])  # (np.max of a list: slower)
            hi = reduce(np.minimum, [_floor(to_expr(r).const, a) for r, a in hi_n])
            lower, upper = bounds_of(proj, v)
            relational = [to_expr(r) for r, a in lower if a == 1 and set(dict(r.coeffs)) - {TAU}]
            base = next((g for g in relational if (g.low(sizes) >= lo).all()
                         and all((g.add(o, -1).low(sizes) >= 0).all() for o in relational if o is not g)), Expr({}, lo))
            tops = [Expr({}, hi)] + [to_expr(r) for r, a in upper if a == 1 and set(dict(r.coeffs)) - {TAU}]
            span = reduce(np.minimum, [u.add(base, -1).high(sizes) for u in tops])
            if j < len(head_vars) and base.coeffs and (base.high(sizes) + span > hi).any():
                # A stripe of a head variable would write past its range (a triangle of two head
                # variables, ``s <= t``, sheared into a parallelogram): its range, and a mask, instead.
                base = Expr({}, lo)
                span = reduce(np.minimum, [u.add(base, -1).high(sizes) for u in tops])
            sizes.append(np.maximum(span + 1, 0))
            value[v] = base.add(Expr({j: 1}, np.zeros_like(taus)))
    except Infeasible:
        return None
    fires = reduce(np.logical_and, [s > 0 for s in sizes]) if sizes else np.ones(taus.shape, dtype=bool)
    checks = [to_expr(e) for e in cons]
    for e in checks:
        if not e.coeffs:
            fires &= e.const >= 0
    if not fires.any():
        return None
    n_free = len(head_vars)
    extent_of: dict[int, tuple[Expr, np.ndarray, np.ndarray]] = {}  # per form (kept, so that its id stays its own)

    def extent(e: Expr) -> tuple[np.ndarray, np.ndarray]:
        """The form's least and largest values over the box (once: the terms' indices repeat forms)."""
        if id(e) not in extent_of:
            extent_of[id(e)] = e, e.low(sizes), e.high(sizes)
        return extent_of[id(e)][1:]

    def position(t, layout: Layout, key: str) -> Read:
        if t.name in shapes:
            shape, lo = shapes[t.name], [0] * len(shapes[t.name])
        else:
            shape, lo = stored[t.name].shape, stored[t.name].lo
        st, base, _ = _placement(lo, shape, layout)
        offset = np.full(taus.shape, base, dtype=np.int64)
        strides = [0] * len(order)
        outside = np.zeros(taus.shape, dtype=bool)
        lookups = []
        for d, ix in enumerate(indices[id(t)]):
            if isinstance(ix, Lookup):  # a position read from data: gathered, per example
                lookups.append((st[d], position(ix, _ordered(tuple(range(len(shapes[ix.name])))), ix.name)))
                outside[:] = True
                continue
            e = Expr({}, np.full(taus.shape, code[ix.name], dtype=np.int64)) if isinstance(ix, Const) else to_expr(ix)
            offset = offset + st[d] * e.const
            for c, a in e.coeffs.items():
                strides[c] += st[d] * a
            low, high = extent(e)
            outside |= (low < lo[d]) | (high > lo[d] + shape[d] - 1)
        if any(s < 0 for s in strides):
            outside[:] = True
        return Read(key, offset, tuple(strides), outside, size[key], lookups)

    reads: list[Read | None] = []
    layout_of: list[int | None] = []
    inner = order[-1] if len(order) > n_free else None
    for t in rule.terms:
        if t.is_one:
            reads.append(None)
            layout_of.append(None)
        elif t.name in shapes:
            reads.append(position(t, _ordered(tuple(range(len(shapes[t.name])))), t.name))
            layout_of.append(None)
        else:
            perms, which = chart_layouts[t.name], 0
            if inner is not None:
                moved = [d for d, ix in enumerate(indices[id(t)]) if isinstance(ix, Affine) and abs(coeff(ix, inner)) == 1]
                which = next((k for k, p in enumerate(perms) if moved and _innermost(p) == moved[0]), 0)
            reads.append(position(t, perms[which], keys[t.name][which]))
            layout_of.append(which)
    heads = [position(head, perm, key) for perm, key in zip(chart_layouts[head.name], keys[head.name])]
    keep = np.flatnonzero(fires)
    if any(h.gather[keep].any() or any(h.strides[n_free:]) for h in heads):
        raise rule.error(f"the items of chart {head.name!r} this rule writes at one level do not form a box of indices "
                         "(a level's items are written as one strided view): write it as rules whose items do")
    for rd in [*reads, *heads]:
        if rd is not None:
            rd.offset, rd.gather = rd.offset[keep], rd.gather[keep]
    sizes = [s[keep] for s in sizes]
    kept: dict[tuple[int, str], tuple[Expr, str, np.ndarray]] = {}  # per form and op: a repeated constraint is one

    def mask(e: Expr, op: str) -> tuple[Expr, str, np.ndarray]:
        """The form at the levels kept, its op, and where the box holds instances it excludes."""
        if (id(e), op) not in kept:
            m = Expr(e.coeffs, e.const[keep])
            kept[id(e), op] = m, op, m.low(sizes) < 0 if op == ">=" else (m.low(sizes) <= 0) & (m.high(sizes) >= 0)
        return kept[id(e), op]

    masks = [mask(e, ">=") for e in checks if e.coeffs] + [mask(e, "!=") for e in map(to_expr, unequal)]
    return Form(rule, i, head.name, taus[keep], n_free, sizes, reads, heads, [(m, op) for m, op, _ in masks], rule.outer,
                [needed for _, _, needed in masks]), layout_of


def _unbounded(rule: Rule, var: str) -> ProgramError:
    return rule.error(f"cannot bound the index variable '{var}' of this rule for chart {rule.head.name!r}: no input, "
                      "chart extent, 'for' range or condition limits it", rule.column_of(var))


def _ceil(x: np.ndarray, a: int) -> np.ndarray:
    return -((-x) // a)


def _floor(x: np.ndarray, a: int) -> np.ndarray:
    return x // a


def _tau_range(cons: list[Affine]) -> np.ndarray | None:
    """The levels at which the constraints can hold (None: unbounded)."""
    only = project(cons, {TAU})
    lo, hi = bounds_of(only, TAU)
    if not lo or not hi:
        return None
    a = max(math.ceil(r.const / k) for r, k in lo)
    b = min(math.floor(r.const / k) for r, k in hi)
    return np.arange(a, b + 1, dtype=np.int64)
