"""Running a plan: the charts in flat buffers, every step a batched ⊕ of ⊗ over strided views.

Values are ``[*components, B, ...]`` (the semiring's leading components, then the batch). Every
chart lives in a buffer ``[*, B, positions]`` per layout (:mod:`.plan`), first filled with the
semiring zero, so that items no rule defines read as zero. The forward pass writes each level's
items in place and keeps nothing but the buffers; the backward pass walks the levels in reverse,
re-reads what each step read (views: free) and adds the gradients into zero-filled gradient
buffers of the same layouts, in place. In the Log and Max semirings a step's vector-Jacobian
product is written out (Log: the weights ``exp(terms - item)`` of each ⊕; Max: the gradient
routed to the first maximum); other semirings recompute the level under a local autograd graph.
In the Log semiring the written-out passes also run on pairs (value, tangent), stacked as one
leading component: the forward-mode derivative of both passes in a direction, the Hessian-vector
products of :mod:`.autodiff` (:meth:`Run.paired`). :func:`functional` is the same run with
out-of-place writes, differentiable to any order by plain autograd.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from .. import cpu_scan, triton_scan
from ..semirings import LogSemiring, MaxSemiring, Semiring
from . import kernel, triton_levels
from .fuse import ARENA
from .pack import packed
from .plan import DELTAS, VALID, Plan, Scan, Step, View
from .syntax import GOAL

SCAN_LEVELS = 32  # a chain of fewer levels, of a matrix each, runs in the C kernel level by level: the scan's fixed cost (~10 torch calls) is more (B=2..8, C=4..8, one loaded AMD core: even at 32-64 levels)
PAIR_SCAN_TERMS = 1 << 8  # a chain on pairs with more terms a level (B K^2) runs level by level (in the C kernel's pair steps, whose exps are vectors; the pair scan's loops are scalar). Hessian-vector products, ms, pair scan / kernel levels, one Intel Xeon core: B=16 K=2 N=256 2.9 / 3.7, B=8 K=8 N=20 1.6 / 1.35, B=16 K=16 N=50 12.8 / 8.5, B=32 K=32 N=30 57 / 29, bAbI's hop chain B=32 K=50 8.8 / 5.8
PAIR_KERNELS = True  # runs on pairs (Hessian-vector products) take the native kernels' pair steps where those run every level (False: the torch calls, to compare)
KEEP = 1.25  # the Log weights a run keeps for its backward, in numbers per number its charts and inputs hold (:meth:`Run.keepable`)


class Run:
    """One run of a plan in a semiring: ``names`` the inputs (program order), ``lengths`` a dict
    from length names to ``[B]`` tensors (a length left out, or None: the largest); ``native``:
    the module whose kernels run the levels it packs (:mod:`.kernel`, the C loop on the CPU, or
    :mod:`.triton_levels` on a GPU; None: torch calls only), as :func:`native` chooses."""

    def __init__(self, plan: Plan, semiring: Semiring, names: list[str], lengths: dict[str, Tensor] | None, batch: int,
                 native=None):
        self.plan, self.semiring, self.names, self.lengths, self.batch = plan, semiring, names, lengths, batch
        self.native = native
        self.lead = semiring.extra
        self.kept: dict[int, tuple] = {}  # first level of a scan -> (its output, its leaves); id(step) -> what its vjp reuses
        self.found: dict[int, Tensor] = {}  # id(view) -> its positions looked up from data (the inputs' indices are fixed)
        self.goal: int | Tensor | None = None  # :meth:`goal_index`, once found
        self.bound: tuple[dict[str, Tensor], kernel.Bound | triton_levels.Bound | None] | None = None  # (buffers, their kernels)
        self.pair_kernel = False  # (a run on pairs: whether the native kernels run its levels, :meth:`paired`)

    # ------------------------------------------------------------ reading and writing

    @staticmethod
    def view(src: Tensor, v: View) -> Tensor:
        """The positions of ``v`` in ``src [*, B, positions]``: ``[*, B, *v.sizes]``."""
        if not v.gather:
            return src.as_strided((*src.shape[:-1], *v.sizes), (*src.stride()[:-1], *v.strides), src.storage_offset() + v.offset)
        pos = Run.positions(v.offset, v.strides, v.sizes, src.device).clamp(0, v.bound - 1)
        return src.index_select(-1, pos.reshape(-1)).reshape(*src.shape[:-1], *v.sizes)

    @staticmethod
    def positions(offset: int, strides, sizes, device) -> Tensor:
        pos = torch.full((), offset, dtype=torch.long, device=device)
        for d, (s, n) in enumerate(zip(strides, sizes)):
            if s:
                pos = pos + s * torch.arange(n, device=device).reshape([-1 if e == d else 1 for e in range(len(sizes))])
        return pos.expand(sizes)

    @staticmethod
    def mask(step: Step, device) -> Tensor | None:
        """``[*coords]`` bool: where the step's box holds instances of the rule (None: everywhere)."""
        if not step.masks:
            return None
        out = None
        for coeffs, const, op in step.masks:
            e = Run.positions(const, [coeffs.get(c, 0) for c in range(len(step.sizes))], step.sizes, device)
            m = e >= 0 if op == ">=" else e != 0
            out = m if out is None else out & m
        return out

    # ------------------------------------------------------------ one step, any semiring

    def compute(self, step: Step, read, like: Tensor) -> Tensor:
        """The step's items ``[*, B, *L]``: ⊕ over the K coordinates of the ⊗ of its terms;
        ``read(v)`` gives a term's view."""
        sr, form = self.semiring, step.form
        n = len(step.sizes)
        first_outer = len(form.reads) - form.outer
        vals = [read(v) for v in step.reads[:first_outer] if v is not None]
        if vals:
            p = vals[0]
            for v in vals[1:]:
                p = sr.times(p, v)
            p = p.expand(*p.shape[: p.dim() - n], *step.sizes)
        else:
            p = sr.one((1, *step.sizes), like)
        m = self.mask(step, like.device)
        if m is not None:
            p = torch.where(m, p, sr.zero(p.shape[self.lead:], p))
        k = len(step.K)
        if k:
            p = sr.sum(p.reshape(*p.shape[: p.dim() - k], -1), -1)
        for v in step.reads[first_outer:]:
            if v is not None:
                p = sr.times(p, read(v))
        return p.expand(*p.shape[: self.lead], self.batch, *step.L)

    def write(self, buffers: dict[str, Tensor], step: Step, value: Tensor, plus_=None) -> None:
        """The step's items into every layout of its chart (⊕ into them where earlier steps of the
        level wrote some: ``plus_(dst, value)`` in place, else the semiring's ``plus``)."""
        for v in step.heads:
            dst = self.view(buffers[v.source], v)
            if not step.accumulate:
                dst.copy_(value)
            elif plus_ is not None:
                plus_(dst, value)
            else:
                dst.copy_(self.semiring.plus(dst, value))

    def goal_index(self, goal: Tensor) -> int | Tensor:
        """Each example's position in the goal's buffer: its goal at its own lengths (the largest
        where none is given), an int where that is one position for all. Found once per run by
        the in-place passes (the forward's is the backward's; anew where autograd records, which
        may not save what inference mode made)."""
        if self.goal is not None and (isinstance(self.goal, int) or not torch.is_grad_enabled()):
            return self.goal
        if self.plan.per_example is not None:  # (one item, each example's own)
            self.goal = 0
            return 0
        box, names = self.plan.boxes[GOAL], self.plan.length_names
        offset, index, stride = 0, None, 1  # the index is offset + the given lengths' terms
        for d in reversed(range(len(names))):
            given = (self.lengths or {}).get(names[d])
            if given is None:
                offset += (box.hi[d] - box.lo[d]) * stride
            else:
                given = given if given.device == goal.device else given.to(goal.device)
                offset -= box.lo[d] * stride
                # one op a length: a multiply-add (add with alpha), or the first length's multiply
                index = (given if stride == 1 else given * stride) if index is None else index.add(given, alpha=stride)
            stride *= box.shape[d]
        index = offset if index is None else index + offset if offset else index
        if isinstance(index, int) or not torch.is_grad_enabled():
            self.goal = index
        return index

    def select_goal(self, goal: Tensor) -> Tensor:
        """``[*, B, goal positions]`` -> ``[*, B]``."""
        index = self.goal_index(goal)
        if isinstance(index, int):
            return goal[..., index]
        return goal.gather(-1, index.reshape(*[1] * self.lead, -1, 1).expand(*goal.shape[:-1], 1)).squeeze(-1)

    def goal_gradient(self, goal: Tensor, grad: Tensor) -> Tensor:
        g = torch.zeros_like(goal)
        index = self.goal_index(goal)
        if isinstance(index, int):
            g[..., index] = grad
        else:
            g.scatter_(-1, index.reshape(*[1] * self.lead, -1, 1).expand(*goal.shape[:-1], 1), grad.unsqueeze(-1).expand(*goal.shape[:-1], 1))
        return g

    def keepable(self) -> set[int]:
        """The ids of the steps whose Log weights the forward keeps for the backward: the smallest
        summing steps, up to ``KEEP`` times as many numbers as the charts and the floating inputs
        hold (what the backward allocates for their gradients anyway), so that keeping about
        doubles the memory of a run at most (the weights of every step would be O(n^3) to Eisner's O(n^2)
        charts) and spares the most torch calls per number kept. Found once per plan."""
        plan = self.plan
        if plan.keepable is None:
            sizes = sorted((math.prod(st.sizes), id(st)) for steps in plan.fused for st in steps if len(st.K))
            held = sum(plan.size[k] for ks in plan.keys.values() for k in ks)
            held += sum(math.prod(shape) for name, shape in plan.shapes.items() if name not in plan.looked_up)
            budget, plan.keepable = KEEP * held, set()
            for n, i in sizes:
                budget -= n
                if budget < 0:
                    break
                plan.keepable.add(i)
        return plan.keepable

    def paired(self) -> "Run":
        """This run on pairs (value, tangent) stacked as a leading component ``[2, *, B, ...]``
        (Log): its forward and backward with ``dual=True`` give the values and gradients with their
        forward-mode derivatives in the direction the inputs' tangents give. Where the native kernels
        (the C kernel, the Triton kernels) take every level of the plan, they run it on pairs, its
        fused levels on an arena as a first-order run; else the plan's levels as torch calls."""
        run = copy.copy(self)
        run.lead, run.kept, run.bound = self.lead + 1, {}, None
        run.pair_kernel = (PAIR_KERNELS and self.native is not None and type(self.semiring) is LogSemiring
                           and packed(self.plan, self.levels(fused=True), _backward_order).complete)
        return run

    def unrecorded(self) -> bool:
        """Whether the in-place passes record nothing for autograd: every step written out (Log,
        Max) and no fused scan (whose backward autograd records)."""
        return type(self.semiring) in _MANUAL and not self.scans(False)

    def levels(self, fused: bool = False) -> list[list[Step]]:
        """Every level's steps in order, the goal's last; ``fused``: sibling steps as one."""
        return [*(self.plan.fused if fused else self.plan.levels), self.plan.goal]

    def kernel(self, buf: dict[str, Tensor], dual: bool) -> kernel.Bound | triton_levels.Bound | None:
        """The native kernels of the in-place levels on ``buf``, or None where they do not apply;
        bound once per buffers (the backward takes the forward's binding: its table of addresses).
        On pairs, the kernels' pair steps where they take every level (:attr:`pair_kernel`)."""
        if self.native is None or (dual and not self.pair_kernel):
            return None
        if self.bound is not None and self.bound[0] is buf:
            compiled = self.bound[1]
            if compiled is not None:
                compiled.grads = None  # (each backward pass binds its own gradient buffers)
            return compiled
        scans = [scan for scan in self.scans(dual).values() if not dual or self.pair_scan_applies(scan, buf)]
        key = tuple(scan.start for scan in scans)
        skip = self.plan.skips.get(key)
        if skip is None:  # (one object per set of scans: the kernels' memos of it hash it once, compare it by identity)
            skip = self.plan.skips[key] = frozenset(lev for scan in scans for lev in range(scan.start, scan.stop))
        bind = triton_levels.bind if self.native is triton_levels else kernel.bind
        compiled = bind(self.plan, self.levels(fused=True), _backward_order, self.semiring, buf, self.batch, skip, pairs=dual)
        self.bound = buf, compiled
        return compiled

    def sources(self, elements: list[Tensor]) -> dict[str, Tensor]:
        """Every input flat, ``[*, B, positions]`` (an integer input of indices: ``[B, positions]``, int64),
        and where the plan computes the goal at each example's lengths, that goal's (:meth:`goal_inputs`)."""
        out = {name: x.reshape(x.shape[0], -1).long().contiguous() if name in self.plan.looked_up
               else x.reshape(*x.shape[: self.lead + 1], -1).contiguous() for name, x in zip(self.names, elements)}
        if self.plan.per_example is not None:
            out.update(self.goal_inputs(next(x for x in elements if x.is_floating_point())))
        return out

    def goal_inputs(self, like: Tensor) -> dict[str, Tensor]:
        """``DELTAS [B, reads]`` and ``VALID [*, B, rules]`` of a goal at each example's lengths
        (:class:`~.plan.PerExample`), found in numpy from the lengths (a length not given: the
        largest; a plan of this kind runs on the CPU only, where the lengths are read for free)."""
        pe, box = self.plan.per_example, self.plan.boxes[GOAL]
        given = self.lengths or {}
        lengths = np.stack([np.full(self.batch, box.hi[d]) if given.get(name) is None else given[name].numpy()
                            for d, name in enumerate(self.plan.length_names)], -1)
        coords = lengths[:, pe.dims] - pe.bases  # [B, every rule's item coordinates]
        ok = np.logical_and.reduceat((coords >= 0) & (coords < pe.sizes), pe.starts, axis=1)  # [B, rules]
        for j, coeffs, const, op in pe.masks:
            e = const + sum(a * coords[:, pe.starts[j] + c] for c, a in coeffs.items())
            ok[:, j] &= e >= 0 if op == ">=" else e != 0
        deltas = np.where(ok[:, pe.rule_of], coords, 0) @ pe.strides  # [B, reads]
        valid = torch.from_numpy(np.where(ok, 0.0, -np.inf)).to(like.dtype)
        if self.lead:  # (pairs: a tangent of 0)
            valid = torch.stack((valid, torch.zeros_like(valid)))
        return {DELTAS: torch.from_numpy(deltas), VALID: valid}

    def read(self, buf: dict[str, Tensor], v: View) -> Tensor:
        """A term's view (with positions looked up from data where it has them): ``[*, B, *v.sizes]``."""
        if not v.lookups:
            return self.view(buf[v.source], v)
        src = buf[v.source]
        pos = self.looked_up(buf, v, src.device)
        batch = max(src.shape[-2], pos.shape[0])
        index = pos.reshape(pos.shape[0], -1).expand(*src.shape[:-2], batch, -1)
        return src.expand(*src.shape[:-2], batch, src.shape[-1]).gather(-1, index).reshape(*src.shape[:-2], batch, *v.sizes)

    def looked_up(self, buf: dict[str, Tensor], v: View, device) -> Tensor:
        """``[B, *v.sizes]``: the positions of a view with indices read from data, clamped to the buffer
        (found once per run by the in-place passes: the forward's are the backward's; anew where
        autograd records, which may not save what inference mode made)."""
        if id(v) in self.found and not torch.is_grad_enabled():
            return self.found[id(v)]
        pos = self.positions(v.offset, v.strides, v.sizes, device)
        for stride, lv in v.lookups:
            pos = pos + stride * self.view(buf[lv.source], lv)
        pos = pos.clamp_(0, v.bound - 1)
        if not torch.is_grad_enabled():
            self.found[id(v)] = pos
        return pos

    def buffers(self, like: Tensor, arena: bool, dual: bool = False) -> dict[str, Tensor]:
        """The charts' buffers, zero-filled; ``arena``: in one buffer, the arena (:mod:`.fuse`),
        each chart's a slice of it; ``dual``: pairs (the zero, tangent 0)."""
        plan = self.plan
        out = {}
        if arena:
            zero = self.semiring.zero((self.batch, plan.arena_size), like)
            out[ARENA] = torch.stack((zero, torch.zeros_like(zero))) if dual else zero
            for key, base in plan.arena.items():
                out[key] = out[ARENA].narrow(-1, base, plan.size[key])
        for keys in plan.keys.values():
            for key in keys:
                if key not in out:
                    zero = self.semiring.zero((self.batch, plan.size[key]), like)
                    out[key] = torch.stack((zero, torch.zeros_like(zero))) if dual else zero
        return out

    # ------------------------------------------------------------ forward, in place

    def scans(self, dual: bool) -> dict[int, Scan]:
        """The plan's runs of chain levels, where the semiring has a fused scan. Where the C kernel runs the levels and
        the C scan (:mod:`semiring.cpu_scan`) is built, the scans of one matrix for every level (an
        HMM's, an EmissionCRF's) and those of a matrix per level of at least :data:`SCAN_LEVELS`
        levels, a chain's whole run in one call; without it only the former (the torch scan
        multiplies matrices there, 3.6x faster than the kernel's sums). On a GPU, the
        scans the Triton scan takes (:data:`.triton_levels.CHAIN_SCANS`: of a matrix per level too)."""
        if type(self.semiring).scan is Semiring.scan:
            return {}
        if dual:  # pairs: the C scan's pair loops where the kernel runs, any length (:meth:`pair_scan`)
            return self.plan.scans if self.native is kernel and cpu_scan.enabled and type(self.semiring) is LogSemiring else {}
        if self.native is kernel and cpu_scan.enabled:
            return {lev: scan for lev, scan in self.plan.scans.items()
                    if scan.matrix.strides[0] == 0 or scan.stop - scan.start >= SCAN_LEVELS}
        if self.native is kernel or (self.native is triton_levels and not triton_levels.CHAIN_SCANS):
            return {lev: scan for lev, scan in self.plan.scans.items() if scan.matrix.strides[0] == 0}
        if self.native is triton_levels:
            return {lev: scan for lev, scan in self.plan.scans.items()
                    if scan.matrix.strides[0] == 0 or scan.matrix.sizes[-1] <= triton_scan.MAX_STATES}
        return self.plan.scans

    def scan_inputs(self, scan: Scan, read) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(init, xs, unary)`` of a run of chain levels, as :meth:`~semiring.semirings.Semiring.scan` takes them."""
        xs = read(scan.matrix)
        if scan.matrix.strides[0] == 0 and xs.shape[self.lead] == 1:
            xs = xs.narrow(-3, 0, 1)  # one matrix for every level and example
        return read(scan.init), xs, None if scan.unary is None else read(scan.unary)

    def scan_views(self, scan: Scan, buf: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor | None, tuple[int, ...]]:
        """:meth:`scan_inputs` read from the buffers, and the shape of the matrices' view (before
        one matrix for every level is narrowed to one)."""
        shape = []

        def read(v: View) -> Tensor:
            t = self.view(buf[v.source], v)
            shape.append(t.shape)
            return t

        return (*self.scan_inputs(scan, read), tuple(shape[0]))

    def scan(self, scan: Scan, read) -> Tensor:
        """A run of chain levels: ``[*, B, T, L]``."""
        return self.semiring.scan(*self.scan_inputs(scan, read))

    def native_scan(self, scan: Scan, buf: dict[str, Tensor], keep: bool) -> "_NativeScan | None":
        """A run of chain levels by the native scan of the levels' path called directly (the C scan
        where the kernel runs the other levels, the Triton scan where its kernels do): no autograd
        node, no replay of its graph, which cost more than a short chain's levels. What its backward
        needs, or None where the scan does not take it (the autograd path runs instead)."""
        if self.native is None:
            return None
        init, xs, unary, shape = self.scan_views(scan, buf)
        is_max = type(self.semiring) is MaxSemiring
        if self.native is kernel and cpu_scan.applies(init, xs, unary, keep=keep and not is_max, log=not is_max):
            reads_init = is_max  # (the C Log backward reads only the kept weights)
        elif self.native is triton_levels and triton_scan.applies(init, xs, unary):
            reads_init = True
        else:
            return None
        if keep and reads_init and scan.init.source in self.plan.shapes:
            init = init.clone()  # (the chart's buffer changes before the backward)
        if self.native is kernel:
            alphas, weights, sums = cpu_scan.forward(init, xs, unary, is_max, keep)
            backward = lambda g: cpu_scan.backward(init, xs, unary, alphas, weights, sums, g, is_max)  # noqa: E731
        else:
            alphas, base = triton_scan.forward(init, xs, unary, is_max)
            backward = lambda g: triton_scan.backward(init, xs, unary, alphas, base, g, is_max)  # noqa: E731
        return _NativeScan(alphas, backward, shape)

    @staticmethod
    def _pair_scan_takes(init: Tensor, xs: Tensor, unary: Tensor | None) -> bool:
        return cpu_scan.pair_applies(init, xs, unary) and init.shape[1] * init.shape[2] ** 2 <= PAIR_SCAN_TERMS

    def pair_scan_applies(self, scan: Scan, buf: dict[str, Tensor]) -> bool:
        """Whether the C scan's pair loops take a run of chain levels on pairs (value, tangent): not
        where its levels hold more than :data:`PAIR_SCAN_TERMS` terms (the levels then run one by one)."""
        return self._pair_scan_takes(*self.scan_views(scan, buf)[:3])

    def pair_scan(self, scan: Scan, buf: dict[str, Tensor]) -> "_NativeScan | None":
        """A run of chain levels on pairs (value, tangent) by the C scan's pair loops (Log), or None
        where they do not take it (:meth:`pair_scan_applies`)."""
        init, xs, unary, shape = self.scan_views(scan, buf)
        if not self._pair_scan_takes(init, xs, unary):
            return None
        alphas, backward = cpu_scan.pair_forward(init, xs, unary)
        return _NativeScan(alphas, backward, shape)

    def forward(self, elements: list[Tensor], dual: bool = False, keep: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
        """Every level into the buffers: (goal ``[*, B]``, the buffers with the inputs). ``keep``:
        keep what the backward of fused scans needs (their graphs)."""
        like = elements[0] if elements else torch.zeros(0)
        buf = self.sources(elements)
        fused = not dual or self.pair_kernel
        buf.update(self.buffers(like, arena=fused, dual=dual))
        manual = (_DUAL if dual else _MANUAL).get(type(self.semiring))
        scans = self.scans(dual)
        if not dual:  # (a run on pairs keeps only its scans, in a copy of its own: paired())
            self.kept = {}
        compiled = self.kernel(buf, dual)
        levels = self.levels(fused=fused)
        lev = 0
        while lev < len(levels):
            ran = compiled.forward(lev) if compiled is not None else 0  # (a stretch of levels at once)
            if ran:
                lev += ran
                continue
            native = None
            if lev in scans:
                native = self.pair_scan(scans[lev], buf) if dual else self.native_scan(scans[lev], buf, keep)
            if lev in scans and (native is not None or not dual):
                scan = scans[lev]
                if native is not None:
                    alphas, self.kept[lev] = native.alphas, native
                else:
                    leaves = []

                    def read(v: View) -> Tensor:
                        t = self.view(buf[v.source], v)
                        if keep:  # (a chart's items are copied: the buffer changes before the backward)
                            t = (t.detach() if v.source in self.plan.shapes else t.clone()).requires_grad_()
                            leaves.append((v, t))
                        return t

                    with torch.set_grad_enabled(keep):
                        alphas = self.scan(scan, read)
                    self.kept[lev] = (alphas, leaves)
                for v in scan.heads:
                    self.view(buf[v.source], v).copy_(alphas)
                lev = scan.stop
                continue
            kept = self.keepable() if keep else ()
            for step in levels[lev]:
                if manual:
                    manual.step(self, step, buf, id(step) in kept)
                else:
                    self.write(buf, step, self.compute(step, lambda v: self.read(buf, v), like))
            lev += 1
        return self.select_goal(buf[GOAL]), buf

    # ------------------------------------------------------------ backward, in place

    def gradients(self, buf: dict[str, Tensor]) -> "_Grads":
        """Zero-filled gradient buffers of the charts and of every floating input."""
        grads = _Grads(buf)
        for name in self.names:
            if name not in self.plan.looked_up:
                grads[name]
        return grads

    def backward(self, buf: dict[str, Tensor], grad: Tensor, shapes, dual: bool = False, grads: "_Grads | None" = None) -> list[Tensor]:
        """Gradients of the inputs (in their shapes), level by level in reverse, accumulated in place
        (into ``grads`` where given: :meth:`gradients`)."""
        grads = _Grads(buf) if grads is None else grads
        grads[GOAL] = self.goal_gradient(buf[GOAL], grad)
        if dual:
            grads[GOAL][1] = 0  # (the seed's tangent)
        manual = (_DUAL if dual else _MANUAL).get(type(self.semiring))
        ends = {scan.stop - 1: scan for scan in self.scans(dual).values() if scan.start in self.kept}  # (pairs: the scans that ran)
        compiled = self.kernel(buf, dual)
        levels = self.levels(fused=not dual or self.pair_kernel)
        lev = len(levels) - 1
        while lev >= 0:
            ran = compiled.backward(lev, grads) if compiled is not None else 0  # (a stretch of levels at once)
            if ran:
                lev -= ran
                continue
            if lev in ends:
                scan = ends[lev]
                g = self.view(grads[scan.heads[0].source], scan.heads[0])
                for v in scan.heads[1:]:
                    g = g + self.view(grads[v.source], v)
                kept = self.kept[scan.start]
                if isinstance(kept, _NativeScan):
                    found = kept.backward(g)
                    leaves = [scan.init, scan.matrix, scan.unary]
                else:
                    alphas, leaves = kept
                    found = torch.autograd.grad(alphas, [t for _, t in leaves], g, allow_unused=True, retain_graph=True)
                    leaves = [v for v, _ in leaves]
                for v, gv in zip(leaves, found):
                    if gv is not None:  # (a scan's gradients are fresh tensors, one per input)
                        self.add(grads, v, gv, owned=True)
                lev = scan.start - 1
                continue
            for group in _backward_order(levels[lev]):
                if manual:
                    for step in group:
                        manual.vjp(self, step, buf, grads)
                else:
                    self._autograd_vjp(group, buf, grads)
            lev -= 1
        return [None if name in self.plan.looked_up else grads[name].reshape(shape) for name, shape in zip(self.names, shapes)]

    def item_gradient(self, step: Step, grads: dict[str, Tensor]) -> Tensor:
        """The gradient of the step's items: the sum over the layouts their readers added into."""
        g = self.view(grads[step.heads[0].source], step.heads[0])
        for v in step.heads[1:]:
            g = g + self.view(grads[v.source], v)
        return g

    def add(self, grads: dict[str, Tensor], v: View, g: Tensor, owned: bool = False, buf: dict[str, Tensor] | None = None) -> None:
        """``grads[v.source][positions of v] += g``, repeated positions accumulated; ``g`` may
        have a larger batch than the source (a batch of 1 is shared: summed over). ``owned``: no
        other tensor shares ``g``'s memory, so it may become the buffer."""
        if v.lookups:
            self._add_looked_up(grads, v, g, buf)
            return
        if v.injective and not v.broad and v.source in grads:  # the common case: one strided add
            dst = grads[v.source]
            if g.shape == dst.shape[:-1] + v.sizes:
                dst.as_strided(g.shape, (*dst.stride()[:-1], *v.strides), dst.storage_offset() + v.offset).add_(g)
                return
        if owned and v.source not in grads and v.whole and g.shape == grads.like(v.source).shape[:-1] + v.sizes:
            grads[v.source] = g.reshape(*g.shape[: g.dim() - len(v.sizes)], -1)  # the first gradient of all of it
            return
        dst = grads[v.source]
        lead = dst.dim() - 1
        if g.shape[:lead] != dst.shape[:lead]:
            g = g.sum([i for i in range(lead) if dst.shape[i] == 1 and g.shape[i] != 1], keepdim=True)
        n = len(v.sizes)
        if g.dim() - lead < n or any(g.shape[lead + d] != v.sizes[d] for d in range(n) if v.narrow[d] > 1):
            g = g.expand(*g.shape[:lead], *v.sizes)
        if v.broad:
            g = g.sum([lead + d for d in v.broad], keepdim=True)
        if v.injective:
            dst.as_strided((*dst.shape[:-1], *v.narrow), (*dst.stride()[:-1], *v.strides), dst.storage_offset() + v.offset).add_(g)
            return
        pos = Run.positions(v.offset, v.strides, v.narrow, dst.device)
        g = torch.where((pos >= 0) & (pos < v.bound), g, 0)
        dst.index_add_(-1, pos.clamp(0, v.bound - 1).reshape(-1), g.expand(*g.shape[:lead], *v.narrow).reshape(*g.shape[:lead], -1))

    def _add_looked_up(self, grads, v: View, g: Tensor, buf) -> None:
        """The gradient of a view with positions from data: scattered to them, per example."""
        dst = grads[v.source]
        pos = self.looked_up(buf, v, dst.device)
        lead = dst.dim() - 2  # the semiring's components
        batch = max(g.shape[lead], pos.shape[0])
        pos = pos.reshape(pos.shape[0], -1).expand(batch, -1)
        g = g.expand(*g.shape[:lead], batch, *v.sizes).reshape(*g.shape[:lead], batch, -1)
        if dst.shape[-2] == 1 < batch:  # potentials shared by the batch
            dst.select(-2, 0).index_add_(-1, pos.reshape(-1), g.reshape(*g.shape[:lead], -1))
        else:
            dst.scatter_add_(-1, pos.expand(*g.shape[:lead], batch, -1), g)

    def _autograd_vjp(self, steps: list[Step], buf, grads) -> None:
        """Recompute one level under a local autograd graph and add its gradients to the buffers."""
        leaves: list[tuple[View, Tensor]] = []
        like = next(iter(buf.values()))

        def read(v: View) -> Tensor:
            t = self.read(buf, v).detach().requires_grad_()
            leaves.append((v, t))
            return t

        outs = []
        with torch.enable_grad():
            values = [self.compute(step, read, like) for step in steps]
            accumulating = {s.form.chart for s in steps if s.shared}
            flat: dict[str, tuple[Tensor, Tensor]] = {}  # chart -> (its items ⊕-combined, their gradient)
            for step, v in zip(steps, values):
                chart = step.form.chart
                if chart not in accumulating:
                    outs.append((v, self.item_gradient(step, grads)))
                    continue
                if chart not in flat:  # items several steps write: ⊕ them in a level-local chart
                    flat[chart] = (self.semiring.zero(buf[chart].shape[self.lead:], like), torch.zeros_like(grads[chart]))
                f, g = flat[chart]
                self.view(g, step.heads[0]).copy_(self.item_gradient(step, grads))
                flat[chart] = (self.put(f, step.heads[0], v, accumulate=True), g)
            outs += list(flat.values())
        outs = [(v, g) for v, g in outs if v.requires_grad]
        if not outs or not leaves:
            return
        found = torch.autograd.grad([v for v, _ in outs], [t for _, t in leaves], [g for _, g in outs], allow_unused=True)
        for (v, _), g in zip(leaves, found):
            if g is not None:
                self.add(grads, v, g, buf=buf)

    # ------------------------------------------------------------ functional: plain autograd

    def put(self, buf: Tensor, v: View, value: Tensor, accumulate: bool) -> Tensor:
        """``buf`` with the step's items written (⊕-combined with what is there if ``accumulate``),
        out of place: differentiable (an index copy: torch's strided scatter double-counts the
        gradient of what it overwrites when that was read)."""
        L = v.sizes
        pos = self.positions(v.offset, v.strides, L, buf.device).reshape(-1)
        if accumulate:
            value = self.semiring.plus(buf.index_select(-1, pos).reshape(*buf.shape[:-1], *L), value)
        value = value.expand(*buf.shape[:-1], *L)
        return buf.index_copy(-1, pos, value.reshape(*buf.shape[:-1], -1))

    def functional(self, elements: list[Tensor]) -> Tensor:
        """The forward pass with out-of-place writes: differentiable to any order by autograd."""
        like = elements[0] if elements else torch.zeros(0)
        buf = self.sources(elements)
        buf.update(self.buffers(like, arena=False))
        scans, skip = self.scans(False), 0
        for lev, steps in enumerate(self.levels()):
            if lev < skip:
                continue
            if lev in scans:
                scan, skip = scans[lev], scans[lev].stop
                alphas = self.scan(scan, lambda v: self.view(buf[v.source], v))
                for v in scan.heads:
                    buf[v.source] = self.put(buf[v.source], v, alphas, False)
                continue
            for step in steps:
                value = self.compute(step, lambda v: self.read(buf, v), like)
                for v in step.heads:
                    buf[v.source] = self.put(buf[v.source], v, value, step.accumulate)
        return self.select_goal(buf[GOAL])


