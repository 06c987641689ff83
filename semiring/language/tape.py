"""The level tape: a program run as one autograd node with chart-sized memory.

Every chart lives in one flat buffer ``[*, B, box]`` indexed by its dense index box (``C[s, t, d]``
at ``(s * T + t) * D + d``), so a term read over many levels — ``C[s, u, R] for u in s..t-1`` — is
usually a strided view of that buffer, not a gather. The forward pass keeps nothing but the
buffers; the backward pass walks the levels in reverse, re-reads what each level read (views:
free) and adds its gradients into zero-initialized gradient buffers of the same layout in place.
In the Log semiring a level's vector-Jacobian product is written out (the softmax weights
``exp(a + b - out)`` of each ⊕, from the values the forward stored); other semirings, and levels
whose steps are not plain ⊕-of-⊗, recompute the level under a local autograd graph. Memory is the
buffers plus one level's temporaries: O(n²·B) for span programs, where saving every level's reads
would be O(n³·B).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..semirings import LogSemiring
from .schedule import Read, Schedule, Step
from .syntax import GOAL


@dataclass
class Access:
    """Positions ``[*shape]`` in a flat source ``[*, S]``: a strided view where they are affine with
    non-negative strides, an index otherwise."""

    shape: tuple[int, ...]
    offset: int
    strides: tuple[int, ...] | None  # None: not affine, use ``index``
    index: Tensor  # flat positions
    injective: bool  # the view (after summing its stride-0 dimensions) touches each position once

    @staticmethod
    def of(positions: np.ndarray) -> "Access":
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
        return Access(p.shape, offset, strides if affine else None, index, injective)

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
    heads: list[Access] | None  # per step where every item of the level is written by one step, else None
    items: dict[str, Access]  # chart -> where the level's items (block order) go
    manual: bool  # every step a plain ⊕ of ⊗ (no mask, no outer term) and direct writes: VJP by hand


class TapePlan:
    """The accesses of every read and write of a schedule, computed once per schedule."""

    def __init__(self, sch: Schedule):
        self.levels: list[LevelPlan] = []
        for lev, level in enumerate(sch.levels):
            reads = [[None if rd.kind == "one" else Access.of(rd.positions) for rd in st.reads] for st in level.steps]
            direct = all(asm.mask is None and (asm.index is None or asm.index.shape[1] == 1) for asm in level.charts.values())
            heads = [Access.of(st.heads) for st in level.steps] if direct else None
            items = {chart: Access.of(sch.items[(chart, lev)]) for chart in level.charts}
            manual = direct and all(st.mask is None and st.outer == 0 for st in level.steps)
            self.levels.append(LevelPlan(reads, heads, items, manual))
        self.goal = Access.of(sch.goal_positions)


def plan(sch: Schedule) -> TapePlan:
    if sch.tape is None:
        sch.tape = TapePlan(sch)
    return sch.tape


def forward(job, elements: list[Tensor]) -> tuple[Tensor, tuple]:
    """Run every level into the chart buffers; (goal ``[*, B]``, what the backward pass needs)."""
    sch, tp, lead = job.sch, plan(job.sch), job.lead
    sources = {name: x.reshape(*x.shape[: lead + 1], -1).contiguous() for name, x in zip(job.names, elements)}
    like = elements[0] if elements else torch.zeros(0)
    log = type(job.semiring) is LogSemiring
    for lev, level in enumerate(sch.levels):
        lp = tp.levels[lev]
        results = []
        for st, accesses in zip(level.steps, lp.reads):
            value = _log_step(st, accesses, sources) if log and lp.manual else None
            results.append(job.step(st, _reader(st, accesses, sources), like) if value is None else value)
        for st, value in zip(level.steps, results):
            if st.chart not in sources:
                sources[st.chart] = value.new_empty(*value.shape[:-1], sch.boxes[st.chart])
        if lp.heads is not None:
            for st, value, where in zip(level.steps, results, lp.heads):
                where.write(sources[st.chart], value)
        else:
            for chart, value in job.assemble(level, results).items():
                lp.items[chart].write(sources[chart], value)
    goal = job.select_goal(tp.goal.read(sources[GOAL]))
    return goal, (sources, [e.shape for e in elements])


def backward(job, state: tuple, grad: Tensor) -> list[Tensor]:
    """Gradients of the inputs (in their shapes), level by level in reverse, accumulated in place."""
    sch, tp = job.sch, plan(job.sch)
    sources, shapes = state
    grads = {name: torch.zeros_like(x) for name, x in sources.items()}
    goal = tp.goal.read(grads[GOAL])
    g_goal = torch.zeros_like(goal)
    if job.lengths is None:
        g_goal[..., -1] = grad
    else:
        g_goal.scatter_(-1, job.goal_index(g_goal), grad.unsqueeze(-1))
    tp.goal.add(grads[GOAL], g_goal)
    manual = type(job.semiring) is LogSemiring
    for lev in range(len(sch.levels) - 1, -1, -1):
        level, lp = sch.levels[lev], tp.levels[lev]
        if manual and lp.manual:
            for st, accesses, where in zip(level.steps, lp.reads, lp.heads):
                _log_vjp(st, accesses, where, sources, grads)
        else:
            _autograd_vjp(job, level, lp, sources, grads)
    return [grads[name].reshape(shape) for name, shape in zip(job.names, shapes)]


def _reader(st: Step, accesses: list[Access | None], sources: dict[str, Tensor]):
    where = {id(rd): acc for rd, acc in zip(st.reads, accesses)}
    return lambda rd: where[id(rd)].read(sources[rd.source])


def _log_step(st: Step, accesses: list[Access | None], sources: dict[str, Tensor]) -> Tensor | None:
    """One Log step ``logsumexp_K(Σ reads)`` -> ``[B, L]`` (or broadcastable to it) in place on
    one temporary; None where the generic step must run (no read, or every read broadcast over K)."""
    vals = [acc.read(sources[rd.source]) for rd, acc in zip(st.reads, accesses) if acc is not None]
    if not vals or all(v.shape[-1] != st.K for v in vals):
        return None
    s = vals[0] + vals[1] if len(vals) > 1 else vals[0].clone()
    for v in vals[2:]:
        s = s + v
    if st.K == 1:
        return s.squeeze(-1)
    info = torch.finfo(s.dtype)
    m = s.amax(-1, keepdim=True).clamp_(info.min, info.max)  # a row of -inf (or +inf) stays so
    return s.sub_(m).exp_().sum(-1).log_().add_(m.squeeze(-1))


def _log_vjp(st: Step, accesses: list[Access | None], where: Access, sources, grads) -> None:
    """One Log step ``out = logsumexp_K(⊗ reads)``: each read gets ``exp(Σ reads - out) * g``."""
    used = [(rd, acc) for rd, acc in zip(st.reads, accesses) if acc is not None]
    if not used:
        return
    g = where.read(grads[st.chart])
    if st.K == 1:  # out is the sum itself: the gradient passes unchanged
        w = g.unsqueeze(-1)
    else:
        vals = [acc.read(sources[rd.source]) for rd, acc in used]
        w = vals[0] + vals[1] if len(vals) == 2 else vals[0].clone()
        for v in vals[2:]:
            w += v
        info = torch.finfo(w.dtype)
        out = where.read(sources[st.chart]).clamp(info.min, info.max)  # -inf: every term is -inf, w = 0
        w.sub_(out.unsqueeze(-1)).exp_().mul_(g.unsqueeze(-1))
    for rd, acc in used:
        acc.add(grads[rd.source], w)


def _autograd_vjp(job, level, lp: LevelPlan, sources, grads) -> None:
    """Recompute one level under a local autograd graph and add its gradients to the buffers."""
    leaves: list[tuple[Read, Access, Tensor]] = []

    def reader(st: Step, accesses: list[Access | None]):
        where = {id(rd): acc for rd, acc in zip(st.reads, accesses)}

        def read(rd: Read) -> Tensor:
            t = where[id(rd)].read(sources[rd.source]).detach().requires_grad_()
            leaves.append((rd, where[id(rd)], t))
            return t
        return read

    like = next(iter(sources.values()))
    with torch.enable_grad():
        results = [job.step(st, reader(st, acc), like) for st, acc in zip(level.steps, lp.reads)]
        if lp.heads is not None:
            outs = [(v, where.read(grads[st.chart])) for st, v, where in zip(level.steps, results, lp.heads)]
        else:
            outs = [(v, lp.items[c].read(grads[c])) for c, v in job.assemble(level, results).items()]
    outs = [(v, g) for v, g in outs if v.requires_grad]
    if not outs or not leaves:
        return
    found = torch.autograd.grad([v for v, _ in outs], [t for _, _, t in leaves], [g for _, g in outs], allow_unused=True)
    for (rd, acc, _), g in zip(leaves, found):
        if g is not None:
            acc.add(grads[rd.source], g)
