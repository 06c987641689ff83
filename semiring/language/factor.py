"""Shared sub-sums: pull the terms a rule does not sum over out of its ⊕, and share what is left.

``I[s,t,R] += C[s,u,R] * C[u+1,t,L] * arc[s,t] for u in s..t-1`` sums over ``u``; ``arc[s,t]``
does not mention ``u``, so by distributivity the rule is ``I[s,t,R] += S[s,t] * arc[s,t]`` with
``S[s,t] += C[s,u,R] * C[u+1,t,L] for u in s..t-1``. Rules whose sub-sums are the same up to the
names of their variables share one sub-sum chart, computed once.
"""

from __future__ import annotations

import heapq
import re
from collections import Counter

from .syntax import Affine, Cond, Range, Rule, Term

SUBSUM_PREFIX = "_sum"
ELIMINATED_PREFIX = "_part"


def _canonical(head_vars: list[str], summed: list[str], rule: Rule) -> str:
    names = {v: f"v{i}" for i, v in enumerate(head_vars)}
    names.update({u: f"u{i}" for i, u in enumerate(summed)})
    body = " * ".join(str(t.renamed(names)) for t in rule.terms)
    extra = " ".join(str(r.renamed(names)) for r in rule.ranges)
    conds = " and ".join(str(c.renamed(names)) for c in rule.conds)
    return f"{body} | {extra} | {conds}"


def eliminate(rules: list[Rule]) -> list[Rule]:
    """Sum a rule's variables one at a time, each over only the terms that mention it.

    A rule that sums several variables (the PCFG's ``X[s,t,a] += X[s,u,b] * X[u+1,t,c] *
    rule[a,b,c] for u in s..t-1`` sums u, b and c) is rewritten as a chain of rules through
    intermediate charts, choosing at each step the variable whose sum touches the fewest
    variables (as an einsum path: the intermediate's size decides the work), ranged (``for``)
    variables first among equals, then the one that occurs first in the rule's text as it stands:
    ``P[s,t,b,c] += X[s,u,b] * X[u+1,t,c] for u in s..t-1`` and ``X[s,t,a] += P[s,t,b,c] *
    rule[a,b,c]``, O(N^3 NT^2 + N^2 NT^3) instead of O(N^3 NT^3).
    """
    out: list[Rule] = []
    count = 0
    for rule in rules:
        if len(rule.variables - rule.head.variables) < 2:
            out.append(rule)
            continue
        state = _Elimination(rule)
        v = state.best()
        if v is None:
            out.append(rule)
            continue
        while v is not None:
            out.append(state.take(v, f"{ELIMINATED_PREFIX}{count}"))
            count += 1
            v = state.best()
        out.append(state.rest())
    return out


_RUN = re.compile(r"[A-Za-z_0-9]+")
_HEAD, _TERMS, _RANGES, _CONDS = range(4)  # the parts of a rule's text, in order


def _occurrences(text: str, names: set[str], longest: int) -> dict[str, int]:
    """Each of ``names`` found in ``text`` as ``str.find`` finds it (also inside a longer name:
    ``t`` in ``_part0``), with its offset there."""
    found: dict[str, int] = {}
    for m in _RUN.finditer(text):
        run = m.group()
        for i in range(len(run)):
            for j in range(i + 1, min(len(run), i + longest) + 1):
                if run[i:j] in names and run[i:j] not in found:
                    found[run[i:j]] = m.start() + i
    return found


