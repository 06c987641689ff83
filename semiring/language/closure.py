"""Cycles inside a level, solved as closures.

A rule that reads its own chart at the same item group, in another label,
``X[s, t, a] += X[s, t, b] * unary[a, b]`` (unary chains, epsilon moves), makes the items of one
group depend on each other. Per group, with ``x0`` the ⊕ of X's other rules and ``M[a, b]`` the
weight of deriving label ``a`` from label ``b``, the items are ``x = x0 ⊕ M ⊗ x``, whose least
solution sums the derivations of any length: ``x = x0 ⊕ M⁺ ⊗ x0`` with ``M⁺ = M ⊕ M² ⊕ ...``.
So the program is rewritten without the cycle: X's other rules write an *open* chart ``X'``, and

    X[s, t, a] += X'[s, t, a]
    X[s, t, a] += X'[s, t, b] * unary+[a, b]

where ``unary+`` is ``M⁺``, computed from the input per run (:func:`derive`) and differentiable,
so marginals, gradients and decodes follow from the same definition as everywhere else. Per
semiring: Log and Real solve ``(I - M) M⁺ = M`` (a linear system per group, in float64); Max finds
best paths by repeated squaring (no positive cycle); Count sums paths (no cycle of finite
weights); the others have no closure and refuse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from ..semirings import CountSemiring, Log, LogSemiring, MaxSemiring, RealSemiring, Semiring
from .syntax import Affine, ProgramError, Rule, Syntax, Term

OPEN = "'"  # X' is X before its closure (a name no program can write)
PLUS = "+"  # w+ is the strict closure of the input w
RADIUS = 1 - 1e-12  # in Log and Real, a spectral radius at or above this diverges


@dataclass(frozen=True)
class Closure:
    """One cycle rule: ``chart[..a..] += chart[..b..] * weights[..a..b..]``."""

    rule: Rule
    read: Term  # the rule's read of its own chart
    chart: str
    weights: str  # the input of the weights M
    name: str  # the derived input M⁺
    rows: int  # the dimension of ``weights`` the head's label (a) indexes
    cols: int  # the dimension of ``weights`` the read's label (b) indexes

    def error(self, message: str) -> ProgramError:
        return self.rule.error(f"{self.rule.head} reads {self.read} at the same level: a cycle; see Cycles. {message}",
                               self.read.col)


def _lone(ix) -> str | None:
    """The variable of an index that is one variable alone (``b``, not ``b+1``), else None."""
    if isinstance(ix, Affine) and ix.const == 0 and len(ix.coeffs) == 1 and ix.coeffs[0][1] == 1:
        return ix.coeffs[0][0]
    return None


def same_level_read(rule: Rule) -> Term | None:
    """The rule's one read of its own chart, where it is at the head's item group in another label
    (the indices equal but for lone variables, summed where they differ), or None."""
    head = rule.head
    own = [t for t in rule.terms if t.name == head.name]
    if len(own) != 1:
        return None
    differ = [(h, r) for h, r in zip(head.indices, own[0].indices) if h != r]
    if differ and all(_lone(h) and _lone(r) and _lone(r) not in head.variables for h, r in differ):
        return own[0]
    return None


def _closure(rule: Rule, syntax: Syntax, read: Term) -> tuple[str, int, int] | None:
    """(weights, rows, cols) where the rule is a closure the compiler solves, else None."""
    differ = [d for d, (h, r) in enumerate(zip(rule.head.indices, read.indices)) if h != r]
    if len(rule.terms) != 2 or rule.ranges or rule.conds or len(differ) != 1:
        return None
    a, b = _lone(rule.head.indices[differ[0]]), _lone(read.indices[differ[0]])
    w = next(t for t in rule.terms if t is not read)
    if w.name not in syntax.inputs or sum(a in ix.variables for ix in rule.head.indices) != 1:
        return None
    rows = [d for d, ix in enumerate(w.indices) if a in ix.variables]
    cols = [d for d, ix in enumerate(w.indices) if b in ix.variables]
    if len(rows) != 1 or len(cols) != 1 or _lone(w.indices[rows[0]]) != a or _lone(w.indices[cols[0]]) != b:
        return None
    return w.name, rows[0], cols[0]


def unsolved(rule: Rule, read: Term) -> ProgramError:
    """The error for a cycle inside a level that is not a closure the compiler solves."""
    (h, r), = [(h, r) for h, r in zip(rule.head.indices, read.indices) if h != r][:1]
    return rule.error(f"{rule.head} reads {read} at the same level: a cycle; see Cycles. A cycle is solved as a closure "
                      f"where its rule is '{rule.head} += {read} * w[..]' alone: one read of its own chart, times one input "
                      f"indexed by '{h}' and '{r}', without 'for' or 'if'; if '{r}' should stop short of '{h}', give it a "
                      f"range such as 'for {r} in ...'", read.col)


def find(rules: list[Rule], syntax: Syntax) -> tuple[list[Rule], Syntax, list[Closure]]:
    """The rules with every closure rewritten (see the module), the syntax with the open charts
    and derived inputs added, and the closures."""
    closures: list[Closure] = []
    for rule in rules:
        read = same_level_read(rule)
        found = read and _closure(rule, syntax, read)
        if not found:
            continue
        if any(c.chart == rule.head.name for c in closures):
            raise rule.error(f"a second cycle rule for chart '{rule.head.name}': write its cycles as one rule, "
                             "their weights ⊕-combined in one input (see Cycles)", rule.head.col)
        weights, rows, cols = found
        same = [c.name for c in closures if (c.weights, c.rows, c.cols) == (weights, rows, cols)]
        name = same[0] if same else weights + PLUS + (str(len(closures)) if any(c.weights == weights for c in closures) else "")
        closures.append(Closure(rule, read, rule.head.name, weights, name, rows, cols))
    if not closures:
        return rules, syntax, []
    by_chart = {c.chart: c for c in closures}
    out: list[Rule] = []
    for rule in rules:
        c = by_chart.get(rule.head.name)
        if c is None:
            out.append(rule)
            continue
        head = Term(c.chart + OPEN, rule.head.indices, rule.line, rule.head.col)
        if rule is not c.rule:
            out.append(Rule(head, rule.terms, rule.ranges, rule.conds, rule.line, rule.text, rule.outer))
            continue
        opened = Term(c.chart + OPEN, c.read.indices, rule.line, c.read.col)
        terms = tuple(opened if t is c.read else Term(c.name, t.indices, t.line, t.col) for t in rule.terms)
        out.append(Rule(rule.head, (Term(head.name, rule.head.indices, rule.line, rule.head.col),), (), (), rule.line, rule.text))
        out.append(Rule(rule.head, terms, (), (), rule.line, rule.text))
    inputs = dict(syntax.inputs)
    for c in closures:
        inputs.setdefault(c.name, syntax.inputs[c.weights])
    charts = {**syntax.charts, **{c.chart + OPEN: syntax.charts[c.chart] for c in closures}}
    return out, replace(syntax, inputs=inputs, charts=charts), closures


def shapes(closures: list[Closure], shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The input shapes with the derived inputs' (a derived input has its weights' shape)."""
    out = dict(shapes)
    for c in closures:
        shape = shapes[c.weights]
        if shape[c.rows] != shape[c.cols]:
            raise c.error(f"Its weights '{c.weights}' need as many entries in dimension {c.rows + 1} as in dimension "
                          f"{c.cols + 1} (one per label), got {shape[c.rows]} and {shape[c.cols]}")
        out[c.name] = shape
    return out


