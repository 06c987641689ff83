"""A checked program, compiled per input shape and run in any semiring."""

from __future__ import annotations

import warnings
from dataclasses import replace
from collections import OrderedDict
from typing import Mapping

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from ..semirings import Log, LogSemiring, Semiring
from . import tape
from .autodiff import Tape
from .execute import Run
from .factor import factor
from .grounding import ground
from .levels import find_levels
from .plan import Plan, Unsupported, build, layouts, summed_variables
from .schedule import Level, Read, Schedule, Step, schedule
from .syntax import GOAL, LENGTH, Affine, ProgramError, Rule, Term, parse


PLANS = 32  # plans kept per program (one per set of input sizes)


class Program:
    """Weighted deduction rules over named charts; call it to run it.

    ``program(semiring=Log, lengths=None, **inputs)`` takes every input as a batch-first tensor of
    log-potentials ``[B, *shape]`` (``shape`` with as many entries as the input has indices in the
    rules; a batch of 1 is shared by every example) and returns the goal, one value per example: ``[*components, B]``. ``lengths[b]`` is the
    ``n`` the goal of example b is read at; the default is the largest ``n`` the shapes allow.
    """

    def __init__(self, text: str):
        self.text = text
        self.syntax = parse(text)
        rules = [self._with_length(r) for r in self.syntax.rules]
        self.rules: list[Rule] = factor(rules)
        self.inputs: list[str] = list(self.syntax.inputs)
        self._schedules: dict[tuple, tuple[Schedule, object]] = {}
        self.levels = find_levels(self.rules, self.syntax)
        if self.levels is not None:
            charts = {r.head.name: len(r.head.indices) for r in self.rules}
            self._layouts = layouts(self.rules, charts, {i: summed_variables(r) for i, r in enumerate(self.rules)})
        self._plans: OrderedDict[tuple, Plan | None] = OrderedDict()

    def _with_length(self, rule: Rule) -> Rule:
        if rule.head.name != GOAL or not self.syntax.uses_length:
            return rule
        return Rule(Term(GOAL, (Affine(((LENGTH, 1),)),), rule.line, rule.head.col), rule.terms, rule.ranges, rule.conds, rule.line, rule.text)

    # ------------------------------------------------------------ checking

    def shapes(self, inputs: Mapping[str, Tensor]) -> tuple[int, dict[str, tuple[int, ...]]]:
        """Check the inputs against the rules; return the batch size and per-example shapes."""
        unknown = set(inputs) - set(self.inputs)
        if unknown:
            raise ValueError(f"unknown input(s) {sorted(unknown)}; the program's inputs are {self.inputs}")
        batch = None
        shapes = {}
        for name in self.inputs:
            rank, first = self.syntax.inputs[name]
            if name not in inputs:
                raise ProgramError(f"input {name!r} is not given", first.line, first.col, self._line(first.line))
            x = inputs[name]
            if not isinstance(x, Tensor):
                raise ValueError(f"{name}: expected a tensor, got {type(x).__name__}")
            if x.dim() != rank + 1:
                raise ProgramError(
                    f"input {name!r} has {rank} indices here, so it needs shape [B, {', '.join('?' * rank)}] "
                    f"(batch first), got {tuple(x.shape)}", first.line, first.col, self._line(first.line))
            if batch is None or batch == 1:
                batch = x.shape[0] if batch is None or x.shape[0] != 1 else batch
            elif x.shape[0] not in (1, batch):
                raise ValueError(f"{name}: batch size {x.shape[0]} differs from the other inputs' {batch} (1 broadcasts)")
            shapes[name] = tuple(x.shape[1:])
        return (batch or 0), shapes

    def _line(self, number: int) -> str:
        return self.text.splitlines()[number - 1] if number else ""

    def compiled(self, shapes: dict[str, tuple[int, ...]]) -> Schedule:
        key = tuple(sorted(shapes.items()))
        if key not in self._schedules:
            gr = ground(self.rules, self.syntax, shapes)
            self._schedules[key] = (schedule(gr, [r.head.name for r in self.rules]), gr)
        return self._schedules[key][0]

    def grounding(self, shapes: dict[str, tuple[int, ...]]):
        self.compiled(shapes)
        return self._schedules[tuple(sorted(shapes.items()))][1]

    def plan(self, shapes: dict[str, tuple[int, ...]]) -> Plan | None:
        """The plan at these input sizes (None: the program needs the grounding executor); the
        last ``PLANS`` are kept."""
        key = tuple(sorted(shapes.items()))
        if key in self._plans:
            self._plans.move_to_end(key)
            return self._plans[key]
        plan = None
        if self.levels is not None:
            try:
                plan = build(self.rules, self.syntax, self.levels, dict(shapes), self._layouts)
            except Unsupported:
                plan = None
        self._plans[key] = plan
        if len(self._plans) > PLANS:
            self._plans.popitem(last=False)
        return plan

    def lengths_allowed(self, shapes: dict[str, tuple[int, ...]]) -> np.ndarray:
        """The values of ``n`` the goal is defined at for these shapes."""
        plan = self.plan(shapes)
        return plan.lengths if plan is not None else self.compiled(shapes).lengths

    def check_lengths(self, lengths: Tensor | None, batch: int, shapes) -> Tensor | None:
        allowed = self.lengths_allowed(shapes)
        if lengths is None:
            if allowed.size == 0:
                raise ValueError("these shapes admit no structure (the goal is never defined)")
            return None
        if not self.syntax.uses_length:
            raise ValueError("lengths: this program does not use the length 'n'")
        if not isinstance(lengths, Tensor):
            lengths = torch.as_tensor(lengths)
        if lengths.dim() != 1 or lengths.shape[0] != batch or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise ValueError(f"lengths: expected an integer tensor of shape [B] = [{batch}], got {lengths.dtype} {tuple(lengths.shape)}")
        if allowed.size and allowed[-1] - allowed[0] + 1 == allowed.size:  # a range: two comparisons
            ok = ((lengths >= int(allowed[0])) & (lengths <= int(allowed[-1]))).cpu().numpy()
        else:
            ok = np.isin(lengths.cpu().numpy(), allowed)
        if not ok.all():
            bad = lengths[torch.from_numpy(~ok)].tolist()
            raise ValueError(f"lengths: {bad} out of range; these shapes allow {allowed.min()}..{allowed.max()}" if allowed.size else "lengths: these shapes admit no structure")
        return lengths

    # ------------------------------------------------------------ running

    def __call__(self, semiring: Semiring = Log, lengths: Tensor | None = None, **inputs: Tensor) -> Tensor:
        batch, shapes = self.shapes(inputs)
        lengths = self.check_lengths(lengths, batch, shapes)
        raw = [inputs[name] for name in self.inputs]
        semiring.prepare(raw)
        elements = {name: semiring.convert(x) for name, x in zip(self.inputs, raw)}
        return self.run(semiring, elements, lengths, batch, shapes)

    def run(self, semiring: Semiring, elements: Mapping[str, Tensor], lengths: Tensor | None, batch: int, shapes) -> Tensor:
        """Run on already converted elements ``[*components, B, *shape]`` (differentiate through these)."""
        plan = self.plan(shapes)
        if plan is not None:
            return Tape.apply(Run(plan, semiring, list(elements), lengths, batch), *elements.values())
        sch = self.compiled(shapes)
        job = _Job(self, semiring, sch, lengths, batch, list(elements))
        if sch.gathers_levels:  # reads spanning many levels: the tape's in-place gradients pay off
            return _Tape.apply(job, *elements.values())
        return job.forward_plain(list(elements.values()))  # every read a view of one level: plain autograd is cheapest


