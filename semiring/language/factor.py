"""Shared sub-sums: pull the terms a rule does not sum over out of its ⊕, and share what is left.

``I[s,t,R] += C[s,u,R] * C[u+1,t,L] * arc[s,t] for u in s..t-1`` sums over ``u``; ``arc[s,t]``
does not mention ``u``, so by distributivity the rule is ``I[s,t,R] += S[s,t] * arc[s,t]`` with
``S[s,t] += C[s,u,R] * C[u+1,t,L] for u in s..t-1``. Rules whose sub-sums are the same up to the
names of their variables share one sub-sum chart, computed once.
"""

from __future__ import annotations

from .syntax import Affine, Rule, Term

SUBSUM_PREFIX = "_sum"


def _canonical(head_vars: list[str], summed: list[str], rule: Rule) -> str:
    names = {v: f"v{i}" for i, v in enumerate(head_vars)}
    names.update({u: f"u{i}" for i, u in enumerate(summed)})
    body = " * ".join(str(t.renamed(names)) for t in rule.terms)
    extra = " ".join(str(r.renamed(names)) for r in rule.ranges)
    conds = " and ".join(str(c.renamed(names)) for c in rule.conds)
    return f"{body} | {extra} | {conds}"


def factor(rules: list[Rule]) -> list[Rule]:
    """Rewrite rules so that every ⊕ runs only over the terms that depend on its summed variables.

    A sub-sum that several rules share becomes a chart of its own, computed once; one that a single
    rule uses stays in that rule, whose ``outer`` last terms are ⊗-multiplied after its ⊕.
    """
    keys = [k for k in (_split(r)[0] for r in rules) if k is not None]
    out: list[Rule] = []
    subsums: dict[str, Rule] = {}
    for rule in rules:
        key, sub, free, outer, outer_conds = _split(rule)
        if key is None:
            out.append(rule)
        elif keys.count(key) == 1:
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
