"""Scheduling: from a grounding to a list of vectorized steps.

Each level becomes, per rule, one *step*: a table ``[L, K]`` of instances (L head items, K
instances each, padded), every term read as a ``[*, B, L, K]`` tensor from the chart levels or
input chunks it needs, ⊗-multiplied and ⊕-reduced over K. Reads are views (reshape, transpose,
broadcast of a contiguous range) whenever the index table allows, a gather otherwise. Inputs are
split once into per-level chunks, so the backward pass never builds a full-size gradient per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .grounding import Grounding
from .syntax import GOAL


@dataclass
class Read:
    kind: str  # "one" | "chart" | "input"
    source: str = ""
    levels: tuple[int, ...] = ()  # chart: the source levels, concatenated in this order
    pattern: str = "gather"  # reshape | transpose | row | col | gather
    offset: int = 0
    index: torch.Tensor | None = None  # gather: flat positions, L*K of them (into the concatenated levels)
    L: int = 0  # the step's table: L head items, K instances each
    K: int = 0
    positions: np.ndarray | None = None  # [L, K]: each instance's item in the chart's box (or entry of the input)


@dataclass
class Step:
    rule: int
    chart: str
    L: int
    K: int
    reads: list[Read]
    mask: torch.Tensor | None  # [L, K] bool, where instances are real (None: all are)
    outer: int = 0  # the last ``outer`` reads are [L, 1]: ⊗-multiplied after the ⊕ over K
    heads: np.ndarray | None = None  # [L]: the head items' positions in the chart's box


@dataclass
class Assembly:
    """How a chart's items at one level are gathered from the steps that write them."""

    steps: list[int]  # indices into Level.steps, concatenated in this order
    index: torch.Tensor | None  # [M, J] positions in the concatenation; None: a single step writes all, in order
    mask: torch.Tensor | None  # [M, J]


@dataclass
class Level:
    steps: list[Step] = field(default_factory=list)
    charts: dict[str, Assembly] = field(default_factory=dict)


@dataclass
class Run:
    """Levels ``start..stop-1`` of a chain program: each computes ``chart`` at one level as one ``dot``
    of the whole previous level (``K`` items) with a ``K × L`` matrix of ``matrix`` (from-index
    first) — its own chunk per level, from ``offset`` on in the flat input, or the whole input at
    every level (``shared``) — then ⊗ its chunk of ``unary`` (``L`` entries from ``unary_offset``),
    if any. They run as one ``Semiring.scan``."""

    chart: str
    matrix: str
    shared: bool
    unary: str | None
    start: int
    stop: int
    K: int
    L: int
    offset: int = 0
    unary_offset: int = 0


@dataclass
class Schedule:
    levels: list[Level]
    chunks: dict[str, tuple[torch.Tensor | None, list[int] | None]]  # input -> (order or None, size per level; None: not split)
    goal_level: int
    lengths: np.ndarray
    offsets: dict[tuple[str, int], tuple[int, int]]  # (chart, level) -> (start, size) of its block among the chart's levels
    runs: dict[int, Run] = field(default_factory=dict)  # first level -> a run of chain levels
    boxes: dict[str, int] = field(default_factory=dict)  # chart -> size of its dense index box
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # chart -> shape of its dense index box
    items: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)  # (chart, level) -> its items' box positions, in block order
    goal_positions: np.ndarray | None = None  # box positions of the goal at each of ``lengths``
    tape: object = None  # the level tape's accesses (``tape.plan``), built on first use

    gathers_levels: bool = False  # some read before the goal spans several levels (span programs)


def _pattern(idx: np.ndarray, size: int) -> tuple[str, int]:
    L, K = idx.shape
    n = L * K
    if n == size and np.array_equal(idx.ravel(), np.arange(n)):
        return "reshape", 0
    if n == size and np.array_equal(idx.T.ravel(), np.arange(n)):
        return "transpose", 0
    off = int(idx[0, 0])
    if (idx == idx[:1]).all() and np.array_equal(idx[0], off + np.arange(K)):
        return "row", off
    if (idx == idx[:, :1]).all() and np.array_equal(idx[:, 0], off + np.arange(L)):
        return "col", off
    return "gather", 0