class _Job:
    """One run of a schedule in a semiring: forward level by level, and its two backward passes."""

    def __init__(self, program: Program, semiring: Semiring, sch: Schedule, lengths, batch: int, names: list[str]):
        self.program, self.semiring, self.sch = program, semiring, sch
        self.lengths, self.batch, self.names = lengths, batch, names
        self.lead = semiring.extra

    def chunks(self, elements: list[Tensor]) -> "_Chunks":
        """Every input's per-level chunks ``[*, B, size]``, each input split once, when first read."""
        return _Chunks(self, elements)

    def select_goal(self, goal: Tensor) -> Tensor:
        """``[*, B, lengths]`` -> ``[*, B]``: each example's goal at its own length."""
        if self.lengths is None:
            return goal[..., -1]
        return goal.gather(-1, self.goal_index(goal)).squeeze(-1)

    def goal_index(self, goal: Tensor) -> Tensor:
        allowed = torch.as_tensor(self.sch.lengths, device=goal.device)
        where = torch.searchsorted(allowed, self.lengths.to(goal.device, allowed.dtype))
        return where.reshape(*([1] * self.lead), -1, 1).expand(*goal.shape[:-1], 1)

    def step(self, step: Step, read, like: Tensor) -> Tensor:
        """One rule at one level: read every term as ``[*, B, L, K]``, ⊗ them, ⊕ over K -> ``[*, B, L]``."""
        semiring, L = self.semiring, step.L
        inner = step.reads[: len(step.reads) - step.outer]
        value = self._sum(step, [read(rd) for rd in inner if rd.kind != "one"], like)
        for rd in step.reads[len(inner):]:
            if rd.kind != "one":
                value = semiring.times(value, read(rd).squeeze(-1))
        return value.expand(*value.shape[:-2], self.batch, L) if value.shape[-2:] != (self.batch, L) else value

    def _sum(self, step: Step, vals: list[Tensor], like: Tensor) -> Tensor:
        """⊕ over K of the ⊗ of ``vals`` (each ``[*, B, L, K]`` or broadcastable): ``[*, B, L]``."""
        semiring, L, K = self.semiring, step.L, step.K
        if not vals:
            p = semiring.one((self.batch, L, K), like)
        elif step.mask is None and len(vals) <= 2 and K > 1:
            if len(vals) == 1:
                out = semiring.sum(vals[0].expand(*vals[0].shape[:-2], L, K), -1)
            else:
                a, b = vals
                if a.shape[-1] != K and b.shape[-1] != K:
                    a = a.expand(*a.shape[:-1], K)
                out = semiring.dot(a, b, -1)
            return out.expand(*out.shape[:-1], L) if out.shape[-1] != L else out
        else:
            p = vals[0]
            for v in vals[1:]:
                p = semiring.times(p, v)
        p = p.expand(*p.shape[:-2], L, K)
        if step.mask is not None:
            p = torch.where(step.mask.to(p.device), p, semiring.zero(p.shape[self.lead:], p))
        return p.squeeze(-1) if K == 1 else semiring.sum(p, -1)

    def assemble(self, level: Level, results: list[Tensor]) -> dict[str, Tensor]:
        """The items of every chart at one level, ⊕-combined from the steps that write them."""
        out = {}
        for chart, asm in level.charts.items():
            if asm.index is None:
                out[chart] = results[asm.steps[0]]
                continue
            parts = torch.cat([results[i] for i in asm.steps], dim=-1)
            M, J = asm.index.shape
            vals = parts.index_select(-1, asm.index.reshape(-1).to(parts.device)).reshape(*parts.shape[:-1], M, J)
            if asm.mask is not None:
                vals = torch.where(asm.mask.to(vals.device), vals, self.semiring.zero(vals.shape[self.lead:], vals))
            out[chart] = self.semiring.sum(vals, -1) if J > 1 else vals.squeeze(-1)
        return out

    # ---------------------------------------------------------------- differentiable (plain autograd)

    def forward_plain(self, elements: list[Tensor]) -> Tensor:
        """Every level a tensor of its own, every read a view or gather of them: plain autograd,
        so any order of derivative works (used when the backward pass must itself be differentiable)."""
        chunks = self.chunks(elements)
        like = elements[0] if elements else torch.zeros(0)
        store: dict[tuple[str, int], Tensor] = {}
        scanned: dict[tuple[str, int], tuple[Tensor, int]] = {}  # (chart, level) -> (its run's chart, first level)
        skip_to = 0
        for lev, level in enumerate(self.sch.levels):
            if lev < skip_to:
                continue
            run = self.sch.runs.get(lev)
            if run is not None and self._scan(run, elements, store, scanned):
                skip_to = run.stop
                continue
            concat: dict[tuple[str, tuple[int, ...]], Tensor] = {}

            def read(rd: Read) -> Tensor:
                if rd.kind == "input":
                    src = chunks[(rd.source, lev)]
                elif len(rd.levels) == 1:
                    src = store[(rd.source, rd.levels[0])]
                else:
                    key = (rd.source, rd.levels)
                    if key not in concat:
                        concat[key] = torch.cat(self._blocks(rd.source, rd.levels, store, scanned), dim=-1)
                    src = concat[key]
                return _read(src, rd)

            if lev == self.sch.goal_level and self.lengths is None and self._one_row(level):
                st = level.steps[0]  # only the goal at the largest length is read: compute that row alone
                results = [self.step(replace(st, L=1, mask=None if st.mask is None else st.mask[-1:]),
                                     lambda rd: _last_row(read(rd), st.L), like)]
            else:
                results = [self.step(st, read, like) for st in level.steps]
            for chart, value in self.assemble(level, results).items():
                store[(chart, lev)] = value
        return self.select_goal(store[(GOAL, self.sch.goal_level)])

    @staticmethod
    def _one_row(level: Level) -> bool:
        """Whether the level is one step that writes its items in order (a row of it is an item)."""
        return len(level.steps) == 1 and level.steps[0].L > 1 and all(a.index is None for a in level.charts.values())

    @staticmethod
    def _blocks(chart: str, levels: tuple[int, ...], store, scanned) -> list[Tensor]:
        """The values of ``chart`` at ``levels``, in order, as few tensors as possible: consecutive
        levels of one scan are one slice of its output (per-level views would each cost a
        chart-sized gradient)."""
        out, i = [], 0
        while i < len(levels):
            if (chart, levels[i]) not in scanned:
                out.append(store[(chart, levels[i])])
                i += 1
                continue
            alphas, first = scanned[(chart, levels[i])]
            j = i
            while j + 1 < len(levels) and levels[j + 1] == levels[j] + 1 and scanned.get((chart, levels[j + 1]), (None,))[0] is alphas:
                j += 1
            block = alphas.narrow(-2, levels[i] - first, j - i + 1)
            out.append(block.reshape(*block.shape[:-2], -1))
            i = j + 1
        return out

    def _scan(self, run, elements: list[Tensor], store: dict[tuple[str, int], Tensor], scanned) -> bool:
        """Compute a run of chain levels by one ``semiring.scan``; False (the levels then run one by
        one) when an input's batch does not fit the scan's shapes."""
        T = run.stop - run.start
        flat = {name: x.reshape(*x.shape[: self.lead + 1], -1) for name, x in zip(self.names, elements)}
        x = flat[run.matrix]
        if run.shared:
            if x.shape[self.lead] != 1:
                return False
            xs = x.reshape(*x.shape[:-1], 1, run.K, run.L)
        else:
            if x.shape[self.lead] != self.batch:
                return False
            size = T * run.K * run.L  # (a narrow covering x whole would cost an x-sized gradient copy)
            xs = (x if size == x.shape[-1] else x.narrow(-1, run.offset, size)).reshape(*x.shape[:-1], T, run.K, run.L)
        unary = None
        if run.unary is not None:
            u = flat[run.unary]
            if u.shape[self.lead] != self.batch:
                return False
            unary = u.narrow(-1, run.unary_offset, T * run.L).reshape(*u.shape[:-1], T, run.L)
        alphas = self.semiring.scan(store[(run.chart, run.start - 1)], xs, unary)
        for t in range(T):
            store[(run.chart, run.start + t)] = alphas[..., t, :]
            scanned[(run.chart, run.start + t)] = (alphas, run.start)
        return True


