"""The Log and Max semirings' in-place levels on the CPU as one call of a C loop each (``_kernel.c``).

A step of the plan costs the torch executor ~8-30 calls of a few microseconds each, whatever its
size; at the sizes of sentences most steps hold a few thousand numbers, so most of a run was
dispatch. Here each level of :attr:`~.plan.Plan.fused` is packed once per plan into an int64
descriptor (its steps' boxes, the strides and offsets of their views, their masks; the format is
:mod:`.pack`'s and at the top of ``_kernel.c``) and run by one C call, forward and backward (which recomputes the
weights ``exp(terms - item)`` instead of keeping them); views that gather (clamped positions) or
look positions up from data run there too. A level with more than 16 coordinates or 32 terms per
rule runs as torch calls, as does every run off the CPU (on a GPU, :mod:`.triton_levels` runs the
same descriptors), in another semiring, or where the optional extension was not built (setup.py): the
two paths compute the same numbers (tests/test_kernel.py). A Hessian-vector product's passes on pairs
(value, tangent) run in the kernel's pair steps (``pairs=True``: each buffer's values and tangents,
item by item) where it takes every level of the plan (:meth:`~.execute.Run.paired`). Where the
kernel applies, a chain's run of levels is a scan (:meth:`~.execute.Run.scans`), one call of the C
scan each way (:mod:`semiring.cpu_scan`; without it, a chain of a matrix per level runs here level by
level, 3.5 vs 21 ms as torch's scan for marginals at B=4, N=256, C=16). A level splits the batch across up to
``torch.get_num_threads()`` threads where it is large enough (OpenMP's, the runtime torch's own
operations use, where the extension was built with it; else one): each example is computed as on one thread, so the numbers do not depend on the count; a
level that writes a buffer shared by the batch (the gradient of an input every example reads) runs
on one.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from .. import cpu_scan
from ..semirings import LogSemiring, MaxSemiring, Semiring
from ..switch import Switch
from .pack import Packed, packed
from .plan import Plan, Step
from .syntax import GOAL

try:  # built at install time where a C compiler is (setup.py)
    from . import _kernel
except ImportError:  # pragma: no cover - the torch path runs instead
    _kernel = None

_enabled = Switch(True)


@contextmanager
def disabled() -> Iterator[None]:
    """Runs inside use the torch calls only, the scans' too (:mod:`semiring.cpu_scan`; to compare
    the two paths)."""
    with _enabled.to(False), cpu_scan.enabled.to(False):
        yield


def available() -> bool:
    """Whether the C kernel is built and enabled."""
    return _kernel is not None and bool(_enabled)


class Bound:
    """A run's packed levels with its buffers: ``forward(lev)`` runs in C the levels from ``lev`` to
    the next that does not run there (a level left to torch calls, or in ``skip``), and returns how
    many it ran (0: ``lev`` runs as torch calls); ``backward(lev, grads)`` runs those from ``lev``
    down to the first of its stretch the same way."""

    def __init__(self, levels: Packed, buf: dict[str, Tensor], batch: int, double: bool, max: bool, skip: set[int],
                 pairs: bool = False):
        self.levels, self.batch, self.double, self.max, self.pairs = levels, batch, double, max, pairs
        self.threads = torch.get_num_threads()
        self.table = levels.table(buf, pairs=pairs)
        self.first, self.end = levels.stretches(skip)
        self.grads: np.ndarray | None = None  # the gradient buffers' table, made by a backward pass's first level
        # (of the buffers the levels run here name: an input only a skipped level reads, a scan's,
        # gets its gradient whole from there, no zero-filled buffer to add it into)
        self.named = levels.named(skip)

    def forward(self, lev: int) -> int:
        end = self.end[lev]
        if end > lev and self.pairs:
            _kernel.pair_forward(self.double, self.batch, self.threads, self.table, *self.levels.run(False, lev, end))
        elif end > lev:
            _kernel.forward(self.max, self.double, self.batch, self.threads, self.table, *self.levels.run(False, lev, end))
        return end - lev

    def backward(self, lev: int, grads: dict[str, Tensor]) -> int:
        first = self.first[lev]
        if first > lev:
            return 0
        if self.grads is None:
            self.grads = self.levels.table(grads, self.named, self.pairs)
        if self.pairs:
            _kernel.pair_backward(self.double, self.batch, self.threads, self.table, self.grads, *self.levels.run(True, first, lev + 1))
        else:
            _kernel.backward(self.max, self.double, self.batch, self.threads, self.table, self.grads, *self.levels.run(True, first, lev + 1))
        return lev + 1 - first


def applies(semiring: Semiring, inputs) -> bool:
    """Whether a run of this semiring on these input tensors is the kernel's: the Log or the Max
    semiring, floating inputs on the CPU, all float32 or all float64, the extension built and enabled."""
    floats = [x for x in inputs if x.dtype.is_floating_point]
    return (available() and type(semiring) in (LogSemiring, MaxSemiring) and bool(floats)
            and all(x.device.type == "cpu" and x.dtype == floats[0].dtype for x in floats)
            and floats[0].dtype in (torch.float32, torch.float64))


def bind(plan: Plan, levels: list[list[Step]], backward_order, semiring: Semiring, buf: dict[str, Tensor],
         batch: int, skip: set[int], pairs: bool = False) -> Bound | None:
    """The kernel for a run in place on ``buf`` (``[B or 1, positions]`` per key; a run that
    :func:`applies`), the levels in ``skip`` left to the caller, or None where a buffer does not
    fit (:meth:`.pack.Packed.fits`). ``pairs``: a Log run on pairs (value, tangent), ``[2, B or 1,
    positions]`` per key (:meth:`~.execute.Run.paired`)."""
    levels_ = packed(plan, levels, backward_order).pack(skip)  # (before the buffers' checks and table: their keys)
    if not all(levels_.fits(buf, c) for c in ((0, 1) if pairs else (None,))):
        return None
    like = buf[GOAL]
    return Bound(levels_, buf, batch, like.dtype == torch.float64, type(semiring) is MaxSemiring, skip, pairs)

