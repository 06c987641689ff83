"""The Log and Max semirings' in-place levels on a GPU as Triton kernels: a stretch of levels is one launch.

Eager on a GPU, a level run as torch calls is ~8-30 kernel launches whatever its size, and a run has
hundreds of levels: launch-bound. Here the levels :mod:`.pack` packs for the C kernel (the same
descriptors, uploaded once per plan and device) run in :mod:`._triton_kernels`: one program per
example walks every level of a stretch in order (no level needs another example's items), so the
forward pass of a stretch is one launch and its backward another. A stretch ends at a level the
descriptors do not take (a clamped gather, positions looked up from data: torch calls run it) or a
fused scan of one matrix for every level (:meth:`~.execute.Run.scans`). The kernels are compiled once
per semiring and dtype (never per program, length or batch size: the descriptors are data) and cached
on disk by Triton.

Runs take these kernels where Triton imports, the inputs are CUDA float32 or float64 tensors and the
semiring is Log or Max, outside CUDA-graph capture (the descriptors' table of buffer addresses is
copied to the device at each run, which a graph would freeze). Everything else runs as before: other
semirings, the CPU (the C kernel). The pairs (value, tangent) of a Hessian-vector product run in them
too (``PAIRS``: each buffer's values and its tangents) where they take every level of the plan. Tests run the
kernels in Triton's interpreter on CPU tensors (:func:`interpreted`; ``TRITON_INTERPRET=1`` set before
the first run). The backward's atomic adds make float32 gradients vary in their last bits from run to run.
"""

from __future__ import annotations

import importlib.util
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from .. import triton_scan
from ..semirings import LogSemiring, MaxSemiring, Semiring
from ..switch import Switch
from .pack import Packed, packed
from .plan import Plan, Step
from .syntax import GOAL

BI, BK = 32, 32  # a tile of a step's box: items by instances
WARPS = 4  # per program
POINTWISE_BI = 128
"""A stretch whose steps sum over no instances (CTC's, alignment's: each item a few terms) walks its
items in tiles of ``POINTWISE_BI x 1`` instead (the tile's integer arithmetic is per element, and
one column of 32 would be used): a second compiled variant, whatever the lengths (0: off)."""
# A level of more instances per example than this runs a step per launch, its item tiles spread over
# up to MAX_TILES programs per example (below it, one program per example loops over the level's
# tiles: at 16 tiles of BI x BK, about what a launch costs). Not yet tuned on a GPU.
SPLIT, MAX_TILES = 16 * BI * BK, 1024
ATOMICS = "relaxed"
"""The backward's atomic adds' memory semantics (Triton's ``sem``; "acq_rel" is Triton's default,
a fence around each add)."""
CHAIN_SCANS = True
"""Whether a chain of a matrix per level (a linear-chain CRF's) runs as one scan
(:mod:`semiring.triton_scan`, its state in registers) rather than as a stretch of levels here."""
_TRITON = importlib.util.find_spec("triton") is not None
_enabled = Switch(True)
_interpreting = Switch(False)


@contextmanager
def disabled() -> Iterator[None]:
    """Runs inside use the torch calls, not the Triton kernels, their scans' neither
    (:mod:`semiring.triton_scan`; to compare the two paths)."""
    with _enabled.to(False), triton_scan.enabled.to(False):
        yield


@contextmanager
def interpreted() -> Iterator[None]:
    """Runs inside on CPU tensors take the Triton kernels too, their scans' too, in Triton's
    interpreter (tests; the environment variable ``TRITON_INTERPRET=1`` must be set before the first
    run imports them)."""
    with _interpreting.to(True), triton_scan.interpreting.to(True):
        yield


def available() -> bool:
    """Whether Triton is installed and these kernels enabled."""
    return bool(_enabled) and _TRITON


def applies(semiring: Semiring, inputs) -> bool:
    """Whether a run of this semiring on these input tensors is these kernels': the Log or the Max
    semiring, floating inputs on one CUDA device (or the CPU under :func:`interpreted`), all float32
    or all float64, not while a CUDA graph is being captured."""
    floats = [x for x in inputs if x.dtype.is_floating_point]
    if not (floats and type(semiring) in (LogSemiring, MaxSemiring)):
        return False
    device = floats[0].device
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return False
    elif not (device.type == "cpu" and _interpreting):
        return False
    return (available() and all(x.device == device and x.dtype == floats[0].dtype for x in floats)
            and floats[0].dtype in (torch.float32, torch.float64))


class _Uploaded:
    """A plan's descriptors on one device: the levels' descriptors concatenated, and where each
    level's starts (-1: not packed), forward and backward."""

    def __init__(self, levels: Packed, device: torch.device):
        def upload(descs: list[np.ndarray | None]) -> tuple[Tensor, Tensor]:
            starts, at = [], 0
            for d in descs:
                starts.append(-1 if d is None else at)
                at += 0 if d is None else len(d)
            flat = np.concatenate([d for d in descs if d is not None] or [np.zeros(1, np.int64)])
            return (torch.from_numpy(flat).to(device), torch.tensor(starts, dtype=torch.int64).to(device))

        self.forward = upload(levels.forward)
        self.backward = upload(levels.backward)
        self.stretches: dict[tuple, tuple[set[int], dict[int, tuple[int, int]]]] = {}  # :func:`_stretches` per (skip, SPLIT)