class _Tape(torch.autograd.Function):
    """A program run as one autograd node: a fast first-order backward over the level tape. For
    higher orders (``create_graph=True``) the gradient is itself a node, :class:`_TapeGradient`,
    in the Log semiring; in the others a plain differentiable re-run."""

    @staticmethod
    def forward(ctx, job: _Job, *elements: Tensor) -> Tensor:
        ctx.job = job
        ctx.save_for_backward(*elements)
        out, ctx.state = tape.forward(job, [e.detach() for e in elements])
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        elements = ctx.saved_tensors
        if not torch.is_grad_enabled():
            return (None, *tape.backward(ctx.job, ctx.state, grad))
        if _TapeGradient.applies(ctx.job, elements):
            per_example = _TapeGradient.apply(ctx.job, ctx.state, *elements)
            return (None, *[g * grad.reshape(-1, *[1] * (g.dim() - 1)) for g in per_example])
        return (None, *_plain_gradient(ctx.job, grad, elements, create_graph=True))


def _plain_gradient(job: _Job, grad: Tensor, elements: tuple[Tensor, ...], create_graph: bool) -> list[Tensor | None]:
    """The gradient of ``⟨grad, goal⟩`` by a plain differentiable re-run (None where not needed)."""
    wanted = [e for e in elements if e.requires_grad]
    with torch.enable_grad():
        out = job.forward_plain(list(elements))
        found = iter(torch.autograd.grad(out, wanted, grad, create_graph=create_graph, allow_unused=True))
    return [next(found) if e.requires_grad else None for e in elements]


