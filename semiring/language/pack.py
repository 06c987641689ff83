"""A plan's levels as int64 descriptors, the form the native kernels run (the C loop of
``_kernel.c`` on the CPU, the Triton kernels of :mod:`.triton_levels` on a GPU).

A level's descriptor is the number of its steps, then per step
``n, nL, R, H, M, accumulate, shared, sizes[n]``, ``R x (src, offset, strides[n], bound, L, L x
(src, stride, offset, bound, strides[n]))``, ``H x (src, offset, strides[nL])``, ``M x (op (0: >=,
1: !=), const, coeffs[n])``: a box of ``n`` coordinates, the first ``nL`` its items', the rest
summed; ``src`` names a buffer by its index in :attr:`Packed.keys`. A read's position is ``offset +
Σ strides * coords + Σ stride_l * index_l``, where ``index_l`` is read from an integer input at
``offset_l + Σ strides_l * coords`` (clamped into ``0..bound_l - 1`` where ``bound_l`` > 0), the whole
clamped into ``0..bound - 1`` where ``bound`` > 0 (a gather): the views of
:meth:`~.execute.Run.read`, so that CTC's and alignment's levels run in the kernels too.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from .plan import Plan, Step
from .syntax import GOAL

MAX_DIMS, MAX_READS = 16, 32  # coordinates and terms of a step (_kernel.c's MAXDIM, MAXREADS)


class Packed:
    """A plan's levels as kernel descriptors: ``forward[lev]`` / ``backward[lev]`` (None: the level
    runs as torch calls), ``keys`` the buffers they read and write (a descriptor names them by
    their index here), ``indices`` those of them that hold looked-up indices (int64).

    A level is packed when first a run may take it (:meth:`pack`): a chain's levels, which its
    scans run, never are. Packing a level may add keys, never renumber them, so a table made after
    packing the levels a run takes (:meth:`table`) serves every descriptor it runs."""

    def __init__(self, levels: list[list[Step]], backward_order):
        self.keys: list[str] = []
        self.uploaded = None  # (device, the descriptors there): :mod:`.triton_levels`
        self.indices: set[str] = set()  # the keys of integer inputs positions are looked up in
        self._index: dict[str, int] = {}
        self._levels, self._backward_order = levels, backward_order
        n = len(levels)
        self._packed = [False] * n
        self.forward: list[np.ndarray | None] = [None] * n
        self.backward: list[np.ndarray | None] = [None] * n
        self.work = [sum(math.prod(s.sizes) for s in steps) for steps in levels]  # per level: its instances per example (the product of every step's box)
        self.items: list[tuple[list[int], list[int]] | None] = [None] * n  # per level: its steps' items, forward and backward order
        self.instances = [max((math.prod(s.K) for s in steps), default=1) for steps in levels]  # per level: the most instances per item of its steps (1: pointwise)
        self.uses: list[set[int]] = [set() for _ in levels]  # per level: the keys its descriptors name
        self._stretches: dict[frozenset[int], tuple[list[int], list[int]]] = {}  # :meth:`stretches` per set of skipped levels
        self._runs: dict[tuple[bool, int, int], tuple[np.ndarray, np.ndarray]] = {}  # :meth:`run` per direction and levels
        self._named: dict[frozenset[int], set[int]] = {}  # :meth:`named` per set of skipped levels
        self._packed_for: set[frozenset[int]] = set()  # the sets of skipped levels :meth:`pack` has packed around

    def pack(self, skip: set[int] | frozenset[int] = frozenset()) -> "Packed":
        """Packs the levels outside ``skip`` not packed yet; returns self."""
        skip = frozenset(skip)
        if skip in self._packed_for:
            return self
        self._packed_for.add(skip)
        for lev, steps in enumerate(self._levels):
            if self._packed[lev] or lev in skip:
                continue
            self._packed[lev] = True
            used = self.uses[lev]

            def key(name: str, indices: bool = False) -> int:
                if indices:
                    self.indices.add(name)
                if name not in self._index:
                    self._index[name] = len(self.keys)
                    self.keys.append(name)
                used.add(self._index[name])
                return self._index[name]

            packed = [_pack(step, key) for step in steps]
            backward = [s for group in self._backward_order(steps) for s in group]
            self.items[lev] = ([math.prod(s.L) for s in steps], [math.prod(s.L) for s in backward])
            if any(p is None for p in packed):
                continue
            by_step = {id(s): p for s, p in zip(steps, packed)}
            self.forward[lev] = _level(packed)
            self.backward[lev] = _level([by_step[id(s)] for s in backward])
        return self

    @property
    def complete(self) -> bool:
        """Whether the kernels take every level (a run on pairs needs it)."""
        return all(d is not None for d in self.pack().forward)

    def fits(self, buf: dict[str, Tensor], component: int | None = None) -> bool:
        """Whether every buffer the descriptors name is ``[B or 1, positions]``, unit stride, on the
        charts' device, in their float dtype (int64 for looked-up indices); ``component``: of each
        buffer's ``component`` (pairs ``[2, B or 1, positions]``)."""
        def at(key: str) -> Tensor:
            return buf[key] if component is None else buf[key][component]

        like = at(GOAL)
        for key in self.keys:
            t = at(key)
            dtype = torch.int64 if key in self.indices else like.dtype
            if t.dtype != dtype or t.device != like.device or t.dim() != 2 or (t.shape[1] > 1 and t.stride(1) != 1):
                return False
        return True

    def table(self, buf: dict[str, Tensor], only: set[int] | None = None, pairs: bool = False) -> np.ndarray:
        """Per key: (address, batch stride) of its buffer ``[B or 1, positions]`` (0: shared by the
        batch); with ``only``, (0, 0) for the keys outside it, whose buffers are not asked for (a
        gradient buffer is made when first asked for). ``pairs``: the buffers are pairs ``[2, B or 1,
        positions]``, and the table the values' rows, then the tangents'."""
        wanted = [buf[k] if only is None or i in only else None for i, k in enumerate(self.keys)]
        parts = [[t if t is None else t[c] for t in wanted] for c in (0, 1)] if pairs else [wanted]
        rows = [(t.data_ptr(), t.stride(0) if t.shape[0] > 1 else 0) if t is not None else (0, 0)
                for part in parts for t in part]
        return np.array(rows, dtype=np.int64).reshape(len(rows), 2)

    def run(self, backward: bool, first: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """The descriptors of levels ``first .. end - 1`` in the order they run (backward: from the
        last) as one array, and where each starts in it (one more: its end), as the C kernel takes
        a stretch in one call; made once per stretch."""
        key = (backward, first, end)
        if key not in self._runs:
            ds = (self.backward[first:end][::-1] if backward else self.forward[first:end])
            starts = np.cumsum([0, *(len(d) for d in ds)], dtype=np.int64)
            self._runs[key] = np.concatenate(ds), starts
        return self._runs[key]

    def stretches(self, skip: set[int]) -> tuple[list[int], list[int]]:
        """Per level, its stretch, the longest run of packed levels outside ``skip`` around it: its
        first level and the level after its last (``lev + 1`` and ``lev`` where the level is in
        none), found once per set of skipped levels."""
        key = frozenset(skip)
        if key not in self._stretches:
            self.pack(key)
            runs = [d is not None and lev not in skip for lev, d in enumerate(self.forward)]
            first, end = [], [0] * len(runs)
            start = 0
            for lev, packed in enumerate(runs):
                start = start if packed else lev + 1
                first.append(start)
            stop = len(runs)
            for lev in reversed(range(len(runs))):
                stop = stop if runs[lev] else lev
                end[lev] = stop
            self._stretches[key] = first, end
        return self._stretches[key]


    def named(self, skip: set[int]) -> set[int]:
        """The keys the backward descriptors of the levels outside ``skip`` name (the gradient
        buffers a backward pass here writes), found once per set of skipped levels."""
        key = frozenset(skip)
        if key not in self._named:
            self.pack(key)
            self._named[key] = set().union(*(u for lev, u in enumerate(self.uses) if self.backward[lev] is not None and lev not in skip))
        return self._named[key]


def packed(plan: Plan, levels: list[list[Step]], backward_order) -> Packed:
    """The plan's :class:`Packed` levels (``levels``: the fused levels, the goal's last), once per plan."""
    if plan.packed is None:
        plan.packed = Packed(levels, backward_order)
    return plan.packed


def _pack(step: Step, key) -> list[int] | None:
    """One step's part of a level descriptor, or None where the kernels cannot run it."""
    reads = [v for v in step.reads if v is not None]
    n, nL = len(step.sizes), step.form.n_free
    if n > MAX_DIMS or len(reads) > MAX_READS or any(v.gather or v.lookups for v in step.heads):
        return None

    def strides(v) -> list[int]:  # (outer terms vary with the L coordinates only: stride 0 over K)
        return [*v.strides, *[0] * (n - len(v.strides))]

    out = [n, nL, len(reads), len(step.heads), len(step.masks), int(step.accumulate), int(step.shared), *step.sizes]
    for v in reads:
        out += [key(v.source), v.offset, *strides(v), v.bound if v.gather or v.lookups else 0, len(v.lookups)]
        for stride, lv in v.lookups:
            out += [key(lv.source, indices=True), stride, lv.offset, lv.bound if lv.gather else 0, *strides(lv)]
    for v in step.heads:
        out += [key(v.source), v.offset, *v.strides]
    for coeffs, const, op in step.masks:
        out += [0 if op == ">=" else 1, const, *[coeffs.get(c, 0) for c in range(n)]]
    return out


def _level(steps: list[list[int]]) -> np.ndarray:
    return np.array([len(steps), *[x for s in steps for x in s]], dtype=np.int64)
