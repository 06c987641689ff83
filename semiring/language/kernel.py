"""The Log and Max semirings' in-place levels on the CPU as one call of a C loop each (``_kernel.c``).

A step of the plan costs the torch executor ~8-30 calls of a few microseconds each, whatever its
size; at the sizes of sentences most steps hold a few thousand numbers, so most of a run was
dispatch. Here each level of :attr:`~.plan.Plan.fused` is packed once per plan into an int64
descriptor (its steps' boxes, the strides and offsets of their views, their masks; the format is
at the top of ``_kernel.c``) and run by one C call, forward and backward (which recomputes the
weights ``exp(terms - item)`` instead of keeping them). A level with a view the kernel does not
take (a clamped gather, positions looked up from data) runs as torch calls, as does every run off
the CPU, on forward-mode dual tensors, in another semiring, or where the optional extension was
not built (setup.py): the two paths compute the same numbers (tests/test_kernel.py). Where the
kernel applies, a chain with a matrix per level runs in it level by level rather than as a fused
scan (3.5 vs 21 ms for chain marginals at B=4, N=256, C=16); a scan of one matrix for every level
stays a scan (:meth:`~.execute.Run.scans`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from ..semirings import LogSemiring, MaxSemiring, Semiring
from .plan import Plan, Step
from .syntax import GOAL

try:  # built at install time where a C compiler is (setup.py)
    from . import _kernel
except ImportError:  # pragma: no cover - the torch path runs instead
    _kernel = None

_MAX_DIMS, _MAX_READS = 16, 32  # coordinates and terms of a step (_kernel.c's MAXDIM, MAXREADS)
_enabled = True


@contextmanager
def disabled() -> Iterator[None]:
    """Runs inside use the torch calls only (to compare the two paths)."""
    global _enabled
    was, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = was


def available() -> bool:
    """Whether the C kernel is built and enabled."""
    return _kernel is not None and _enabled


class Packed:
    """A plan's levels as kernel descriptors: ``forward[lev]`` / ``backward[lev]`` (None: the level
    runs as torch calls), ``keys`` the buffers they read and write (a descriptor names them by
    their index here)."""

    def __init__(self, levels: list[list[Step]], backward_order):
        self.keys: list[str] = []
        index: dict[str, int] = {}

        def key(name: str) -> int:
            if name not in index:
                index[name] = len(self.keys)
                self.keys.append(name)
            return index[name]

        self.forward: list[np.ndarray | None] = []
        self.backward: list[np.ndarray | None] = []
        for steps in levels:
            packed = [_pack(step, key) for step in steps]
            if any(p is None for p in packed):
                self.forward.append(None)
                self.backward.append(None)
                continue
            by_step = {id(s): p for s, p in zip(steps, packed)}
            self.forward.append(_level(packed))
            self.backward.append(_level([by_step[id(s)] for group in backward_order(steps) for s in group]))


def packed(plan: Plan, levels: list[list[Step]], backward_order) -> Packed:
    """The plan's :class:`Packed` levels (``levels``: the fused levels, the goal's last), once per plan."""
    if plan.packed is None:
        plan.packed = Packed(levels, backward_order)
    return plan.packed


class Bound:
    """A run's packed levels with its buffers: ``forward(lev)`` and ``backward(lev, grads)`` run a
    level in C and return True, or return False where the level runs as torch calls."""

    def __init__(self, levels: Packed, buf: dict[str, Tensor], batch: int, double: bool, max: bool):
        self.levels, self.batch, self.double, self.max = levels, batch, double, max
        self.table = _table(buf, levels.keys)
        self.grads: np.ndarray | None = None

    def forward(self, lev: int) -> bool:
        d = self.levels.forward[lev]
        if d is None:
            return False
        _kernel.forward(self.max, self.double, self.batch, self.table, d)
        return True

    def backward(self, lev: int, grads: dict[str, Tensor]) -> bool:
        d = self.levels.backward[lev]
        if d is None:
            return False
        if self.grads is None:
            self.grads = _table(grads, self.levels.keys)
        _kernel.backward(self.max, self.double, self.batch, self.table, self.grads, d)
        return True


def applies(semiring: Semiring, inputs) -> bool:
    """Whether a run of this semiring on these input tensors is the kernel's: the Log or the Max
    semiring, floating inputs on the CPU, all float32 or all float64, the extension built and enabled."""
    floats = [x for x in inputs if x.dtype.is_floating_point]
    return (available() and type(semiring) in (LogSemiring, MaxSemiring) and bool(floats)
            and all(x.device.type == "cpu" and x.dtype == floats[0].dtype for x in floats)
            and floats[0].dtype in (torch.float32, torch.float64))


def bind(plan: Plan, levels: list[list[Step]], backward_order, semiring: Semiring, buf: dict[str, Tensor],
         batch: int) -> Bound | None:
    """The kernel for a run in place on ``buf`` (``[B or 1, positions]`` per key; a run that
    :func:`applies`), or None where a buffer is not in the float dtype of the charts'."""
    like = buf[GOAL]
    levels_ = packed(plan, levels, backward_order)
    for key in levels_.keys:
        t = buf[key]
        if t.dtype != like.dtype or t.device != like.device or t.dim() != 2 or (t.shape[1] > 1 and t.stride(1) != 1):
            return None
    return Bound(levels_, buf, batch, like.dtype == torch.float64, type(semiring) is MaxSemiring)


def _table(buf, keys: list[str]) -> np.ndarray:
    """Per key: (address, batch stride) of its buffer ``[B or 1, positions]`` (0: shared by the batch)."""
    out = np.empty((len(keys), 2), dtype=np.int64)
    for i, k in enumerate(keys):
        t = buf[k]
        out[i] = t.data_ptr(), (t.stride(0) if t.shape[0] > 1 else 0)
    return out


def _pack(step: Step, key) -> list[int] | None:
    """One step's part of a level descriptor (``_kernel.c``), or None where the kernel cannot run it."""
    views = [v for v in step.reads if v is not None] + step.heads
    n, nL = len(step.sizes), step.form.n_free
    if n > _MAX_DIMS or len(views) - len(step.heads) > _MAX_READS or any(v.gather or v.lookups for v in views):
        return None
    out = [n, nL, len(views) - len(step.heads), len(step.heads), len(step.masks), int(step.accumulate), int(step.shared), *step.sizes]
    for v in step.reads:
        if v is not None:  # (outer terms vary with the L coordinates only: stride 0 over K)
            out += [key(v.source), v.offset, *v.strides, *[0] * (n - len(v.strides))]
    for v in step.heads:
        out += [key(v.source), v.offset, *v.strides]
    for coeffs, const, op in step.masks:
        out += [0 if op == ">=" else 1, const, *[coeffs.get(c, 0) for c in range(n)]]
    return out


def _level(steps: list[list[int]]) -> np.ndarray:
    return np.array([len(steps), *[x for s in steps for x in s]], dtype=np.int64)
