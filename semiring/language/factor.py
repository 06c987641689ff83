"""Shared sub-sums: pull the terms a rule does not sum over out of its ⊕, and share what is left.

``I[s,t,R] += C[s,u,R] * C[u+1,t,L] * arc[s,t] for u in s..t-1`` sums over ``u``; ``arc[s,t]``
does not mention ``u``, so by distributivity the rule is ``I[s,t,R] += S[s,t] * arc[s,t]`` with
``S[s,t] += C[s,u,R] * C[u+1,t,L] for u in s..t-1``. Rules whose sub-sums are the same up to the
names of their variables share one sub-sum chart, computed once.
"""

from __future__ import annotations

from collections import Counter

from .syntax import Affine, Cond, Rule, Term

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
    variables first among equals: ``P[s,t,b,c] += X[s,u,b] * X[u+1,t,c] for u in s..t-1`` and
    ``X[s,t,a] += P[s,t,b,c] * rule[a,b,c]``, O(N^3 NT^2 + N^2 NT^3) instead of O(N^3 NT^3).
    """
    out: list[Rule] = []
    count = 0
    for rule in rules:
        while True:
            step = _elimination(rule)
            if step is None:
                out.append(rule)
                break
            inner, rest = step
            name = f"{ELIMINATED_PREFIX}{count}"
            count += 1
            out.append(Rule(Term(name, inner.head.indices, rule.line, rule.head.col), inner.terms, inner.ranges, inner.conds, rule.line, rule.text))
            read = Term(name, inner.head.indices, rule.line, rule.head.col)
            rule = Rule(rule.head, (read, *rest.terms), rest.ranges, rest.conds, rule.line, rule.text)
    return out


def _elimination(rule: Rule) -> tuple[Rule, Rule] | None:
    """(the sum over one variable, the rest of the rule) where that saves work, else None. (Linear
    in the rule's size: a rule of thousands of terms is eliminated one variable at a time.)"""
    head_vars = [v for ix in rule.head.indices for v in sorted(ix.variables)]
    text = str(rule)  # variables are ordered by where they first appear
    summed = sorted(rule.variables - set(head_vars), key=text.find)
    if len(summed) < 2:
        return None
    ranged = {r.var for r in rule.ranges}
    bounds_another = {u for r in rule.ranges for u in r.lo.variables | r.hi.variables if u != r.var}
    term_vars = [t.variables for t in rule.terms]
    mentions: dict[str, list[int]] = {}
    for i, vs in enumerate(term_vars):
        for u in vs:
            mentions.setdefault(u, []).append(i)
    best = None
    for order, v in enumerate(summed):
        inner = mentions.get(v, [])
        if len(inner) == len(rule.terms) or not inner or v in bounds_another:
            continue  # (bounds_another: another variable's range is bounded by v, which cannot go first)
        ranges = [r for r in rule.ranges if r.var == v]
        conds = [c for c in rule.conds if v in c.variables]
        used = set().union(*(term_vars[i] for i in inner))
        for r in ranges:
            used |= r.lo.variables | r.hi.variables
        for c in conds:
            used |= c.variables
        keep = used - {v}
        cost = (len(keep), v not in ranged, order)
        if best is None or cost < best[0]:
            best = (cost, v, inner, ranges, conds, keep)
    if best is None:
        return None
    _, v, inner, ranges, conds, keep = best
    free = [u for u in dict.fromkeys(head_vars) if u in keep] + sorted(keep - set(head_vars), key=text.find)
    index = tuple(Affine(((u, 1),)) for u in free)
    sub = Rule(Term("?", index), tuple(rule.terms[i] for i in inner), tuple(ranges), tuple(conds) + _confined(rule, v, keep),
               rule.line, rule.text)
    rest = Rule(rule.head, tuple(t for t, vs in zip(rule.terms, term_vars) if v not in vs),
                tuple(r for r in rule.ranges if r.var != v), tuple(c for c in rule.conds if v not in c.variables), rule.line, rule.text)
    return sub, rest


def _confined(rule: Rule, v: str, keep: set[str]) -> tuple[Cond, ...]:
    """The rule's constraints on the sub-sum's free variables alone (``for w in u..v-1`` as ``w >= u
    and w <= v-1``): the sub-sum is read only where they hold, so its items elsewhere are never
    computed (``_part0[s, t, u, v, w] += X[s, k, u, w] * X[k+1, t, w+1, v]`` only for ``u <= w < v``)."""
    out = [c for c in rule.conds if v not in c.variables and c.variables <= keep]
    for r in rule.ranges:
        if r.var != v and r.var in keep and (r.lo.variables | r.hi.variables) <= keep:
            var = Affine(((r.var, 1),))
            out += [Cond(var, ">=", r.lo), Cond(var, "<=", r.hi)]
    return tuple(out)


def factor(rules: list[Rule]) -> list[Rule]:
    """Rewrite rules so that every ⊕ runs only over the terms that depend on its summed variables.

    A sub-sum that several rules share becomes a chart of its own, computed once; one that a single
    rule uses stays in that rule, whose ``outer`` last terms are ⊗-multiplied after its ⊕.
    """
    keys = Counter(k for k in (_split(r)[0] for r in rules) if k is not None)
    out: list[Rule] = []
    subsums: dict[str, Rule] = {}
    for rule in rules:
        key, sub, free, outer, outer_conds = _split(rule)
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
    summed = sorted(rule.variables - set(head_vars), key=lambda v: str(rule).find(v))
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