class _TapeGradient(torch.autograd.Function):
    """The gradient of every example's goal, ``∂goal_b/∂elements`` (Log semiring; example b's in
    row b of each input), as a node of its own, so that the backward of marginals (a loss on them:
    structured attention) runs on the tape too. (:class:`_Tape` weighs the rows by the incoming
    gradient with a plain product, so its derivative needs nothing here.)

    Its backward is a Hessian-vector product ``H V``. The Hessian of the log-partition is
    symmetric, so ``H V`` is the *forward*-mode derivative of the gradient in the direction ``V``:
    the tape's forward and backward passes run once more on dual tensors (primal + tangent), which
    costs about two first-order passes, where differentiating the backward pass in reverse mode
    needs a recorded graph of every level (the plain re-run, 3x slower). Its own backward (third
    order) is the plain re-run, differentiated twice."""

    @staticmethod
    def applies(job: _Job, elements: tuple[Tensor, ...]) -> bool:
        """Log semiring only (the tape's gradient is then the exact one; a sampling semiring's is
        not a gradient), every level's backward written out (a level recomputed under autograd
        would drop the tangents), and every input with the whole batch (one shared by the batch
        mixes the examples' gradients)."""
        return (type(job.semiring) is LogSemiring and all(lp.manual for lp in tape.plan(job.sch).levels)
                and all(e.shape[0] == job.batch for e in elements))

    @staticmethod
    def forward(ctx, job: _Job, state: tuple, *elements: Tensor):
        ctx.job = job
        ctx.save_for_backward(*elements)
        return tuple(tape.backward(job, state, elements[0].new_ones(job.batch)))

    @staticmethod
    def backward(ctx, *V: Tensor):
        elements = ctx.saved_tensors
        job = ctx.job
        ones = elements[0].new_ones(job.batch)
        if torch.is_grad_enabled():  # third order: differentiate a plain re-run twice
            gs = _plain_gradient(job, ones, elements, create_graph=True)
            pairs = [(g, v) for g, v in zip(gs, V) if g is not None and v is not None]
            wanted = [e for e in elements if e.requires_grad]
            if not pairs:
                return (None, None, *[None] * len(elements))
            found = iter(torch.autograd.grad([g for g, _ in pairs], wanted, [v for _, v in pairs],
                                             create_graph=True, allow_unused=True))
            return (None, None, *[next(found) if e.requires_grad else None for e in elements])
        with torch.no_grad(), fwAD.dual_level(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch scripts its jvp decompositions on first use
            duals = [fwAD.make_dual(e.detach(), torch.zeros_like(e) if v is None else v) for e, v in zip(elements, V)]
            _, state = tape.forward(job, duals, dual=True)
            hv = [fwAD.unpack_dual(g).tangent for g in tape.backward(job, state, ones, dual=True)]
        return (None, None, *[h if e.requires_grad else None for e, h in zip(elements, hv)])


class _Chunks:
    """``chunks[(input, level)]``: the input's entries read at that level, ``[*, B, size]``; an input
    is split into its per-level chunks on first use (a fused scan reads its inputs whole)."""

    def __init__(self, job: _Job, elements: list[Tensor]):
        self.job, self.elements = job, dict(zip(job.names, elements))
        self.parts: dict[str, list[Tensor] | Tensor] = {}

    def __getitem__(self, key: tuple[str, int]) -> Tensor:
        name, lev = key
        if name not in self.parts:
            x = self.elements[name]
            order, sizes = self.job.sch.chunks[name]
            flat = x.reshape(*x.shape[: self.job.lead + 1], -1)
            if sizes is None:  # read alike at every level: never split
                self.parts[name] = flat
            else:
                flat = flat if order is None else flat.index_select(-1, order.to(flat.device))
                self.parts[name] = list(torch.split(flat, sizes, dim=-1))
        part = self.parts[name]
        return part if isinstance(part, Tensor) else part[lev]


def _last_row(value: Tensor, L: int) -> Tensor:
    """The last of ``L`` rows of a read ``[*, L, K]`` (a read broadcast over rows, ``[*, 1, K]``, as is)."""
    return value.narrow(-2, L - 1, 1) if value.shape[-2] == L else value


def _read(src: Tensor, rd: Read) -> Tensor:
    """Read a term as ``[*, L, K]`` (or broadcastable to it) from a source ``[*, M]``."""
    L, K = rd.L, rd.K
    if rd.pattern == "reshape":
        return src.reshape(*src.shape[:-1], L, K)
    if rd.pattern == "transpose":
        return src.reshape(*src.shape[:-1], K, L).transpose(-1, -2)
    if rd.pattern == "row":
        return src.narrow(-1, rd.offset, K).unsqueeze(-2)
    if rd.pattern == "col":
        return src.narrow(-1, rd.offset, L).unsqueeze(-1)
    return src.index_select(-1, rd.index.to(src.device)).reshape(*src.shape[:-1], L, K)


def program(text: str) -> Program:
    """Parse and check ``text``; the result runs in any semiring (see :class:`Program`)."""
    return Program(text)