class _Elimination:
    """A rule whose variables are being summed one at a time (:func:`eliminate`), with what choosing
    the next one needs kept up to date at each sum, so that a rule of thousands of terms is
    eliminated in time about linear in its size: per variable, the terms and conditions that
    mention it, the variables its sum would keep, and where it first occurs in the rule's text."""

    def __init__(self, rule: Rule):
        self.rule = rule
        self.head_vars = [v for ix in rule.head.indices for v in sorted(ix.variables)]
        self.summed = set(rule.variables) - set(self.head_vars)
        self.longest = max(map(len, self.summed))
        self.ranged = {r.var for r in rule.ranges}
        # the rule as it stands: its terms keyed by their order in its text (the reads of eliminated
        # sums come first, the newest first, with negative keys), its ranges and conditions by theirs
        self.terms: dict[int, Term] = {}
        self.ranges = dict(enumerate(rule.ranges))
        self.conds = dict(enumerate(rule.conds))
        self.constant = [j for j, c in self.conds.items() if not c.variables]  # conditions on no variable
        self.reads = 0  # sums taken
        self.in_terms: dict[str, set[int]] = {v: set() for v in rule.variables}
        self.in_conds: dict[str, set[int]] = {v: set() for v in rule.variables}
        self.ranges_of: dict[str, list[int]] = {v: [] for v in rule.variables}
        self.bounding: Counter[str] = Counter()  # ranges of other variables a variable bounds
        self.near: dict[str, Counter[str]] = {v: Counter() for v in rule.variables}  # what its sum keeps
        self.places: dict[str, list[tuple[int, int, int]]] = {v: [] for v in self.summed}  # (part, key, offset) heaps
        self.found: dict[tuple[int, int], list[str]] = {}  # per piece of text: the summed variables found in it
        self.version: Counter[str] = Counter()
        self.heap: list[tuple[tuple, int, str]] = []
        self._find(_HEAD, 0, str(rule.head))
        for i, t in enumerate(rule.terms):
            self._add_term(i, t)
        for j, r in self.ranges.items():
            self._add_range(j, r)
        for j, c in self.conds.items():
            self._link(c.variables, self.in_conds, j, 1)
        for v in self.summed:
            self._push(v)

    def _find(self, part: int, key: int, text: str) -> list[str]:
        """Note where the summed variables occur in one piece of the rule's text; those found."""
        found = _occurrences(text, self.summed, self.longest)
        for v, offset in found.items():
            heapq.heappush(self.places[v], (part, key, offset))
        self.found[part, key] = list(found)
        return self.found[part, key]

    def _link(self, vs: frozenset[str], index: dict[str, set[int]], key: int, sign: int) -> None:
        """Add (sign 1) or remove (-1) a term's or condition's variables: each keeps the others."""
        for v in vs:
            if sign > 0:
                index[v].add(key)
            else:
                index[v].discard(key)
            near = self.near[v]
            for u in vs:
                if u != v:
                    near[u] += sign
                    if not near[u]:
                        del near[u]

    def _add_term(self, key: int, term: Term) -> list[str]:
        """Put a term into the rule; the summed variables found in its text."""
        self.terms[key] = term
        self._link(term.variables, self.in_terms, key, 1)
        return self._find(_TERMS, key, str(term))

    def _add_range(self, j: int, r: Range) -> None:
        self.ranges_of[r.var].append(j)
        for u in self._bounds(r):
            self.near[r.var][u] += 1
            self.bounding[u] += 1
        self._find(_RANGES, j, str(r))

    @staticmethod
    def _bounds(r: Range) -> set[str]:
        return (r.lo.variables | r.hi.variables) - {r.var}

    def _alive(self, place: tuple[int, int, int]) -> bool:
        part, key, _ = place
        return part == _HEAD or key in (self.terms if part == _TERMS else self.ranges)

    def _first(self, v: str) -> tuple[int, int, int, str]:
        """Where ``v`` first occurs in the rule's text, ordered as ``str(rule).find(v)`` orders it;
        the name breaks a tie (``x1`` first found inside ``x12``: it was a set's iteration order)."""
        places = self.places[v]
        while places and not self._alive(places[0]):
            heapq.heappop(places)
        if places:
            return (*places[0], v)
        conds = " if " + " and ".join(str(self.conds[j]) for j in sorted(self.conds))  # only conditions name v
        return _CONDS, 0, conds.find(v), v

    def _cost(self, v: str) -> tuple | None:
        """What summing ``v`` next would cost, smallest first; None where it cannot go next."""
        n = len(self.in_terms[v])
        if not n or n == len(self.terms) or self.bounding[v]:
            return None  # (bounding: another variable's range is bounded by v, which cannot go first)
        return len(self.near[v]), v not in self.ranged, self._first(v)

    def _push(self, v: str) -> None:
        self.version[v] += 1
        cost = self._cost(v)
        if cost is not None:
            heapq.heappush(self.heap, (cost, self.version[v], v))

    def best(self) -> str | None:
        """The variable to sum next, or None where no sum saves work."""
        if len(self.summed) < 2:
            return None
        while self.heap:
            _, version, v = self.heap[0]
            if v in self.summed and version == self.version[v]:
                return v
            heapq.heappop(self.heap)
        return None

    def take(self, v: str, name: str) -> Rule:
        """Sum ``v`` into the chart ``name``: that chart's rule; this rule reads it instead."""
        rule, keep = self.rule, set(self.near[v])
        free = [u for u in dict.fromkeys(self.head_vars) if u in keep] + sorted(keep - set(self.head_vars), key=self._first)
        read = Term(name, tuple(Affine(((u, 1),)) for u in free), rule.line, rule.head.col)
        inner = sorted(self.in_terms[v])
        conds = tuple(self.conds[j] for j in sorted(self.in_conds[v])) + self._confined(v, keep)
        sub = Rule(read, tuple(self.terms[k] for k in inner), tuple(self.ranges[j] for j in self.ranges_of[v]), conds,
                   rule.line, rule.text)
        changed = keep | self._drop(v, inner)
        self.reads += 1
        changed.update(self._add_term(-self.reads, read))
        for u in changed & self.summed:
            self._push(u)
        return sub

    def _drop(self, v: str, inner: list[int]) -> set[str]:
        """Take ``v``, the terms ``inner`` that mention it and its ranges and conditions out of the
        rule; the summed variables found in the text taken out."""
        changed: set[str] = set()
        for k in inner:
            self._link(self.terms.pop(k).variables, self.in_terms, k, -1)
            changed.update(self.found.pop((_TERMS, k)))
        for j in self.ranges_of.pop(v):
            self.bounding.subtract(self._bounds(self.ranges.pop(j)))
            changed.update(self.found.pop((_RANGES, j)))
        for j in sorted(self.in_conds[v]):
            self._link(self.conds.pop(j).variables, self.in_conds, j, -1)
        self.summed.discard(v)
        return changed

    def _confined(self, v: str, keep: set[str]) -> tuple[Cond, ...]:
        """The rule's constraints on the sub-sum's free variables alone (``for w in u..v-1`` as ``w >= u
        and w <= v-1``): the sub-sum is read only where they hold, so its items elsewhere are never
        computed (``_part0[s, t, u, v, w] += X[s, k, u, w] * X[k+1, t, w+1, v]`` only for ``u <= w < v``)."""
        near = {j for u in keep for j in self.in_conds[u]}.union(self.constant)
        out = [self.conds[j] for j in sorted(near) if self.conds[j].variables <= keep]  # (v is not kept)
        for j in sorted(j for u in keep for j in self.ranges_of[u]):
            r = self.ranges[j]
            if (r.lo.variables | r.hi.variables) <= keep:
                var = Affine(((r.var, 1),))
                out += [Cond(var, ">=", r.lo), Cond(var, "<=", r.hi)]
        return tuple(out)

    def rest(self) -> Rule:
        """The rule as it stands: what is left after the sums taken."""
        rule = self.rule
        return Rule(rule.head, tuple(self.terms[k] for k in sorted(self.terms)), tuple(self.ranges[j] for j in sorted(self.ranges)),
                    tuple(self.conds[j] for j in sorted(self.conds)), rule.line, rule.text)


