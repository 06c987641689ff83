"""The level tape: a program run as one autograd node with chart-sized memory.

Every chart lives in flat buffers ``[*, B, box]`` indexed by its dense index box, one per layout
(an order of the box's dimensions, :class:`TapePlan`): ``C[s, t, d]`` at ``(s * D + d) * T + t``
for the reads ``C[s, u, R] for u in s..t-1`` and at ``(t * D + d) * S + s`` for ``C[u, t, L]``,
so a term read over many levels is a unit-stride view of one buffer, not a gather. The forward
pass keeps nothing but the buffers; the backward pass walks the levels in reverse, re-reads what
each level read (views: free) and adds its gradients into zero-initialized gradient buffers of
the same layouts in place (a level's gradient is the sum over its chart's layouts).
In the Log and Max semirings a level's vector-Jacobian product is written out (Log: the softmax
weights ``exp(a + b - out)`` of each ⊕, from the values the forward stored; Max: the gradient
routed to the first maximum of each slice it reaches); other semirings, and levels
whose steps are not plain ⊕-of-⊗ (an outer term, a write gathered from several steps), recompute
the level under a local autograd graph. The written-out passes are plain torch operations, so
they also run on forward-mode dual tensors: that is how the Hessian-vector products of
:class:`semiring.language.program._TapeGradient` are computed. Memory is the
buffers plus one level's temporaries: O(n²·B) for span programs, where saving every level's reads
would be O(n³·B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..semirings import LogSemiring, MaxSemiring
from .schedule import Read, Schedule, Step
from .syntax import GOAL


@dataclass
class Access:
    """Positions ``[*shape]`` in a flat source ``[*, S]``: a strided view where they are affine with
    non-negative strides, an index otherwise. ``source``: the buffer's key (a chart in one of its
    layouts, or an input)."""

    shape: tuple[int, ...]
    offset: int
    strides: tuple[int, ...] | None  # None: not affine, use ``index``
    index: Tensor  # flat positions
    injective: bool  # the view (after summing its stride-0 dimensions) touches each position once
    source: str = ""

    @staticmethod
    def of(positions: np.ndarray, source: str = "") -> "Access":
        p = np.asarray(positions, dtype=np.int64)
        index = torch.from_numpy(p.reshape(-1).copy())
        offset = int(p.flat[0]) if p.size else 0
        strides = tuple(int(p[tuple(1 if j == i else 0 for j in range(p.ndim))] - offset) if s > 1 else 0
                        for i, s in enumerate(p.shape))
        grid = offset + sum(s * np.arange(n).reshape([-1 if j == i else 1 for j in range(p.ndim)])
                            for i, (s, n) in enumerate(zip(strides, p.shape)))
        affine = p.size > 0 and min(strides) >= 0 and np.array_equal(p, np.broadcast_to(grid, p.shape))
        kept = p[tuple(slice(None) if s or n == 1 else slice(0, 1) for s, n in zip(strides, p.shape))] if affine else p
        injective = np.unique(kept).size == kept.size
        return Access(p.shape, offset, strides if affine else None, index, injective, source)

    def _view(self, src: Tensor, shape: tuple[int, ...], strides: tuple[int, ...]) -> Tensor:
        return src.as_strided((*src.shape[:-1], *shape), (*src.stride()[:-1], *strides), src.storage_offset() + self.offset)

    def read(self, src: Tensor) -> Tensor:
        """``src [*, S]`` (contiguous in S) -> ``[*, *shape]``."""
        if self.strides is not None:
            return self._view(src, self.shape, self.strides)
        return src.index_select(-1, self.index.to(src.device)).reshape(*src.shape[:-1], *self.shape)

    def write(self, dst: Tensor, values: Tensor) -> None:
        """``dst[..., positions] = values`` (positions distinct)."""
        if self.strides is not None:
            self._view(dst, self.shape, self.strides).copy_(values)
        else:
            dst.index_copy_(-1, self.index.to(dst.device), values.reshape(*values.shape[: dst.dim() - 1], -1))

    def add(self, dst: Tensor, g: Tensor) -> None:
        """``dst[..., positions] += g`` with repeated positions accumulated; ``g [*, *shape]`` may
        have a larger batch than ``dst`` (a batch of 1 is shared: summed over)."""
        lead = dst.dim() - 1
        if g.shape[:lead] != dst.shape[:lead]:
            g = g.sum([i for i in range(lead) if dst.shape[i] == 1 and g.shape[i] != 1], keepdim=True)
        if self.strides is not None and self.injective:
            wide = [lead + i for i, (s, n) in enumerate(zip(self.strides, self.shape)) if s == 0 and n > 1]
            if wide:
                g = g.sum(wide, keepdim=True)
            shape = tuple(1 if s == 0 else n for s, n in zip(self.strides, self.shape))
            self._view(dst, shape, self.strides).add_(g.expand(*g.shape[:lead], *shape))
        else:
            dst.index_add_(-1, self.index.to(dst.device), g.expand(*g.shape[:lead], *self.shape).reshape(*g.shape[:lead], -1))


@dataclass
class LevelPlan:
    reads: list[list[Access | None]]  # per step, per read (None: the semiring one)
    heads: list[list[Access]] | None  # per step, per layout of its chart, where every item of the level is written by one step; else None
    items: dict[str, list[Access]]  # chart -> per layout, where the level's items (block order) go
    manual: bool  # every step a plain ⊕ of ⊗ (no outer term) and direct writes: VJP by hand


class TapePlan:
    """The accesses of every read and write of a schedule, computed once per schedule.

    A chart is kept in one or two layouts of its index box (its dimensions permuted): each read over
    K instances uses the layout where its K instances are adjacent, so that it is a unit-stride
    view (``C[s, u]`` for every u: the layout with the second index innermost; ``C[u, t]``: the
    first), which torch's vectorized kernels need; every level's items are written to each layout."""

    def __init__(self, sch: Schedule):
        self.layouts = _layouts(sch)  # chart -> permutations of its box dimensions, outermost first
        self.keys = {chart: [_key(chart, k) for k in range(len(perms))] for chart, perms in self.layouts.items()}
        self.levels: list[LevelPlan] = []
        for lev, level in enumerate(sch.levels):
            reads = [[self._read(sch, rd) for rd in st.reads] for st in level.steps]
            direct = all(asm.mask is None and (asm.index is None or asm.index.shape[1] == 1) for asm in level.charts.values())
            heads = [self._everywhere(sch, st.chart, st.heads) for st in level.steps] if direct else None
            items = {chart: self._everywhere(sch, chart, sch.items[(chart, lev)]) for chart in level.charts}
            manual = direct and all(st.outer == 0 for st in level.steps)
            self.levels.append(LevelPlan(reads, heads, items, manual))
        self.goal = Access.of(_permute(sch.goal_positions, sch.shapes[GOAL], self.layouts[GOAL][0]), self.keys[GOAL][0])

    def _read(self, sch: Schedule, rd: Read) -> Access | None:
        if rd.kind == "one":
            return None
        if rd.kind == "input":
            return Access.of(rd.positions, rd.source)
        perms = self.layouts[rd.source]
        k = _inner_dim(rd.positions, sch.shapes[rd.source])
        which = next((i for i, perm in enumerate(perms) if perm[-1] == k), 0)
        return Access.of(_permute(rd.positions, sch.shapes[rd.source], perms[which]), self.keys[rd.source][which])

    def _everywhere(self, sch: Schedule, chart: str, positions: np.ndarray) -> list[Access]:
        return [Access.of(_permute(positions, sch.shapes[chart], perm), key)
                for perm, key in zip(self.layouts[chart], self.keys[chart])]


def _key(chart: str, k: int) -> str:
    return chart if k == 0 else f"{chart}@{k}"


def _inner_dim(positions: np.ndarray, shape: tuple[int, ...]) -> int | None:
    """The box dimension that alone advances by 1 from a read's first instance to its second
    (None: K = 1, or no single such dimension)."""
    if positions.ndim < 2 or positions.shape[-1] < 2 or not shape:
        return None
    coords = np.unravel_index(positions.reshape(-1, positions.shape[-1])[0, :2], shape)
    moved = [d for d, c in enumerate(coords) if c[0] != c[1]]
    return moved[0] if len(moved) == 1 and coords[moved[0]][1] - coords[moved[0]][0] == 1 else None


def _layouts(sch: Schedule) -> dict[str, list[tuple[int, ...]]]:
    """Per chart, one or two permutations of its box dimensions (outermost first): one with the
    dimension most K-instances advance along innermost, and one for the next such dimension, if any."""
    weight: dict[str, dict[int, int]] = {chart: {} for chart in sch.shapes}
    for level in sch.levels:
        for st in level.steps:
            for rd in st.reads:
                if rd.kind == "chart" and rd.positions is not None:
                    k = _inner_dim(rd.positions, sch.shapes[rd.source])
                    if k is not None:
                        weight[rd.source][k] = weight[rd.source].get(k, 0) + rd.positions.size
    out = {}
    for chart, shape in sch.shapes.items():
        dims = sorted(weight[chart], key=lambda d: -weight[chart][d])[:2]
        out[chart] = [tuple(d for d in range(len(shape)) if d != k) + (k,) for k in dims] or [tuple(range(len(shape)))]
    return out


def _permute(positions: np.ndarray, shape: tuple[int, ...], perm: tuple[int, ...]) -> np.ndarray:
    """Row-major box positions -> the positions of the same items with the dimensions in ``perm`` order."""
    if perm == tuple(range(len(shape))):
        return positions
    coords = np.unravel_index(np.asarray(positions, dtype=np.int64), shape)
    return np.ravel_multi_index([coords[d] for d in perm], [shape[d] for d in perm]).astype(np.int64)


def plan(sch: Schedule) -> TapePlan:
    if sch.tape is None:
        sch.tape = TapePlan(sch)
    return sch.tape


def forward(job, elements: list[Tensor], dual: bool = False) -> tuple[Tensor, tuple]:
    """Run every level into the chart buffers; (goal ``[*, B]``, what the backward pass needs).
    ``dual``: the elements are forward-mode dual tensors (see :data:`_DUAL`)."""
    sch, tp, lead = job.sch, plan(job.sch), job.lead
    sources = {name: x.reshape(*x.shape[: lead + 1], -1).contiguous() for name, x in zip(job.names, elements)}
    like = elements[0] if elements else torch.zeros(0)
    manual = (_DUAL if dual else _MANUAL).get(type(job.semiring))
    for lev, level in enumerate(sch.levels):
        lp = tp.levels[lev]
        results = []
        for st, accesses in zip(level.steps, lp.reads):
            value = manual[0](st, accesses, sources) if manual and lp.manual else None
            results.append(job.step(st, _reader(st, accesses, sources), like) if value is None else value)
        for st, value in zip(level.steps, results):
            if st.chart not in sources:
                for key in tp.keys[st.chart]:
                    sources[key] = value.new_empty(*value.shape[:-1], sch.boxes[st.chart])
        if lp.heads is not None:
            for value, wheres in zip(results, lp.heads):
                for where in wheres:
                    where.write(sources[where.source], value)
        else:
            for chart, value in job.assemble(level, results).items():
                for where in lp.items[chart]:
                    where.write(sources[where.source], value)
    goal = job.select_goal(tp.goal.read(sources[tp.goal.source]))
    return goal, (sources, [e.shape for e in elements])


def backward(job, state: tuple, grad: Tensor, dual: bool = False) -> list[Tensor]:
    """Gradients of the inputs (in their shapes), level by level in reverse, accumulated in place."""
    sch, tp = job.sch, plan(job.sch)
    sources, shapes = state
    grads = {name: torch.zeros_like(x) for name, x in sources.items()}
    goal = tp.goal.read(grads[tp.goal.source])
    g_goal = torch.zeros_like(goal)
    if job.lengths is None:
        g_goal[..., -1] = grad
    else:
        g_goal.scatter_(-1, job.goal_index(g_goal), grad.unsqueeze(-1))
    tp.goal.add(grads[tp.goal.source], g_goal)
    manual = (_DUAL if dual else _MANUAL).get(type(job.semiring))
    for lev in range(len(sch.levels) - 1, -1, -1):
        level, lp = sch.levels[lev], tp.levels[lev]
        if manual and lp.manual:
            for st, accesses, wheres in zip(level.steps, lp.reads, lp.heads):
                manual[1](st, accesses, wheres, sources, grads)
        else:
            _autograd_vjp(job, level, lp, sources, grads)
    return [grads[name].reshape(shape) for name, shape in zip(job.names, shapes)]


def _reader(st: Step, accesses: list[Access | None], sources: dict[str, Tensor]):
    where = {id(rd): acc for rd, acc in zip(st.reads, accesses)}
    return lambda rd: where[id(rd)].read(sources[where[id(rd)].source])


def _gradient(wheres: list[Access], grads: dict[str, Tensor]) -> Tensor:
    """The gradient of a level's items: the sum over the layouts their readers added into."""
    g = wheres[0].read(grads[wheres[0].source])
    for where in wheres[1:]:
        g = g + where.read(grads[where.source])
    return g


