"""A checked program, compiled per input shape and run in any semiring."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
from torch import Tensor

from ..semirings import Log, Semiring
from .factor import factor
from .grounding import ground
from .schedule import Read, Schedule, schedule
from .syntax import GOAL, LENGTH, Affine, ProgramError, Rule, Term, parse


class Program:
    """Weighted deduction rules over named charts; call it to run it.

    ``program(semiring=Log, lengths=None, **inputs)`` takes every input as a batch-first tensor of
    log-potentials ``[B, *shape]`` (``shape`` with as many entries as the input has indices in the
    rules) and returns the goal, one value per example: ``[*components, B]``. ``lengths[b]`` is the
    ``n`` the goal of example b is read at; the default is the largest ``n`` the shapes allow.
    """

    def __init__(self, text: str):
        self.text = text
        self.syntax = parse(text)
        rules = [self._with_length(r) for r in self.syntax.rules]
        self.rules: list[Rule] = factor(rules)
        self.inputs: list[str] = list(self.syntax.inputs)
        self._schedules: dict[tuple, tuple[Schedule, object]] = {}

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
            if batch is None:
                batch = x.shape[0]
            elif x.shape[0] != batch:
                raise ValueError(f"{name}: batch size {x.shape[0]} differs from the other inputs' {batch}")
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

    def lengths_allowed(self, shapes: dict[str, tuple[int, ...]]) -> np.ndarray:
        """The values of ``n`` the goal is defined at for these shapes."""
        return self.compiled(shapes).lengths

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
        sch = self.compiled(shapes)
        like = next(iter(elements.values())) if elements else torch.zeros(0)
        lead = semiring.extra
        chunks: dict[tuple[str, int], Tensor] = {}
        for name, (order, sizes) in sch.chunks.items():
            x = elements[name]
            flat = x.reshape(*x.shape[: lead + 1], -1)
            if order is not None:
                flat = flat.index_select(-1, order.to(flat.device))
            for lev, part in enumerate(torch.split(flat, sizes, dim=-1)):
                chunks[(name, lev)] = part
        store: dict[tuple[str, int], Tensor] = {}
        for lev, level in enumerate(sch.levels):
            concat: dict[tuple[str, tuple[int, ...]], Tensor] = {}
            results = []
            for step in level.steps:
                results.append(self._step(semiring, step, lev, store, chunks, concat, like, batch))
            for chart, asm in level.charts.items():
                if asm.index is None:
                    store[(chart, lev)] = results[asm.steps[0]]
                    continue
                parts = torch.cat([results[i] for i in asm.steps], dim=-1)
                M, J = asm.index.shape
                vals = parts.index_select(-1, asm.index.reshape(-1).to(parts.device)).reshape(*parts.shape[:-1], M, J)
                if asm.mask is not None:
                    vals = torch.where(asm.mask.to(vals.device), vals, semiring.zero(vals.shape[lead:], vals))
                store[(chart, lev)] = semiring.sum(vals, -1) if J > 1 else vals.squeeze(-1)
        goal = store.get((GOAL, sch.goal_level))
        if goal is None:
            raise ValueError("these shapes admit no structure (the goal is never defined)")
        if lengths is None:
            return goal[..., -1]
        where = torch.from_numpy(np.searchsorted(sch.lengths, lengths.cpu().numpy())).to(goal.device)
        index = where.reshape(*([1] * lead), -1, 1).expand(*goal.shape[:-1], 1)
        return goal.gather(-1, index).squeeze(-1)

    def _step(self, semiring, step, lev, store, chunks, concat, like, batch) -> Tensor:
        lead = semiring.extra
        vals = []
        for rd in step.reads:
            if rd.kind == "one":
                continue
            if rd.kind == "input":
                src = chunks[(rd.source, lev)]
            elif len(rd.levels) == 1:
                src = store[(rd.source, rd.levels[0])]
            else:
                key = (rd.source, rd.levels)
                if key not in concat:
                    concat[key] = torch.cat([store[(rd.source, sl)] for sl in rd.levels], dim=-1)
                src = concat[key]
            vals.append(_read(src, rd, step.L, step.K))
        L, K = step.L, step.K
        if not vals:
            p = semiring.one((batch, L, K), like)
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
            p = torch.where(step.mask.to(p.device), p, semiring.zero(p.shape[lead:], p))
        if K == 1:
            return p.squeeze(-1)
        return semiring.sum(p, -1)


def _read(src: Tensor, rd: Read, L: int, K: int) -> Tensor:
    """Read a term as ``[*, L, K]`` (or broadcastable to it) from a source ``[*, M]``."""
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
