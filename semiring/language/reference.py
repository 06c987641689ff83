"""A slow reference interpreter: the language's meaning, item by item, in plain Python.

It shares nothing with the compiler but the parser. Every rule is instantiated at every integer
assignment of its variables in a generous box, kept where its input indices (looked-up ones
included) are in range and its ``for`` ranges and ``if`` conditions hold. A rule with variables
that only charts bound (``C[s, s, d] = 1``, ``goal += alpha[n-1, c]``) ranges over the charts'
extents: its instances count where what they read (or, reading nothing, what they write) lies in
the hull of the items the other rules read and write, grown to a fixpoint. An item is defined when
some instance derives it from defined items; its value is the ⊕ over those instances of the ⊗ of
their terms, by memoized recursion (an item that depends on itself is an error), and a defined item
on the edge of the box is an error too (nothing bounds the program: its value would be the box's).
For tests at small sizes: it is exponential in the number of variables of a rule.
"""

from __future__ import annotations

import itertools
from typing import Mapping

import torch
from torch import Tensor

from ..semirings import Semiring
from .syntax import GOAL, Affine, Const, Lookup, Rule, Term, parse


def interpret(text: str, semiring: Semiring, lengths: Tensor | Mapping[str, Tensor] | None = None, **inputs: Tensor) -> Tensor:
    """What ``semiring.program(text)(semiring, lengths, **inputs)`` returns: ``[*components, B]``."""
    syntax = parse(text)
    names = list(syntax.inputs)
    semiring.prepare([inputs[name] for name in names])
    elements = {name: semiring.convert(inputs[name]) for name in names}
    data = {name: inputs[name] for name in syntax.lookups}
    shapes = {name: tuple(x.shape[1:]) for name, x in inputs.items()}
    batch = max(x.shape[0] for x in inputs.values())
    top = max([s for shape in shapes.values() for s in shape] + [1]) + 2
    if lengths is not None and not isinstance(lengths, Mapping):
        lengths = {syntax.lengths[0]: lengths}
    rules = [_with_lengths(r, syntax.lengths) for r in syntax.rules]
    out = []
    for b in range(batch):
        row = {name: x.select(semiring.extra, min(b, x.shape[semiring.extra] - 1)) for name, x in elements.items()}
        looked = {name: x[min(b, x.shape[0] - 1)] for name, x in data.items()}
        out.append(_Example(rules, syntax.constants, semiring, row, looked, shapes, top).goal(
            syntax.lengths, None if lengths is None else {k: int(v[b]) for k, v in lengths.items() if v is not None}))
    return torch.stack(out, -1)


def _with_lengths(rule: Rule, lengths: list[str]) -> Rule:
    if rule.head.name != GOAL:
        return rule
    head = Term(GOAL, tuple(Affine(((v, 1),)) for v in lengths), rule.line, rule.head.col)
    return Rule(head, rule.terms, rule.ranges, rule.conds, rule.line, rule.text)


def _range(var: str, rule: Rule, elements, shapes, top: int) -> range:
    """The values of ``var`` to try: the box ``-2..top``, cut to where it indexes an input term as
    ``var + c`` (the instances outside read nothing)."""
    lo, hi = -2, top
    for t in rule.terms:
        if t.name in elements:
            for ix, size in zip(t.indices, shapes[t.name]):
                if isinstance(ix, Affine) and ix.coeffs == ((var, 1),):
                    lo, hi = max(lo, -ix.const), min(hi, size - 1 - ix.const)
    return range(lo, hi + 1)