def _terms(st: Step, accesses: list[Access | None], sources: dict[str, Tensor]) -> Tensor | None:
    """``Σ reads`` ``[*, B, L, K]`` (or broadcastable to it) of one plain step, on a fresh tensor,
    ``-inf`` (the zero of both semirings written out) where the step's mask has no instance; None
    where the generic step must run (no read, or every read broadcast over K)."""
    vals = [acc.read(sources[acc.source]) for acc in accesses if acc is not None]
    if not vals or all(v.shape[-1] != st.K for v in vals):
        return None
    s = vals[0] + vals[1] if len(vals) > 1 else vals[0].clone()
    for v in vals[2:]:
        s = s + v
    if st.mask is not None:
        s = s.masked_fill(~st.mask.to(s.device), -math.inf)
    return s


def _manual(reduce, weights):
    """``(step, vjp)`` of a plain step ``out = ⊕_K(⊗ reads)`` written out for one semiring:
    ``reduce(terms [*, B, L, K]) -> out [*, B, L]`` (may work in place on ``terms``) and
    ``weights(terms, out, g) -> [*, B, L, K]`` (the gradient of each term, or None when it is all
    zero). K = 1 needs neither: ``out`` is the term and the gradient passes unchanged."""

    def step(st: Step, accesses: list[Access | None], sources: dict[str, Tensor]) -> Tensor | None:
        terms = _terms(st, accesses, sources)
        if terms is None:  # the generic step must run
            return None
        return terms.squeeze(-1) if st.K == 1 else reduce(terms)

    def vjp(st: Step, accesses: list[Access | None], wheres: list[Access], sources, grads) -> None:
        used = [acc for acc in accesses if acc is not None]
        if not used:
            return
        g = _gradient(wheres, grads)
        if st.K == 1:
            w = g.unsqueeze(-1)
        else:
            w = weights(_terms(st, accesses, sources), wheres[0].read(sources[wheres[0].source]), g)
            if w is None:
                return
        for acc in used:
            acc.add(grads[acc.source], w)

    return step, vjp