def derive(closures: list[Closure], semiring: Semiring, elements: dict[str, Tensor]) -> dict[str, Tensor]:
    """The elements of the derived inputs ``M⁺``, from the weights' elements ``[*components, B, *shape]``."""
    out: dict[str, Tensor] = {}
    lead = semiring.extra + 1
    for c in closures:
        if c.name in out:
            continue
        m = elements[c.weights].movedim((lead + c.rows, lead + c.cols), (-2, -1))
        out[c.name] = strict(semiring, m, c).movedim((-2, -1), (lead + c.rows, lead + c.cols))
    return out


def strict(semiring: Semiring, m: Tensor, closure: Closure) -> Tensor:
    """``M⁺ = M ⊕ M² ⊕ ...`` of ``m [*, L, L]`` (``m[.., a, b]``: deriving label a from label b)."""
    kind = type(semiring)
    if m.shape[-1] == 0:
        return m
    if kind is LogSemiring or kind is RealSemiring:
        return _solve(m, closure, log=kind is LogSemiring)
    if kind is MaxSemiring:
        return _best(semiring, m, closure)
    if kind is CountSemiring:
        return _count(m, closure)
    raise closure.error(f"The {semiring.name} semiring has no closure of a cycle (Log, Real, Max and Count have)")


def _solve(m: Tensor, closure: Closure, log: bool) -> Tensor:
    """Log and Real: ``M⁺ = (I - M)^-1 M``, the sum over paths of any length, in float64
    (probabilities in Log). In Log one exact step of ``M⁺ = M ⊕ M ⊗ M⁺`` in log space then restores
    the paths too light for float64's range (a single rule of weight -800)."""
    w = m.double()
    u = w.exp() if log else w
    _converges(u, closure, "exp(" + closure.weights + ")" if log else closure.weights)
    eye = torch.eye(u.shape[-1], dtype=u.dtype, device=u.device)
    p = torch.linalg.solve(eye - u, u)
    if not log:
        return p.to(m.dtype)
    some = p > 0
    lp = torch.where(some, torch.where(some, p, 1.0).log(), -math.inf)
    lp = Log.plus(w, Log.sum(w.unsqueeze(-1) + lp.unsqueeze(-3), -2))
    return lp.to(m.dtype)


