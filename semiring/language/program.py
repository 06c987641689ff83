"""A checked program: its levels found once, its plan built per set of input sizes, run in any semiring."""

from __future__ import annotations

import gc
import math
from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from ..eager import eager
from ..semirings import Log, LogSemiring, MaxSemiring, Semiring
from . import closure, limits
from .autodiff import Tape, gradient
from .execute import Run, native
from .factor import eliminate, factor
from .fuse import fuse
from .levels import find_levels
from .plan import EACH, Plan, build, layouts, summed_variables
from .syntax import GOAL, Affine, ProgramError, Rule, Term, check_base_cases, parse


PLANS = 64  # plans kept per program (one per set of input sizes; batches padded to their longest sentence of UD
# English-EWT have 40-50 distinct lengths: 32 missed 27-30% of them every epoch, 64 only the first epoch's)


@contextmanager
def _no_collection() -> Iterator[None]:
    """Compiling makes many small objects that live on: Python's cyclic collector would walk them
    again and again (a quarter of the time of a 3,200-rule program); it runs afterwards instead."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Program:
    """Weighted deduction rules over named charts; call it to run it.

    ``program(semiring=Log, lengths=None, **inputs)`` takes every input as a batch-first tensor of
    log-potentials ``[B, *shape]`` (``shape`` with as many entries as the input has indices in the
    rules; a batch of 1 is shared by every example) and returns the goal, one value per example: ``[*components, B]``. ``lengths[b]`` is the
    ``n`` the goal of example b is read at; the default is the largest ``n`` the shapes allow.
    """

    def __init__(self, text: str):
        with _no_collection():
            self._compile(text)

    def _compile(self, text: str) -> None:
        self.text = text
        self.syntax = parse(text)
        self.inputs: list[str] = list(self.syntax.inputs)  # the potentials
        self.lookups: list[str] = list(self.syntax.lookups)  # integer inputs indices are read from
        rules, self.syntax, self.closures = closure.find([self._with_length(r) for r in self.syntax.rules], self.syntax)
        self.rules: list[Rule] = factor(eliminate(rules))
        levels = find_levels(self.rules, self.syntax)
        if levels is None:
            raise self._cycle()
        check_base_cases(self.syntax.rules)
        self.levels = levels
        charts = {r.head.name: len(r.head.indices) for r in self.rules}
        self._layouts = layouts(self.rules, charts, {i: summed_variables(r) for i, r in enumerate(self.rules)}, levels.coeffs)
        self._plans: OrderedDict[tuple, Plan] = OrderedDict()
        self._checked: OrderedDict[tuple, None] = OrderedDict()  # the last PLANS sets of sizes that passed the checks of sizes alone

    def _cycle(self) -> ProgramError:
        """The error for a program without levels, blamed on the rule that closes the cycle: the
        first whose addition (in program order) leaves the rules before it without levels."""
        for k in range(1, len(self.rules) + 1):
            if find_levels(self.rules[:k], self.syntax) is None:
                rule = self.rules[k - 1]
                read = closure.same_level_read(rule, self.syntax)
                if read is not None:
                    return closure.unsolved(rule, *read, self.syntax)
                unranged = [v for v in summed_variables(rule) if v not in {r.var for r in rule.ranges}]
                charts = {r.head.name for r in self.rules}
                loose = [v for v in unranged if any(v in t.variables for t in rule.terms if t.name in charts)]
                if loose:
                    return rule.error(f"no order of levels computes this rule's items after those they read: the summed "
                                      f"variable '{loose[0]}' has no 'for' range (a range such as 'for {loose[0]} in s..t-1' "
                                      "is needed where the chart's own extent is all that bounds it)")
                return rule.error("an item depends on itself (a cycle among the rules): no order of "
                                  "levels computes this rule's items after those they read")
        raise AssertionError("levels exist for every prefix but not for the whole program")

    def _with_length(self, rule: Rule) -> Rule:
        if rule.head.name != GOAL or not self.syntax.lengths:
            return rule
        head = Term(GOAL, tuple(Affine(((v, 1),)) for v in self.syntax.lengths), rule.line, rule.head.col)
        return Rule(head, rule.terms, rule.ranges, rule.conds, rule.line, rule.text)

    # ------------------------------------------------------------ checking

    def shapes(self, inputs: Mapping[str, Tensor]) -> tuple[int, dict[str, tuple[int, ...]]]:
        """Check the inputs against the rules; return the batch size and per-example shapes."""
        unknown = set(inputs) - set(self.inputs) - set(self.lookups)
        if unknown:
            raise ValueError(f"unknown input(s) {sorted(unknown)}; the program's inputs are {self.inputs + self.lookups}")
        batch = None
        shapes = {}
        for name in self.inputs + self.lookups:
            rank, first = self.syntax.inputs[name] if name in self.syntax.inputs else self.syntax.lookups[name]
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
            if name in self.syntax.lookups:
                if x.dtype.is_floating_point or x.dtype == torch.bool or x.is_complex():
                    raise ProgramError(f"input {name!r} holds indices, so it must be an integer tensor, got {x.dtype}",
                                       first.line, first.col, self._line(first.line))
            elif not x.dtype.is_floating_point:
                raise ProgramError(f"input {name!r} holds log-potentials, so it must be floating point, got {x.dtype}",
                                   first.line, first.col, self._line(first.line))
            shapes[name] = tuple(x.shape[1:])
        key = tuple(sorted(shapes.items()))
        if key in self._checked:
            self._checked.move_to_end(key)
        else:
            self._check_shared_indices(shapes)
            self._check_transposed(shapes)
            self._checked[key] = None
            if len(self._checked) > PLANS:
                self._checked.popitem(last=False)
        return (batch or 0), shapes

    def _check_transposed(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """An input whose two dimensions index the same dimension of a chart, in two rules or two
        terms (Eisner's ``arc[s, t]`` and ``arc[t, s]``), must have as many entries in both: a
        non-square ``arc`` would silently drop the structures its smaller side cannot reach."""
        seen: dict[tuple[str, int, str], tuple[int, int]] = {}  # (chart, dim, input) -> (input dim, size)
        for rule in self.syntax.rules:
            head = {ix.coeffs[0][0]: d for d, ix in enumerate(rule.head.indices) if _plain(ix)}
            for t in rule.terms:
                if t.name not in shapes:
                    continue
                plain = [ix.coeffs[0][0] if _plain(ix) else None for ix in t.indices]
                for k, v in enumerate(plain):
                    if v not in head or plain.count(v) > 1:  # a diagonal (``seg[j, j]``) is no transpose
                        continue
                    key = (rule.head.name, head[v], t.name)
                    k0, size = seen.setdefault(key, (k, shapes[t.name][k]))
                    if k0 != k and size != shapes[t.name][k]:
                        raise rule.error(f"input {t.name!r} is read at index {head[v] + 1} of chart {rule.head.name!r} "
                                         f"through its dimension {k0 + 1} and, here, its dimension {k + 1}, so both need "
                                         f"as many entries (a square input): got {size} and {shapes[t.name][k]}", t.col)

    def _check_shared_indices(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Two inputs indexed by the same variable in one rule must agree on its size (their
        overlap is not silently used)."""
        for rule in self.syntax.rules:
            seen: dict[str, tuple[str, int, int]] = {}
            for t in rule.terms:
                if t.name not in shapes:
                    continue
                for d, ix in enumerate(t.indices):
                    if isinstance(ix, Affine) and len(ix.coeffs) == 1 and ix.coeffs[0][1] == 1 and ix.const == 0:
                        v = ix.coeffs[0][0]
                        if v in seen and seen[v][0] != t.name and seen[v][2] != shapes[t.name][d]:
                            other, od, size = seen[v]
                            raise rule.error(f"inputs {other!r} and {t.name!r} share the index '{v}' but have {size} and "
                                             f"{shapes[t.name][d]} entries there (dimensions {od + 1} and {d + 1})", t.col)
                        seen.setdefault(v, (t.name, d, shapes[t.name][d]))

    def _line(self, number: int) -> str:
        return self.text.splitlines()[number - 1] if number else ""

    @eager  # host-side arithmetic on sizes: never traced into a compiled graph
    def plan(self, shapes: dict[str, tuple[int, ...]], longest: bool = False, each: bool = False) -> Plan:
        """The plan at these input sizes; the last ``PLANS`` are kept. ``longest``: for a run whose
        examples all have the largest lengths, its goal computed there only; ``each``: for a run
        given lengths, its goal at each example's only, where the goal's rules allow it
        (:func:`.plan.build`)."""
        key = (tuple(sorted(shapes.items())), longest and bool(self.syntax.lengths), each and not longest and bool(self.syntax.lengths))
        every = (*key[:2], False)
        if key[2] and every in self._plans and self._plans[every].allowed.size * len(self._plans[every].goal) < EACH:
            key = every  # (the same plan: a goal this small is computed whole)
        if key in self._plans:
            self._plans.move_to_end(key)
            return self._plans[key]
        with _no_collection():
            plan = build(self.rules, self.syntax, self.levels, closure.shapes(self.closures, shapes), self._layouts, key[1], key[2])
            fuse(plan)
        if key[2] and plan.per_example is None:
            key = every
        self._plans[key] = plan
        if len(self._plans) > PLANS:
            self._plans.popitem(last=False)
        return plan

    def _described(self, shapes: dict[str, tuple[int, ...]], longest: bool) -> Plan:
        """A plan for these shapes, to read the lengths it allows: one already made of either kind,
        else the one a run would make (``longest``: a run without lengths), so that checking and
        running make one plan, not two."""
        sizes = tuple(sorted(shapes.items()))
        made = next((p for kind in ((False, False), (True, False), (False, True)) if (p := self._plans.get((sizes, *kind)))), None)
        return made if made is not None else self.plan(shapes, longest, each=not longest)

    def lengths_allowed(self, shapes: dict[str, tuple[int, ...]], longest: bool = False) -> np.ndarray:
        """The values of ``n`` the goal is defined at for these shapes (``longest``: a hint, for
        a check before a run without lengths)."""
        return self._described(shapes, longest).lengths

    def length_ranges(self, shapes: dict[str, tuple[int, ...]], longest: bool = False) -> dict[str, tuple[int, int]]:
        """Per length variable (``n``, ``m``), the least and largest value these shapes allow."""
        box = self._described(shapes, longest).allowed
        return {v: (lo, hi) for v, lo, hi in zip(self.syntax.lengths, box.lo, box.hi)}

    def check_lengths(self, lengths, batch: int, shapes, values: bool = True):
        """Validate ``lengths``: None (every example at its largest lengths), a tensor ``[B]`` (the
        length ``n``; a program with lengths ``n`` and ``m`` needs a dict) or a dict from length
        names to tensors ``[B]`` (a length not given is its largest). Returns it as given, a list as
        a tensor and a small integer dtype (int8, int16, uint8) as int64.
        ``values``: also check that they are in range (reads them: a device synchronisation)."""
        allowed = self.lengths_allowed(shapes, _without(lengths))
        if lengths is None:
            if allowed.size == 0:
                raise ValueError("these shapes admit no structure (the goal is never defined)")
            return None
        names = self.syntax.lengths
        if not names:
            raise ValueError("lengths: this program does not use the length 'n'")
        if isinstance(lengths, Mapping):
            given = dict(lengths)
            unknown = sorted(set(given) - set(names))
            if unknown:
                raise ValueError(f"lengths: {unknown} are not lengths of this program; its lengths are {names}")
        elif len(names) > 1:
            raise ValueError(f"lengths: this program's examples have the lengths {names}: give a dict from each name to a tensor [B]")
        else:
            given = {names[0]: lengths}
        ranges = self.length_ranges(shapes)
        for name, value in given.items():
            what = "lengths" if len(names) == 1 else f"lengths[{name!r}]"
            if value is None:
                continue
            if not isinstance(value, Tensor):
                value = given[name] = torch.as_tensor(value)
            if value.dim() != 1 or value.shape[0] != batch or value.dtype.is_floating_point or value.dtype == torch.bool:
                raise ValueError(f"{what}: expected an integer tensor of shape [B] = [{batch}], got {value.dtype} {tuple(value.shape)}")
            lo, hi = ranges[name]
            if values and value.numel():
                low, top = torch.stack(torch.aminmax(value)).tolist()  # one pass, one read
                if low < lo or top > hi:
                    raise ValueError(f"{what}: {value[(value < lo) | (value > hi)].tolist()} out of range; "
                                     f"these shapes allow {lo}..{hi}")
            if value.dtype not in (torch.int32, torch.int64):  # int8, int16, uint8: indices must be wider
                given[name] = value.long()
        return given if isinstance(lengths, Mapping) else given[names[0]]

    # ------------------------------------------------------------ running

    def __call__(self, semiring: Semiring = Log, lengths: Tensor | None = None, **inputs: Tensor) -> Tensor:
        batch, shapes = self.shapes(inputs)
        lengths = self.check_lengths(lengths, batch, shapes)
        raw = [inputs[name] for name in self.inputs]
        for name, x in zip(self.inputs, raw):
            if x.is_floating_point() and bool(torch.isnan(x.detach()).any()):
                raise ValueError(f"{name}: contains NaN (potentials are log-scores; -inf forbids a part)")
        semiring.prepare(raw)
        if batch == 0 and raw:
            return no_examples(semiring, raw)
        elements = {name: semiring.convert(x) for name, x in zip(self.inputs, raw)}
        elements.update({name: inputs[name] for name in self.lookups})
        for name, top in self._described(shapes, _without(lengths)).looked_up.items():
            x = elements[name]
            if x.numel() and bool(((x < 0) | (x > top)).any()):
                raise ValueError(f"{name}: holds indices, which must lie in 0..{top} (the size of what it indexes), "
                                 f"got {int(x.min())}..{int(x.max())}")
        return self.run(semiring, elements, lengths, batch, shapes)

    def run(self, semiring: Semiring, elements: Mapping[str, Tensor], lengths: Tensor | None, batch: int, shapes) -> Tensor:
        """Run on already converted elements ``[*components, B, *shape]`` (differentiate through
        these) and looked-up indices already checked: nothing here reads a value on the host, but the
        checks of a program's closures (:mod:`.closure`: a divergent sum, a positive cycle)."""
        if self.closures:
            elements = {**elements, **closure.derive(self.closures, semiring, dict(elements))}
        return Tape.apply(self._prepare(semiring, elements, lengths, batch, shapes), *elements.values())

    def gradient(self, semiring: Semiring, elements: Mapping[str, Tensor], lengths: Tensor | None, batch: int, shapes,
                 of: Sequence[str]) -> tuple[Tensor, list[Tensor]]:
        """(goal ``[*components, B]``, [∂ Σ goal / ∂ ``elements[name]`` for name in ``of``]) as
        :meth:`run` and a first-order backward would give them, with no autograd graph: the tape's two
        passes called directly (:func:`.autodiff.gradient`), for queries that are gradients and keep
        none (marginals, argmax, samples, expected counts). An example of goal -inf adds what
        autograd's backward of the sum would (the structures mask its rows: per-example inputs).
        Programs without closures (whose derived inputs autograd differentiates)."""
        if self.closures:
            raise ValueError("gradient: a program with closures is differentiated through run()")
        names = list(elements)
        return gradient(self._prepare(semiring, elements, lengths, batch, shapes), list(elements.values()),
                        [names.index(name) for name in of])

    def _prepare(self, semiring: Semiring, elements: Mapping[str, Tensor], lengths, batch: int, shapes) -> Run:
        """The run of the plan for ``shapes`` on ``elements`` (memory limits checked)."""
        if lengths is not None and not isinstance(lengths, Mapping):
            lengths = {self.syntax.lengths[0]: lengths}
        without = _without(lengths)
        on_cpu = all(x.device.type == "cpu" for x in [*elements.values(), *(v for v in (lengths or {}).values() if v is not None)])
        plan = self.plan(shapes, without, each=not without and on_cpu and type(semiring) in (LogSemiring, MaxSemiring))
        like = next((x for x in elements.values() if x.is_floating_point()), None)
        if like is not None:
            limits.check(plan, batch, like.element_size() * math.prod(like.shape[:semiring.extra]))
        return Run(plan, semiring, list(elements), lengths, batch, native=native(semiring, list(elements.values())))


def _without(lengths) -> bool:
    """Whether a run's every example has the largest lengths (none given)."""
    return lengths is None or (isinstance(lengths, Mapping) and all(v is None for v in lengths.values()))


def no_examples(semiring: Semiring, inputs: list[Tensor]) -> Tensor:
    """The value of a batch of no examples, ``[*components, 0]``: nothing to run, but a function of
    the (empty) inputs, so that differentiating it gives their (empty) gradients."""
    tie = sum(x.sum() for x in inputs if x.dtype.is_floating_point)
    return semiring.zero((0,), inputs[0]) + 0 * tie


def _plain(ix) -> bool:
    """Whether an index is a bare variable (``s``, not ``s+1`` or ``R``)."""
    return isinstance(ix, Affine) and len(ix.coeffs) == 1 and ix.coeffs[0][1] == 1 and ix.const == 0


def program(text: str) -> Program:
    """Parse and check ``text``; the result runs in any semiring (see :class:`Program`)."""
    return Program(text)