class _Example:
    def __init__(self, rules: list[Rule], constants, semiring: Semiring, elements, data, shapes, top: int):
        self.semiring, self.elements, self.constants = semiring, elements, constants
        self.like = next(iter(elements.values()))
        self.instances: dict[tuple, list[list]] = {}  # item -> per instance, its terms (("item", key) | ("input", value) | ("one",))
        loose = []  # instances of rules with variables that only charts bound (C[s, s, d] = 1, goal += alpha[n-1, c])
        for rule in rules:
            variables = sorted(rule.variables)
            bounded = set().union(*(t.variables for t in rule.terms if t.name in elements), *({r.var} for r in rule.ranges))
            for values in itertools.product(*(_range(v, rule, elements, shapes, top) for v in variables)):
                env = dict(zip(variables, values))
                terms = self._terms(rule, env, data, shapes)
                if terms is not None:
                    head = (rule.head.name, tuple(self._index(ix, env, data) for ix in rule.head.indices))
                    (loose if set(variables) - bounded else self.instances.setdefault(head, [])).append((head, terms))
        # Such rules range over the charts' extents: the hull of every item the others read or write,
        # grown by the loose instances whose reads lie inside it, to a fixpoint (the box bounds it).
        hull: dict[str, list[list[int]]] = {}

        def grow(item) -> None:
            name, at = item
            box = hull.setdefault(name, [[a, a] for a in at])
            for d, a in enumerate(at):
                box[d] = [min(box[d][0], a), max(box[d][1], a)]

        def inside(item) -> bool:
            box = hull.get(item[0])
            return item[0] == GOAL or (box is not None and all(lo <= a <= hi for a, (lo, hi) in zip(item[1], box)))

        for head, terms in [x for v in self.instances.values() for x in v]:
            grow(head)
            for t in terms:
                if t[0] == "item":
                    grow(t[1])
        while loose:
            reads = [[t[1] for t in terms if t[0] == "item"] for _, terms in loose]
            taken = [k for k, ((head, _), rd) in enumerate(zip(loose, reads)) if all(map(inside, rd)) and (rd or inside(head))]
            if not taken:
                break
            for k in taken:
                head, terms = loose[k]
                self.instances.setdefault(head, []).append((head, terms))
                for item in [head, *reads[k]]:
                    grow(item)
            loose = [x for k, x in enumerate(loose) if k not in set(taken)]
        self.instances = {item: [terms for _, terms in v] for item, v in self.instances.items()}
        self.values: dict[tuple, Tensor | None] = {}
        self.busy: set[tuple] = set()
        for item in self.instances:
            if any(a in (-2, top) for a in item[1]) and self.value(item) is not None:
                raise ValueError(f"the item {item} is defined on the edge of the interpreter's box: "
                                 "nothing in the program bounds its index")

    def _index(self, ix, env, data) -> int:
        if isinstance(ix, Const):
            return self.constants[ix.name]
        if isinstance(ix, Lookup):
            return int(data[ix.name][tuple(self._index(i, env, data) for i in ix.indices)])
        return ix.const + sum(a * env[v] for v, a in ix.coeffs)

    def _terms(self, rule: Rule, env, data, shapes) -> list | None:
        for r in rule.ranges:
            if not self._index(r.lo, env, data) <= env[r.var] <= self._index(r.hi, env, data):
                return None
        for c in rule.conds:
            left, right = self._index(c.left, env, data), self._index(c.right, env, data)
            if not {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right,
                    "==": left == right, "!=": left != right}[c.op]:
                return None
        for t in rule.terms:  # looked-up indices within their data first
            for ix in t.indices:
                if isinstance(ix, Lookup):
                    at = [self._index(i, env, data) for i in ix.indices]
                    if not all(0 <= a < s for a, s in zip(at, shapes[ix.name])):
                        return None
        terms = []
        for t in rule.terms:
            if t.is_one:
                terms.append(("one",))
                continue
            at = tuple(self._index(ix, env, data) for ix in t.indices)
            if t.name in self.elements:
                if not all(0 <= a < s for a, s in zip(at, shapes[t.name])):
                    return None
                terms.append(("input", self.elements[t.name][(..., *at)]))
            else:
                terms.append(("item", (t.name, at)))
        return terms

    def value(self, item: tuple) -> Tensor | None:
        """The item's value, or None where no instance derives it from defined items."""
        if item in self.values:
            return self.values[item]
        if item in self.busy:
            raise ValueError(f"the item {item} depends on itself")
        self.busy.add(item)
        sr, total = self.semiring, None
        for terms in self.instances.get(item, []):
            product = sr.one((), self.like)
            for term in terms:
                if term[0] == "one":
                    continue
                factor = term[1] if term[0] == "input" else self.value(term[1])
                if factor is None:
                    product = None
                    break
                product = sr.times(product, factor)
            if product is not None:
                total = product if total is None else sr.plus(total, product)
        self.busy.discard(item)
        self.values[item] = total
        return total

    def goal(self, lengths: list[str], given: dict[str, int] | None) -> Tensor:
        """The goal at the given lengths (each not given: the largest at which the goal is defined)."""
        keys = sorted(k for (name, k) in self.instances if name == GOAL and self.value((GOAL, k)) is not None)
        if given:
            keys = [k for k in keys if all(k[lengths.index(v)] == n for v, n in given.items())]
        if not keys:
            return self.semiring.zero((), self.like)
        return self.value((GOAL, max(keys)))