def _logsumexp_(terms: Tensor, dual: bool = False) -> Tensor:
    """Log ⊕ over the last dimension, in place on ``terms``. ``dual``: forward-mode dual tensors,
    whose derivative must be 0, not 0/0, where every term is -inf (an item without derivations):
    a NaN tangent there would spread to every item that reads it, through ``exp(-inf) * NaN``."""
    info = torch.finfo(terms.dtype)
    m = terms.amax(-1, keepdim=True).clamp_(info.min, info.max)  # a row of -inf (or +inf) stays so
    s = terms.sub_(m).exp_().sum(-1)
    if not dual:
        return s.log_().add_(m.squeeze(-1))
    empty = s == 0
    return s.masked_fill_(empty, 1.0).log_().masked_fill_(empty, -math.inf).add_(m.squeeze(-1))


def _softmax_weights(terms: Tensor, out: Tensor, g: Tensor) -> Tensor:
    """Log: ``exp(terms - out) * g``, in place on ``terms``."""
    info = torch.finfo(terms.dtype)
    out = out.clamp(info.min, info.max)  # -inf: every term is -inf, the weights are 0
    return terms.sub_(out.unsqueeze(-1)).exp_().mul_(g.unsqueeze(-1))


def _argmax_weights(terms: Tensor, out: Tensor, g: Tensor) -> Tensor | None:
    """Max: ``g`` at the first maximum of each slice (as :class:`~semiring.semirings.MaxSemiring`),
    computed only where ``g`` is nonzero."""
    shape = torch.broadcast_shapes(terms.shape[:-1], g.shape)
    terms, g = terms.expand(*shape, terms.shape[-1]), g.expand(shape)
    hit = (g != 0).nonzero(as_tuple=True)
    if hit[0].numel() == 0:
        return None
    w = torch.zeros_like(terms)
    w[(*hit, terms[hit].argmax(-1))] = g[hit]
    return w