def native(semiring: Semiring, inputs):
    """The module of the kernels a run of ``semiring`` on these input tensors takes:
    :mod:`.triton_levels` (CUDA), :mod:`.kernel` (the CPU's C loop), or None (torch calls)."""
    for module in (triton_levels, kernel):
        if module.applies(semiring, inputs):
            return module
    return None


@dataclass
class _NativeScan:
    """A run of chain levels by a native scan (:meth:`Run.native_scan`): its states, its backward
    (the states' gradient -> those of ``(init, xs, unary)``) and the shape of the view of the
    matrices (one matrix for every level: read once)."""

    alphas: Tensor
    scan_backward: Callable[[Tensor], tuple[Tensor, Tensor, Tensor | None]]
    read_shape: tuple[int, ...]

    def backward(self, grad: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """The gradients of the views of ``(init, matrix, unary)`` from the states' ``grad``."""
        g_init, g_xs, g_unary = self.scan_backward(grad)
        if g_xs.shape[-3] != self.read_shape[-3]:  # (its levels' view repeats the one matrix: the sum is had once)
            g_xs = torch.cat([g_xs, g_xs.new_zeros(*g_xs.shape[:-3], self.read_shape[-3] - 1, *g_xs.shape[-2:])], -3)
        return g_init, g_xs, g_unary


class _Grads(dict):
    """Gradient buffers, zero-filled when first used (an input whose gradient comes whole from one
    step, a scan's, takes that tensor instead); the charts' in an arena where their values are."""

    def __init__(self, buffers: dict[str, Tensor]):
        super().__init__()
        self.buffers = buffers
        if ARENA in buffers:
            arena = self[ARENA] = torch.zeros_like(buffers[ARENA])
            storage = buffers[ARENA].untyped_storage().data_ptr()
            for key, b in buffers.items():  # (not b._base: inference mode does not record views)
                if key != ARENA and b.numel() and b.untyped_storage().data_ptr() == storage:
                    self[key] = arena.narrow(-1, b.storage_offset() - buffers[ARENA].storage_offset(), b.shape[-1])

    def like(self, key: str) -> Tensor:
        return self.buffers[key]

    def __missing__(self, key: str) -> Tensor:
        self[key] = torch.zeros_like(self.buffers[key])
        return self[key]


def _backward_order(steps: list[Step]) -> list[list[Step]]:
    """A level's steps for the backward pass, per chart: charts in reverse stratum order (a chart's
    items have their whole gradient once the charts that read them at this level are done), the
    rules of one chart in program order (Max: the first rule to reach an item claims its gradient)."""
    groups: dict[str, list[Step]] = {}
    for step in steps:
        groups.setdefault(step.form.chart, []).append(step)
    return [groups[chart] for chart in reversed(list(groups))]


class _Manual:
    """A step and its vector-Jacobian product written out for one semiring: ``reduce(terms, out)``
    (⊕ over the last dimension, may work in place; into ``out`` where given and of its shape),
    ``plus_(dst, value)`` (``dst ⊕= value`` in place: rules after the first writing the same items),
    ``weights(terms, item, g, shared)`` (the gradient of each instance); optionally
    ``keeping(terms, out)``, a reduce that also returns what ``reweigh(kept, item, g, shared)``
    turns into the same weights without recomputing the terms. ``direct``: items may be computed
    straight into the chart's buffer (not on pairs); ``empty(s, m)``: ``s`` where ``m`` holds,
    the semiring's zero (a pair's: -inf and tangent 0) elsewhere."""

    def __init__(self, reduce, weights, claim, plus_, keeping=None, reweigh=None, direct=True, empty=None):
        self.reduce, self.weights, self.claim, self.plus_ = reduce, weights, claim, plus_
        self.keeping, self.reweigh, self.direct = keeping, reweigh, direct
        self.empty = empty or (lambda s, m: s.masked_fill(~m, -math.inf))

    def terms(self, run: Run, step: Step, buf, out: Tensor | None = None) -> Tensor:
        """``Σ reads`` over the whole box ``[*, B, *coords]`` (outer terms too: broadcast over K),
        on a fresh tensor (or ``out``, where the sum has its shape and needs no mask), ``-inf``
        where the box holds no instance."""
        n, k = len(step.sizes), len(step.K)
        first_outer = len(step.reads) - step.form.outer
        vals = [run.read(buf, v) for v in step.reads[:first_outer] if v is not None]
        if first_outer < len(step.reads):  # outer terms vary with the L coordinates only
            vals += [run.read(buf, v)[(..., *[None] * k)] for v in step.reads[first_outer:] if v is not None]
        if out is not None and len(vals) > 1 and not step.masks and (vals[0].shape == out.shape or vals[1].shape == out.shape):
            s = torch.add(vals[0], vals[1], out=out)
            for v in vals[2:]:
                s.add_(v)
            return s
        if not vals:
            s = torch.zeros((1, *step.sizes), dtype=buf[GOAL].dtype, device=buf[GOAL].device)
        else:
            s = vals[0] + vals[1] if len(vals) > 1 else vals[0].clone()
            for v in vals[2:]:
                s = s + v
        if s.shape[s.dim() - n:] != step.sizes:
            s = s.expand(*s.shape[: s.dim() - n], *step.sizes).clone()
        m = run.mask(step, s.device)
        return s if m is None else self.empty(s, m)

    def step(self, run: Run, step: Step, buf, keep: bool = False) -> None:
        """Compute the step's items and write them to every layout of its chart (⊕ into what
        earlier steps of the level wrote; else, where shapes allow, straight into the first
        layout); ``keep``: a backward follows, so keep what it can reuse."""
        k = len(step.K)
        first = run.view(buf[step.heads[0].source], step.heads[0]) if self.direct and not step.accumulate else None
        if not k:
            value = self.terms(run, step, buf, first)
        else:
            s = self.terms(run, step, buf)
            s = s.reshape(*s.shape[: s.dim() - k], -1)
            if keep and self.keeping is not None:
                value, run.kept[id(step)] = self.keeping(s, first)
            else:
                value = self.reduce(s, first)
        if value is first:
            for v in step.heads[1:]:
                run.view(buf[v.source], v).copy_(first)
        else:
            run.write(buf, step, value.expand(*value.shape[: run.lead], run.batch, *step.L), self.plus_)

    def vjp(self, run: Run, step: Step, buf, grads) -> None:
        form = step.form
        if all(rd is None for rd in form.reads):
            return
        g = run.item_gradient(step, grads)
        k = len(step.K)
        kept = run.kept.get(id(step)) if self.reweigh else None  # (not consumed: a second backward gives the same bits)
        if kept is not None:
            item = run.view(buf[step.heads[0].source], step.heads[0]) if step.shared else None
            w = self.reweigh(kept, item, g, step.shared)
            w = w.reshape(*w.shape[:-1], *step.K)
        elif k or step.shared:
            item = run.view(buf[step.heads[0].source], step.heads[0])
            s = self.terms(run, step, buf)
            flat = s.reshape(*s.shape[: s.dim() - k], -1) if k else s.unsqueeze(-1)
            w = self.weights(flat, item, g, step.shared)
            if step.shared and self.claim is not None:
                self.claim(run, step, grads, flat, item)
            if w is None:
                return
            w = w.reshape(s.shape) if k else w.squeeze(-1)
        else:  # one instance per item: its gradient passes unchanged
            w = g
        first_outer = len(form.reads) - form.outer
        for j, v in enumerate(step.reads):
            if v is None:
                continue
            if j < first_outer:
                run.add(grads, v, w, buf=buf)
            else:
                run.add(grads, v, w.sum(list(range(w.dim() - k, w.dim()))) if k else w, buf=buf)


def _into(a: Tensor, b: Tensor, out: Tensor | None) -> Tensor:
    """``a + b``: into ``out`` where given and of the sum's shape, else in place on ``a``."""
    if out is not None and a.shape == out.shape:
        return torch.add(a, b, out=out)
    return a.add_(b)


def _logsumexp_(terms: Tensor, out: Tensor | None = None) -> Tensor:
    """Log ⊕ over the last dimension, in place on ``terms`` (into ``out``: :func:`_into`)."""
    info = torch.finfo(terms.dtype)
    m = terms.amax(-1, keepdim=True).clamp_(info.min, info.max)
    s = terms.sub_(m).exp_().sum(-1)
    return _into(s.log_(), m.squeeze(-1), out)


def _logsumexp_keeping(terms: Tensor, out: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
    """:func:`_logsumexp_` that also keeps ``p = exp(terms - max)``, the max and ``Σ p``: the
    backward's weights are then one product away (:func:`_reweigh`)."""
    info = torch.finfo(terms.dtype)
    m = terms.amax(-1, keepdim=True).clamp_(info.min, info.max)
    p = terms.sub_(m).exp_()
    s = p.sum(-1)
    return _into(s.log(), m.squeeze(-1), out), (p, m, s)


def _amax(terms: Tensor, out: Tensor | None = None) -> Tensor:
    """Max ⊕ over the last dimension (into ``out`` where given and of the result's shape)."""
    if out is not None and terms.shape[:-1] == out.shape:
        return torch.amax(terms, -1, out=out)
    return terms.amax(-1)


def _reweigh(kept: tuple[Tensor, Tensor, Tensor], item: Tensor | None, g: Tensor, shared: bool) -> Tensor:
    """Log: the weights ``exp(terms - item) * g`` from the forward's ``exp(terms - max)``: ``p * g /
    Σ p`` where the step alone wrote its items (``Σ p >= 1`` where any term is finite; an item
    without derivations has ``p = 0``), else through the item, the ⊕ of every rule's."""
    p, m, s = kept
    if not shared:
        return p * g.div(s.clamp_min(1)).unsqueeze(-1)
    info = torch.finfo(p.dtype)
    return p * (m.squeeze(-1) - item.clamp(info.min, info.max)).exp_().mul_(g).unsqueeze(-1)


def _softmax_weights(terms: Tensor, item: Tensor, g: Tensor, shared: bool) -> Tensor:
    """Log: ``exp(terms - item) * g``, in place on ``terms`` (``item`` the ⊕ of every rule's)."""
    info = torch.finfo(terms.dtype)
    return terms.sub_(item.clamp(info.min, info.max).unsqueeze(-1)).exp_().mul_(g.unsqueeze(-1))


def _argmax_weights(terms: Tensor, item: Tensor, g: Tensor, shared: bool) -> Tensor | None:
    """Max: ``g`` at the first maximum of each slice, where it is the item's value (with several
    rules, the first rule to reach it; :func:`_claim` then takes ``g`` from the others)."""
    shape = tuple(max(a, b) for a, b in zip(terms.shape[:-1], g.shape))  # same rank: [*, B, *L]
    terms, g = terms.expand(*shape, terms.shape[-1]), g.expand(shape)
    best, where = terms.max(-1)
    if shared:
        g = torch.where(best == item.expand(shape), g, 0)
    return torch.zeros_like(terms).scatter_(-1, where.unsqueeze(-1), g.unsqueeze(-1))  # no host synchronisation


def _claim(run: Run, step: Step, grads, flat: Tensor, item: Tensor) -> None:
    """Max, several rules writing one item: the first whose best equals the item took its gradient."""
    won = flat.max(-1).values == item
    for v in step.heads:
        view = run.view(grads[v.source], v)
        view.masked_fill_(won.expand(view.shape), 0)


# Pairs (value, tangent) ``[2, *, B, ...]``: Log ⊕ of terms s with tangents ṡ is (log Σ e^s, Σ p ṡ),
# p = softmax(s); the gradient g (tangent ġ) of an item α (tangent α̇) reaches its instances as
# w = e^(s - α) g, whose tangent is e^(s - α) (ġ + g (ṡ - α̇)).

def _pair_logsumexp(terms: Tensor, out: Tensor | None = None) -> Tensor:
    """Log ⊕ over the last dimension of pairs ``[2, ..., K]`` -> ``[2, ...]`` (tangent 0 where
    every term is -inf: an item without derivations)."""
    s, ds = terms[0], terms[1]
    info = torch.finfo(s.dtype)
    m = s.amax(-1, keepdim=True).clamp_(info.min, info.max)
    p = (s - m).exp_()
    z = p.sum(-1)
    tangent = (p * ds).sum(-1).div_(z.clamp_min(1))  # (z >= 1 where any term is finite: its largest gives 1)
    return torch.stack((z.log_().add_(m.squeeze(-1)), tangent))


def _pair_weights(terms: Tensor, item: Tensor, g: Tensor, shared: bool) -> Tensor:
    """The instances' gradients of pairs: ``[2, ..., K]`` from terms ``[2, ..., K]``, items and
    their gradients ``[2, ...]``."""
    info = torch.finfo(terms.dtype)
    a, da = item[0].clamp(info.min, info.max).unsqueeze(-1), item[1].unsqueeze(-1)
    g0, g1 = g[0].unsqueeze(-1), g[1].unsqueeze(-1)
    e = (terms[0] - a).exp_()
    return torch.stack(torch.broadcast_tensors(e * g0, e * (g1 + g0 * (terms[1] - da))))


def _pair_plus(dst: Tensor, value: Tensor) -> None:
    dst.copy_(_pair_logsumexp(torch.stack(torch.broadcast_tensors(dst, value), -1)))


def _pair_empty(s: Tensor, m: Tensor) -> Tensor:
    return torch.stack((s[0].masked_fill(~m, -math.inf), s[1].masked_fill(~m, 0)))


_MANUAL = {LogSemiring: _Manual(_logsumexp_, _softmax_weights, None, lambda dst, v: torch.logaddexp(dst, v, out=dst),
                                _logsumexp_keeping, _reweigh),
           MaxSemiring: _Manual(_amax, _argmax_weights, _claim, lambda dst, v: torch.maximum(dst, v, out=dst))}
_DUAL = {LogSemiring: _Manual(_pair_logsumexp, _pair_weights, None, _pair_plus, direct=False, empty=_pair_empty)}