def schedule(gr: Grounding, rule_charts: list[str]) -> Schedule:
    level = gr.level.copy()
    top = int(level.max()) + 1 if level.size else 0
    goal_ids = gr.offsets[GOAL] + np.arange(gr.charts[GOAL].size)
    level[goal_ids[level[goal_ids] >= 0]] = top  # the goal is read by nothing: compute it last, at once
    nlev = top + 1
    total = level.shape[0]
    # position of every item within its (chart, level) block
    chart_id = gr.chart_of(np.arange(total))
    order = np.lexsort((np.arange(total), level, chart_id))
    pos = np.zeros(total, dtype=np.int64)
    key = chart_id[order] * (nlev + 1) + level[order]
    starts = np.r_[0, np.flatnonzero(np.diff(key)) + 1]
    block_start = np.repeat(starts, np.diff(np.r_[starts, total]))
    pos[order] = np.arange(total) - block_start
    block_size: dict[tuple[int, int], int] = {}
    for s, e in zip(starts, np.r_[starts[1:], total]):
        block_size[(int(chart_id[order[s]]), int(level[order[s]]))] = int(e - s)
    names = list(gr.offsets)
    offsets: dict[tuple[str, int], tuple[int, int]] = {}
    chart_sizes: dict[str, int] = {}
    for (cid, lev), size in sorted(block_size.items()):
        if lev < 0:
            continue
        name = names[cid]
        offsets[(name, lev)] = (chart_sizes.get(name, 0), size)
        chart_sizes[name] = chart_sizes.get(name, 0) + size

    # group instances: (rule, level) -> table
    tables: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    input_entries: dict[str, dict[int, list[np.ndarray]]] = {}
    for r, g in enumerate(gr.grounds):
        if g.head.size == 0:
            continue
        hl = level[g.head]
        o = np.lexsort((np.arange(g.head.size), g.head, hl))
        hl_sorted = hl[o]
        bounds = np.r_[0, np.flatnonzero(np.diff(hl_sorted)) + 1, o.size]
        for a, b in zip(bounds[:-1], bounds[1:]):
            inst = o[a:b]
            heads = g.head[inst]
            uniq, first, counts = np.unique(heads, return_index=True, return_counts=True)
            K = int(counts.max())
            slot = np.arange(inst.size) - np.repeat(first, counts)
            table = np.full((uniq.size, K), -1, dtype=np.int64)
            table[np.repeat(np.arange(uniq.size), counts), slot] = inst
            lev = int(hl_sorted[a])
            tables[(r, lev)] = (uniq, table, counts)
            for t, rd in zip(g.rule.terms, g.reads):
                if rd is not None and t.name in gr.input_shapes:
                    input_entries.setdefault(t.name, {}).setdefault(lev, []).append(rd[inst])

    chunks: dict[str, tuple[torch.Tensor | None, list[int] | None]] = {}
    chunk_entries: dict[tuple[str, int], np.ndarray] = {}
    for name, shape in gr.input_shapes.items():
        per = input_entries.get(name, {})
        numel = int(np.prod(shape, dtype=np.int64))
        read = [np.unique(np.concatenate(v)) for v in per.values()]
        if len(read) > 1 and sum(r.size for r in read) > numel:  # entries read at several levels: never split
            for lev in range(nlev):
                chunk_entries[(name, lev)] = np.arange(numel)
            chunks[name] = (None, None)
            continue
        parts, sizes = [], []
        for lev in range(nlev):
            e = np.unique(np.concatenate(per[lev])) if lev in per else np.zeros(0, dtype=np.int64)
            chunk_entries[(name, lev)] = e
            parts.append(e)
            sizes.append(e.size)
        full = np.concatenate(parts)
        same = full.size == numel and np.array_equal(full, np.arange(numel))
        chunks[name] = (None if same else torch.from_numpy(full), sizes)

    levels = [Level() for _ in range(nlev)]
    writes: dict[tuple[str, int], list[tuple[int, np.ndarray]]] = {}
    for (r, lev), (uniq, table, counts) in sorted(tables.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        g = gr.grounds[r]
        L, K = table.shape
        real = table >= 0
        safe = np.where(real, table, table[:, :1])
        reads = []
        first_outer = len(g.rule.terms) - g.rule.outer
        for j, (t, rd) in enumerate(zip(g.rule.terms, g.reads)):
            K = 1 if j >= first_outer else table.shape[1]
            if rd is None:
                reads.append(Read("one", L=L, K=K))
                continue
            vals = rd[safe[:, :K]]
            if t.name in gr.input_shapes:
                entries = chunk_entries[(t.name, lev)]
                idx, size, src_levels = np.searchsorted(entries, vals), entries.size, ()
            else:
                cid = names.index(t.name)
                src_levels = tuple(int(x) for x in np.unique(level[vals[real[:, :K]]]))
                base = {}
                acc = 0
                for sl in src_levels:
                    base[sl] = acc
                    acc += block_size[(cid, sl)]
                idx = pos[vals] + np.vectorize(base.get, otypes=[np.int64])(level[vals]) if len(src_levels) > 1 else pos[vals]
                size = acc
            pattern, off = _pattern(idx, size) if real[:, :K].all() else ("gather", 0)
            index = torch.from_numpy(idx.ravel().copy()) if pattern == "gather" else None
            positions = vals if t.name in gr.input_shapes else vals - gr.offsets[t.name]
            reads.append(Read("chart" if t.name not in gr.input_shapes else "input", t.name, src_levels, pattern, off, index, L, K, positions))
        mask = None if real.all() else torch.from_numpy(real)
        step_id = len(levels[lev].steps)
        levels[lev].steps.append(Step(r, rule_charts[r], L, table.shape[1], reads, mask, g.rule.outer, uniq - gr.offsets[rule_charts[r]]))
        writes.setdefault((rule_charts[r], lev), []).append((step_id, pos[uniq]))

    for (chart, lev), ws in writes.items():
        M = block_size[(names.index(chart), lev)]
        if len(ws) == 1 and ws[0][1].size == M:
            levels[lev].charts[chart] = Assembly([ws[0][0]], None, None)
            continue
        contrib: list[list[int]] = [[] for _ in range(M)]
        acc = 0
        for _, p in ws:
            for j, q in enumerate(p):
                contrib[q].append(acc + j)
            acc += p.size
        J = max(len(c) for c in contrib)
        index = np.zeros((M, J), dtype=np.int64)
        mask = np.zeros((M, J), dtype=bool)
        for q, c in enumerate(contrib):
            index[q, : len(c)] = c
            mask[q, : len(c)] = True
        levels[lev].charts[chart] = Assembly([w[0] for w in ws], torch.from_numpy(index), None if mask.all() else torch.from_numpy(mask))
    sch = Schedule(levels, chunks, top, gr.lengths, offsets)
    sch.boxes = {name: sp.size for name, sp in gr.charts.items()}
    sch.shapes = {name: sp.shape for name, sp in gr.charts.items()}
    for s, e in zip(starts, np.r_[starts[1:], total]):
        cid, lev = int(chart_id[order[s]]), int(level[order[s]])
        if lev >= 0:
            sch.items[(names[cid], lev)] = order[s:e] - gr.offsets[names[cid]]
    sch.goal_positions = gr.goal_items - gr.offsets[GOAL]
    sch.runs = _chain_runs(sch)
    sch.gathers_levels = any(len(rd.levels) > 1 for lev in levels[:top] for st in lev.steps for rd in st.reads)
    return sch


def _chain_step(sch: Schedule, lev: int) -> tuple | None:
    """(chart, matrix input, shared, unary input or None, K, L) when level ``lev`` is one step
    ``chart[lev, c] = (⊕_y chart[lev-1, y] ⊗ matrix[y, c]) ⊗ unary[c]`` over the whole previous
    level; None otherwise."""
    level = sch.levels[lev]
    if len(level.steps) != 1 or len(level.charts) != 1:
        return None
    st = level.steps[0]
    if st.mask is not None or level.charts[st.chart].index is not None or len(st.reads) - st.outer != 2 or st.outer > 1:
        return None
    inner, outer = st.reads[:2], st.reads[2:]
    rows = [r for r in inner if r.kind == "chart" and r.source == st.chart and r.levels == (lev - 1,)
            and r.pattern == "row" and r.offset == 0]
    mats = [r for r in inner if r.kind == "input" and r.pattern == "transpose" and r.offset == 0]
    if len(rows) != 1 or len(mats) != 1 or sch.offsets.get((st.chart, lev - 1), (0, -1))[1] != st.K:
        return None
    order, sizes = sch.chunks[mats[0].source]
    shared = sizes is None
    if order is not None or (not shared and sizes[lev] != st.K * st.L):
        return None
    unary = None
    if outer:
        u = outer[0]
        u_order, u_sizes = sch.chunks.get(u.source, (None, None)) if u.kind == "input" else (None, None)
        if u.kind != "input" or u.pattern != "reshape" or u_order is not None or u_sizes is None or u_sizes[lev] != st.L:
            return None
        unary = u.source
    return st.chart, mats[0].source, shared, unary, st.K, st.L


def _chain_runs(sch: Schedule) -> dict[int, Run]:
    """Maximal runs of two or more consecutive chain levels over the same chart, inputs and sizes."""
    runs: dict[int, Run] = {}
    current: Run | None = None
    for lev in range(1, sch.goal_level + 1):
        step = _chain_step(sch, lev) if lev < sch.goal_level else None
        if current and step == (current.chart, current.matrix, current.shared, current.unary, current.K, current.L):
            current.stop = lev + 1
            continue
        if current and current.stop - current.start >= 2:
            runs[current.start] = current
        current = None
        if step:
            chart, matrix, shared, unary, K, L = step
            offset = 0 if shared else sum(sch.chunks[matrix][1][:lev])
            unary_offset = sum(sch.chunks[unary][1][:lev]) if unary else 0
            current = Run(chart, matrix, shared, unary, lev, lev + 1, K, L, offset, unary_offset)
    return runs