def factor(rules: list[Rule]) -> list[Rule]:
    """Rewrite rules so that every ⊕ runs only over the terms that depend on its summed variables.

    A sub-sum that several rules share becomes a chart of its own, computed once; one that a single
    rule uses stays in that rule, whose ``outer`` last terms are ⊗-multiplied after its ⊕.
    """
    splits = [_split(r) for r in rules]
    keys = Counter(s[0] for s in splits if s[0] is not None)
    out: list[Rule] = []
    subsums: dict[str, Rule] = {}
    for rule, (key, sub, free, outer, outer_conds) in zip(rules, splits):
        if key is None:
            out.append(rule)
        elif keys[key] == 1:
            out.append(Rule(rule.head, (*sub.terms, *outer), rule.ranges, rule.conds, rule.line, rule.text, len(outer)))
        else:
            if key not in subsums:
                name = f"{SUBSUM_PREFIX}{len(subsums)}"
                subsums[key] = Rule(Term(name, sub.head.indices, rule.line, rule.head.col), sub.terms, sub.ranges, sub.conds, rule.line, rule.text)
                out.append(subsums[key])
            read = Term(subsums[key].head.name, tuple(Affine(((v, 1),)) for v in free), rule.line, rule.head.col)
            out.append(Rule(rule.head, (read, *outer), (), outer_conds, rule.line, rule.text))
    return out


def _split(rule: Rule):
    """(key, sub-sum rule, its free variables, outer terms, outer conditions), or Nones when the
    rule sums over nothing or every term depends on what it sums."""
    none = (None, None, None, None, None)
    head_vars = [v for ix in rule.head.indices for v in sorted(ix.variables)]
    summed = sorted(rule.variables - set(head_vars), key=str(rule).find)
    inner = [t for t in rule.terms if t.variables & set(summed)]
    outer = [t for t in rule.terms if not t.variables & set(summed)]
    if not summed or not outer or not inner:
        return none
    inner_conds = tuple(c for c in rule.conds if c.variables & set(summed))
    outer_conds = tuple(c for c in rule.conds if not c.variables & set(summed))
    used = set().union(*(t.variables for t in inner))
    for r in rule.ranges:
        used |= r.lo.variables | r.hi.variables
    for c in inner_conds:
        used |= c.variables
    free = [v for v in dict.fromkeys(head_vars) if v in used]
    sub = Rule(Term("?", tuple(Affine(((v, 1),)) for v in free)), tuple(inner), rule.ranges, inner_conds, rule.line, rule.text)
    return _canonical(free, summed, sub), sub, free, outer, outer_conds