def _stretches(levels: Packed, skip: set[int]) -> tuple[set[int], dict[int, tuple[int, int]]]:
    """The levels split over programs (more than ``SPLIT`` instances per example), and each level's
    stretch ``(first, last + 1)``: the longest runs of packed, unskipped, unsplit levels (a split
    level is a stretch of its own); levels the kernels do not run have none."""
    runs = [d is not None and lev not in skip for lev, d in enumerate(levels.forward)]
    split = {lev for lev, work in enumerate(levels.work) if runs[lev] and work > SPLIT}
    stretch: dict[int, tuple[int, int]] = {}
    lev = 0
    while lev < len(runs):
        end = lev + 1
        while runs[lev] and lev not in split and end < len(runs) and runs[end] and end not in split:
            end += 1
        if runs[lev]:
            for k in range(lev, end):
                stretch[k] = (lev, end)
        lev = end
    return split, stretch


class Bound:
    """A run's packed levels with its buffers, as stretches: ``forward(lev)`` runs the stretch from
    ``lev`` in one launch, ``backward(lev, grads)`` the stretch that ends at ``lev``; both return
    the number of levels they ran, 0 where the level runs as torch calls. A level of more than
    ``SPLIT`` instances per example is a stretch of its own, run a step per launch with each
    example's item tiles spread over several programs."""

    def __init__(self, levels: Packed, buf: dict[str, Tensor], batch: int, max: bool, skip: set[int], pairs: bool = False):
        like = buf[GOAL]
        self.levels, self.batch, self.max, self.pairs, self.dtype = levels, batch, max, pairs, like.dtype
        if levels.uploaded is None or levels.uploaded[0] != like.device:
            levels.uploaded = (like.device, _Uploaded(levels, like.device))
        self.descs = levels.uploaded[1]
        self.table = _on(levels.table(buf, pairs=pairs), like.device)
        self.sources = len(levels.keys)  # (on pairs: where the table's rows of tangents start)
        key = frozenset(skip), SPLIT  # (once per plan, set of skipped levels and threshold)
        if key not in self.descs.stretches:
            self.descs.stretches[key] = _stretches(levels, skip)
        self.split, self.stretch = self.descs.stretches[key]
        self.grads: Tensor | None = None

    def _launch(self, kernel, lev: int, first: int, last: int, items: list[int], *args, **extra) -> None:
        bi, bk = (POINTWISE_BI, 1) if POINTWISE_BI and max(self.levels.instances[first:last]) <= 1 else (BI, BK)
        constants = dict(IS_MAX=self.max, DTYPE=_DTYPES[self.dtype], LOWEST=float(torch.finfo(self.dtype).min), BI=bi, BK=bk,
                         PAIRS=self.pairs, num_warps=WARPS, **extra)
        if lev not in self.split:
            kernel[(self.batch, 1)](*args, first, last, -1, **constants)
            return
        for only, count in enumerate(items):
            tiles = min(max(-(-count // bi), 1), MAX_TILES)
            kernel[(self.batch, tiles)](*args, lev, lev + 1, only, **constants)

    def forward(self, lev: int) -> int:
        """Launch the levels from ``lev`` to the end of its stretch; how many they are (0: none)."""
        if lev not in self.stretch:
            return 0
        _, last = self.stretch[lev]
        self._launch(_kernels().forward, lev, lev, last, self.levels.items[lev][0], *self.descs.forward, self.table,
                     self.sources)
        return last - lev

    def backward(self, lev: int, grads: dict[str, Tensor]) -> int:
        """Launch the levels from ``lev`` down to the first of its stretch; how many they are (0: none)."""
        if lev not in self.stretch:
            return 0
        first, _ = self.stretch[lev]
        if self.grads is None:
            self.grads = _on(self.levels.table(grads, pairs=self.pairs), self.table.device)
        self._launch(_kernels().backward, lev, first, lev + 1, self.levels.items[lev][1], *self.descs.backward, self.table,
                     self.grads, self.sources, SEM=ATOMICS)
        return lev + 1 - first


def bind(plan: Plan, levels: list[list[Step]], backward_order, semiring: Semiring, buf: dict[str, Tensor],
         batch: int, skip: set[int], pairs: bool = False) -> Bound | None:
    """These kernels for a run in place on ``buf`` (``[B or 1, positions]`` per key; a run that
    :func:`applies`), the levels in ``skip`` left to the caller, or None where a buffer is not on
    the charts' device in their float dtype (int64 for looked-up indices). ``pairs``: a Log run on
    pairs (value, tangent), ``[2, B or 1, positions]`` per key."""
    levels_ = packed(plan, levels, backward_order).pack()  # (every level: the descriptors are uploaded whole)
    if not all(levels_.fits(buf, c) for c in ((0, 1) if pairs else (None,))):
        return None
    return Bound(levels_, buf, batch, type(semiring) is MaxSemiring, skip, pairs)


_DTYPES: dict = {}


def _kernels():
    """The kernel module (imported at the first run: it imports Triton)."""
    from . import _triton_kernels

    if not _DTYPES:
        import triton.language as tl

        _DTYPES.update({torch.float32: tl.float32, torch.float64: tl.float64})
    return _triton_kernels


def _on(table: np.ndarray, device: torch.device) -> Tensor:
    """A buffer table (:meth:`.pack.Packed.table`) on the device."""
    return torch.from_numpy(table).to(device, non_blocking=True)