def _converges(u: Tensor, closure: Closure, what: str) -> None:
    """Refuse weights whose sum over paths diverges: a spectral radius of ``u`` at or above 1
    (reads one value on the host)."""
    if u.numel() == 0 or _capturing(u):
        return
    with torch.no_grad():
        finite = torch.isfinite(u).all(-1).all(-1)
        safe = torch.where(finite[..., None, None], u, 0.0)
        radius = torch.linalg.eigvals(safe).abs().amax(-1).masked_fill(~finite, math.inf)
        bad = radius >= RADIUS
        if not bool(bad.any()):
            return
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise closure.error(f"The sum over derivations of any length diverges: the spectral radius of {what} over the labels "
                            f"is {float(radius[where]):.6g} >= 1{_at(closure, where)}")


def _best(semiring: Semiring, m: Tensor, closure: Closure) -> Tensor:
    """Max: the best path of one or more steps, by repeated squaring ``Q = Q ⊕ Q ⊗ Q`` until paths
    of every length up to L are in; refused where a cycle has a positive weight. Gradients go to the
    first best (decodes are one derivation). A cycle of weight 0 is allowed, to within rounding
    (``0.1 + 0.2 - 0.3`` is not 0 in floating point)."""
    q = m
    for _ in range(max(0, math.ceil(math.log2(m.shape[-1])))):
        q = semiring.plus(q, semiring.sum(q.unsqueeze(-1) + q.unsqueeze(-3), -2))
    with torch.no_grad():
        size = m.masked_fill(~torch.isfinite(m), 0).abs().amax((-2, -1), keepdim=True).squeeze(-1)
        rounding = torch.finfo(m.dtype).eps * m.shape[-1] * (1 + size)
        on_cycle = q.diagonal(dim1=-2, dim2=-1) > rounding
    _no_cycle(on_cycle, m, closure, "whose weights sum to more than 0 in Max, so no best derivation exists")
    return q


def _count(m: Tensor, closure: Closure) -> Tensor:
    """Count: the number of paths of one or more steps, ``Σ_{k=1..L} M^k``; refused where a cycle of
    finite weights makes it infinite."""
    q = m
    for _ in range(m.shape[-1] - 1):
        q = m + m @ q
    _no_cycle(q.diagonal(dim1=-2, dim2=-1) > 0, torch.where(m > 0, 1.0, -math.inf).to(m.dtype), closure,
              "of finite weights, so the count of derivations is infinite")
    return q


def _no_cycle(on_cycle: Tensor, w: Tensor, closure: Closure, what: str) -> None:
    """Raise, naming a cycle of positive weight, where ``on_cycle [*, L]`` marks a label on one
    (reads one value on the host)."""
    if _capturing(on_cycle) or not bool(on_cycle.any()):
        return
    where = tuple(int(i) for i in on_cycle.nonzero()[0][:-1])
    cycle = _positive_cycle(w[where].detach().double().cpu().numpy())
    labels = " -> ".join(map(str, cycle)) if cycle else str(int(on_cycle[where].nonzero()[0]))
    raise closure.error(f"The labels {labels} form a cycle {what}{_at(closure, where)}")


def _capturing(t: Tensor) -> bool:
    """Whether a CUDA graph is being captured (no value may be read on the host then: not checked)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _at(closure: Closure, where: tuple[int, ...]) -> str:
    """Where in the weights a group is: ``where`` indexes the weights' batch and other dimensions."""
    if not where:
        return ""
    rest = f" at the other indices {where[1:]} of '{closure.weights}'" if len(where) > 1 else ""
    return f" (example {where[0]}{rest})"


def _positive_cycle(w: np.ndarray) -> list[int]:
    """A cycle of positive weight in ``w [L, L]`` (``w[a, b]``: label b derives label a; -inf: not),
    as labels in the order they derive each other, the first repeated last (Bellman-Ford from every
    label at once; empty where rounding hides it)."""
    size = len(w)
    best, parent = np.zeros(size), np.full(size, -1)
    last = -1
    for _ in range(size + 1):
        last = -1
        for a in range(size):
            for b in range(size):
                if best[b] + w[a, b] > best[a]:
                    best[a], parent[a], last = best[b] + w[a, b], b, a
        if last < 0:
            return []
    for _ in range(size):  # walk back into the cycle
        last = parent[last]
    cycle, x = [last], parent[last]
    while x != last:
        cycle.append(int(x))
        x = parent[x]
    cycle.append(last)
    return [int(x) for x in reversed(cycle)]