_MANUAL = {LogSemiring: _manual(_logsumexp_, _softmax_weights),
           MaxSemiring: _manual(lambda terms: terms.amax(-1), _argmax_weights)}
_DUAL = {LogSemiring: _manual(lambda terms: _logsumexp_(terms, dual=True), _softmax_weights)}  # on dual tensors


def _autograd_vjp(job, level, lp: LevelPlan, sources, grads) -> None:
    """Recompute one level under a local autograd graph and add its gradients to the buffers."""
    leaves: list[tuple[Access, Tensor]] = []

    def reader(st: Step, accesses: list[Access | None]):
        where = {id(rd): acc for rd, acc in zip(st.reads, accesses)}

        def read(rd: Read) -> Tensor:
            acc = where[id(rd)]
            t = acc.read(sources[acc.source]).detach().requires_grad_()
            leaves.append((acc, t))
            return t
        return read

    like = next(iter(sources.values()))
    with torch.enable_grad():
        results = [job.step(st, reader(st, acc), like) for st, acc in zip(level.steps, lp.reads)]
        if lp.heads is not None:
            outs = [(v, _gradient(wheres, grads)) for v, wheres in zip(results, lp.heads)]
        else:
            outs = [(v, _gradient(lp.items[c], grads)) for c, v in job.assemble(level, results).items()]
    outs = [(v, g) for v, g in outs if v.requires_grad]
    if not outs or not leaves:
        return
    found = torch.autograd.grad([v for v, _ in outs], [t for _, t in leaves], [g for _, g in outs], allow_unused=True)
    for (acc, _), g in zip(leaves, found):
        if g is not None:
            acc.add(grads[acc.source], g)
