"""Cycles inside a level, solved as closures.

Rules that read a chart at the item group they write, in another label, make the items of one
group depend on each other: unary chains ``X[s, t, a] += X[s, t, b] * unary[a, b]``, epsilon moves,
two charts that derive each other (``X[s, t, a] += Y[s, t, b] * u[a, b]`` and ``Y[s, t, a] +=
X[s, t, b] * v[a, b]``), several such rules per chart, and labels that are constants
(``C[s, t, R] += C[s, t, L] * w[s, t]``), and cycles that change no label, only the chart (``x[i] +=
y[i] * u[i]`` and ``y[i] += x[i] * v[i]``, or ``x[i] += x[i] * stay[i]``: each chart one label). The
charts that read each other so form a *system*: its
items of one group are one vector ``x`` over (chart, label), and with ``x0`` the ⊕ of the charts'
other rules and ``M`` the block matrix of the system's rules (``M[(X, a), (Y, b)]``: the ⊕ of the
weights of deriving ``X``'s label a from ``Y``'s label b) they are ``x = x0 ⊕ M ⊗ x``, whose least
solution sums the derivations of any length: ``x = x0 ⊕ M⁺ ⊗ x0``, ``M⁺ = M ⊕ M² ⊕ ...``. So the
program is rewritten without the cycle: each chart's other rules write an *open* chart ``X'``, and

    X[s, t, a] += X'[s, t, a]
    X[s, t, a] += Y'[s, t, b] * X+Y[a, b]        (for every chart Y of the system)

where ``X+Y`` is the block of ``M⁺`` from ``Y`` to ``X`` (``unary+`` where the system is one rule of
one chart), computed from the inputs per run (:func:`derive`) and differentiable, so marginals,
gradients and decodes follow from the same definition as everywhere else. Per semiring: Log and
Real solve ``(I - M) M⁺ = M`` (a linear system per group, in float64); Max finds best paths by
repeated squaring (no positive cycle); Count sums paths (no cycle of finite weights); the others
have no closure and refuse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Union

import numpy as np
import torch
from torch import Tensor

from ..semirings import CountSemiring, Log, LogSemiring, MaxSemiring, RealSemiring, Semiring
from .levels import components
from .syntax import Affine, Const, Index, ProgramError, Rule, Syntax, Term

OPEN = "'"  # X' is X before its closure (a name no program can write)
PLUS = "+"  # w+ (X+Y) is a block of the strict closure (a name no program can write)
RADIUS = 1 - 1e-12  # in Log and Real, a spectral radius at or above this diverges
CLOSED = (LogSemiring, RealSemiring, MaxSemiring, CountSemiring)

Label = Union[str, int]  # a label: a variable, or the code of a constant


@dataclass(frozen=True)
class Step:
    """One rule of a system, ``head[.., row, ..] += read[.., col, ..] * weights[..]``."""

    rule: Rule
    read: Term  # its read of a chart of the system
    weights: Term | None  # its input of weights (None: the semiring one)
    row: Label  # the head's label
    col: Label  # the read's label (the head's variable: the same label, a diagonal)
    group: tuple[str, ...]  # the head's variables at the positions other than the label's
    axes: tuple[int | None, int | None]  # the weights' dimensions of the row and the column labels (None: a constant)
    others: tuple[tuple[Index, int], ...]  # the weights' other indices and their dimensions

    @property
    def head(self) -> str:
        return self.rule.head.name

    def error(self, message: str, more: str = "") -> ProgramError:
        return self.rule.error(f"{self.rule.head} reads {self.read} at the same level: a cycle{more}; see Cycles. {message}",
                               self.read.col)


@dataclass(frozen=True)
class System:
    """The rules by which the items of one group of some charts derive each other."""

    steps: tuple[Step, ...]  # in program order
    charts: tuple[str, ...]  # the blocks of M, in order of first appearance
    position: int | None  # the label's position among the charts' indices (None: no label, each chart one item per group)
    group: tuple[str, ...]  # the variables of the other positions in the rewritten rules
    labels: tuple[str, str]  # the variables of the label in the rewritten rules: head, read
    others: tuple[Index, ...]  # the weights' indices that are not labels, in the variables of ``group``
    names: dict[tuple[str, str], str]  # (head chart, read chart) -> the derived input of its block of M⁺
    open: frozenset[str]  # the charts with other rules (an open chart)

    def error(self, message: str) -> ProgramError:
        """An error about the whole system, blamed on its first rule, naming the others."""
        rest = sorted({s.rule.line for s in self.steps[1:]} - {self.steps[0].rule.line})
        s = "s" if len(rest) > 1 else ""
        more = f" with the rule{s} of line{s} {', '.join(map(str, rest))}" if rest else ""
        return self.steps[0].error(message, more)

    def weights(self) -> list[str]:
        return list(dict.fromkeys(s.weights.name for s in self.steps if s.weights is not None))


def _lone(ix: Index) -> str | None:
    """The variable of an index that is one variable alone (``b``, not ``b+1``), else None."""
    if isinstance(ix, Affine) and ix.const == 0 and len(ix.coeffs) == 1 and ix.coeffs[0][1] == 1:
        return ix.coeffs[0][0]
    return None


def _label(ix: Index, constants: dict[str, int]) -> Label | None:
    """A label index as a variable (a lone one) or a constant's code (``R``, or an integer ``0``), else None."""
    if isinstance(ix, Const):
        return constants[ix.name]
    if isinstance(ix, Affine) and not ix.coeffs and ix.const >= 0:
        return ix.const
    return _lone(ix)


def same_level_read(rule: Rule, syntax: Syntax) -> tuple[Term, int | None] | None:
    """The rule's one read of a chart at the item group its head writes, and the label position: the
    read's indices are the head's but at most at one position (None where at none), where both are
    labels and the read's variable is summed. None where there is no such read."""
    head = rule.head
    reads = [t for t in rule.terms if t.name in syntax.charts]
    if len(reads) != 1 or len(reads[0].indices) != len(head.indices):
        return None
    read = reads[0]
    differ = [d for d, (h, r) in enumerate(zip(head.indices, read.indices)) if h != r]
    if not differ:
        return read, None
    h, r = (_label(t.indices[differ[0]], syntax.constants) for t in (head, read))
    if len(differ) > 1 or h is None or r is None or r in head.variables:
        return None
    return read, differ[0]


def _link(rule: Rule, syntax: Syntax) -> tuple[Term, int | None] | None:
    """:func:`same_level_read` where the rule may be a step of a system (no 'for', no 'if')."""
    return None if rule.ranges or rule.conds else same_level_read(rule, syntax)


def _step(rule: Rule, read: Term, position: int | None, syntax: Syntax) -> Step | str:
    """The rule as a step of a system whose label is at ``position`` (None: a system without labels,
    where each chart's one label is the constant 0), or why it cannot be one."""
    head = rule.head
    group = [_lone(ix) for d, ix in enumerate(head.indices) if d != position]
    if None in group or len(set(group)) != len(group):
        but = "" if position is None else f" other than the label (index {position + 1})"
        return f"Its head's indices{but} must be distinct variables. "
    row, col = (0, 0) if position is None else (_label(t.indices[position], syntax.constants) for t in (head, read))
    if row is None or col is None or row in group:
        return f"Its label (index {position + 1}) must be a variable of its own or a constant. "
    rest = [t for t in rule.terms if t is not read and not t.is_one]
    if len(rest) > 1 or any(t.name in syntax.charts for t in rest):
        return f"Its weights must be one input, not {' * '.join(map(str, rest))}. "
    weights = rest[0] if rest else None
    labels = list(dict.fromkeys(v for v in (row, col) if isinstance(v, str)))
    axes: dict[str, int] = {}
    others: list[tuple[Index, int]] = []
    for d, ix in enumerate(weights.indices if weights else ()):
        var = _lone(ix)
        if not isinstance(ix, Const) and ix.variables & set(labels):
            if var not in labels or var in axes:
                return f"Its weights must be indexed by each label variable alone, once ('{weights}'). "
            axes[var] = d
        elif not isinstance(ix, (Affine, Const)) or not ix.variables <= set(group):
            return f"Its weights '{weights}' may be indexed, besides the labels, only by the head's variables. "
        else:
            others.append((ix, d))
    if len(axes) != len(labels):
        s = "s" if len(labels) > 1 else ""
        return f"Its weights must be indexed by its label variable{s} {' and '.join(map(repr, labels))}. "
    return Step(rule, read, weights, row, col, tuple(group), (axes.get(row), axes.get(col)), tuple(others))


def unsolved(rule: Rule, read: Term, position: int | None, syntax: Syntax) -> ProgramError:
    """The error for a cycle inside a level that is not a closure the compiler solves (``position``:
    the label's, None where the rule reads the very item it writes)."""
    reason = "It has 'for' or 'if'. " if rule.ranges or rule.conds else ""
    step = _step(rule, read, position, syntax)
    reason += step if isinstance(step, str) else ""
    if position is None:
        return rule.error(f"an item depends on itself (a cycle among the rules): {rule.head} reads {read}; see Cycles. "
                          f"{reason}A cycle is solved as a closure where each of its rules is '{rule.head} += {read} * "
                          "w[..]': one read of a chart of the cycle, times at most one input indexed only by the head's "
                          "variables, without 'for' or 'if'", read.col)
    h, r = rule.head.indices[position], read.indices[position]
    return rule.error(f"{rule.head} reads {read} at the same level: a cycle; see Cycles. {reason}A cycle is solved as a "
                      f"closure where each of its rules is '{rule.head} += {read} * w[..]': one read of its own chart, "
                      f"times one input indexed by '{h}' and '{r}', without 'for' or 'if' (the read may be of another "
                      f"chart of the cycle at the same item group, a label a constant); if '{r}' should stop short of "
                      f"'{h}', give it a range such as 'for {r} in ...'", read.col)


def find(rules: list[Rule], syntax: Syntax) -> tuple[list[Rule], Syntax, list[System]]:
    """The rules with every system rewritten (see the module), the syntax with the open charts and
    derived inputs added, and the systems."""
    links = {i: link for i, r in enumerate(rules) if (link := _link(r, syntax))}
    component = components(list(syntax.charts), [(rules[i].head.name, read.name) for i, (read, _) in links.items()])
    cycles: dict[int, list[int]] = {}
    for i, (read, _) in links.items():
        if component[rules[i].head.name] == component[read.name]:
            cycles.setdefault(component[read.name], []).append(i)
    if not cycles:
        return rules, syntax, []
    taken: set[str] = set()
    systems = [_system(rules, [(i, *links[i]) for i in members], syntax, taken) for members in cycles.values()]
    return _rewrite(rules, systems), _declare(syntax, systems), systems


def _system(rules: list[Rule], links: list[tuple[int, Term, int | None]], syntax: Syntax, taken: set[str]) -> System:
    """The system of the rules ``links`` (index, read, label position) of one cycle."""
    first = rules[links[0][0]]
    positions = sorted({d for _, _, d in links if d is not None})
    if len(positions) > 1:
        raise first.error(f"the rules of lines {', '.join(str(rules[i].line) for i, _, _ in links)} make a cycle that "
                          f"changes indices {' and '.join(str(d + 1) for d in positions)}: a closure changes one index, "
                          "the label; see Cycles")
    position = positions[0] if positions else None
    steps = []
    for i, read, _ in links:
        step = _step(rules[i], read, position, syntax)
        if isinstance(step, str):
            raise unsolved(rules[i], read, position, syntax)
        steps.append(step)
    steps.sort(key=lambda s: s.rule.line)
    charts = tuple(dict.fromkeys(c for s in steps for c in (s.head, s.read.name)))
    group = steps[0].group
    row, col = _variables(steps[0], set(group))
    others = tuple(dict.fromkeys(ix.renamed(dict(zip(s.group, group))) for s in steps for ix, _ in s.others))
    stepped = {id(s.rule) for s in steps}
    opened = frozenset(r.head.name for r in rules if r.head.name in charts and id(r) not in stepped)
    draft = System(tuple(steps), charts, position, group, (row, col), others, {}, opened)
    for s in steps:
        if {ix.renamed(dict(zip(s.group, group))) for ix, _ in s.others} != set(others):
            raise draft.error("The weights of a cycle's rules must have the same indices besides the labels: "
                              + ", ".join(f"'{t.weights}'" if t.weights else f"line {t.rule.line}: none" for t in steps))
    return replace(draft, names=_names(draft, taken))


def _variables(step: Step, taken: set[str]) -> tuple[str, str]:
    """The variables of the row and column labels in a system's rewritten rules (the step's own where it has them)."""
    out: list[str] = []
    for want in (step.row, step.col, "a", "b", "c", "d"):
        if isinstance(want, str) and want not in taken and want not in out:
            out.append(want)
    return out[0], out[1]


def _names(system: System, taken: set[str]) -> dict[tuple[str, str], str]:
    """The derived inputs, one per pair of charts whose block of M⁺ a rewritten rule reads: ``w+``
    where the system is one rule with weights over one chart, ``X+Y`` otherwise."""
    (only, *more), charts = system.steps, system.charts
    if not more and len(charts) == 1 and only.weights is not None:
        name = only.weights.name + PLUS
        k = sum(n.startswith(name) for n in taken)
        name += str(k) if k else ""
        taken.add(name)
        return {(charts[0], charts[0]): name} if charts[0] in system.open else {}
    return {(h, r): h + PLUS + r for h in charts for r in charts if r in system.open}


def _rewrite(rules: list[Rule], systems: list[System]) -> list[Rule]:
    """The rules with each system's steps replaced by its closure rules, its charts' other rules writing open charts."""
    owner = {c: s for s in systems for c in s.charts}
    first = {id(s.steps[0].rule): s for s in systems}
    stepped = {id(step.rule) for s in systems for step in s.steps}
    out: list[Rule] = []
    for rule in rules:
        if id(rule) in first:
            out += _closed(first[id(rule)])
        elif id(rule) not in stepped and rule.head.name in owner:
            head = Term(rule.head.name + OPEN, rule.head.indices, rule.line, rule.head.col)
            out.append(Rule(head, rule.terms, rule.ranges, rule.conds, rule.line, rule.text, rule.outer))
        elif id(rule) not in stepped:
            out.append(rule)
    return out


def _closed(system: System) -> list[Rule]:
    """The rules that write a system's charts from its open charts and the blocks of M⁺."""
    def indices(label: str) -> tuple[Index, ...]:
        vs = list(system.group)
        if system.position is not None:
            vs.insert(system.position, label)
        return tuple(map(_var, vs))

    row, col = system.labels
    labels = () if system.position is None else (_var(row), _var(col))
    out = []
    for chart in system.charts:
        step = next(s for s in system.steps if s.head == chart)
        rule, line, head = step.rule, step.rule.line, Term(chart, indices(row), step.rule.line, step.rule.head.col)
        if chart in system.open:
            out.append(Rule(head, (Term(chart + OPEN, indices(row), line, head.col),), (), (), line, rule.text))
        for (h, r), name in system.names.items():
            if h == chart:
                block = Term(name, (*system.others, *labels), line, step.read.col)
                out.append(Rule(head, (Term(r + OPEN, indices(col), line, step.read.col), block), (), (), line, rule.text))
    return out


def _declare(syntax: Syntax, systems: list[System]) -> Syntax:
    """The syntax with the systems' open charts and derived inputs."""
    inputs = dict(syntax.inputs)
    charts = dict(syntax.charts)
    for s in systems:
        read = s.steps[0].read
        rank = len(s.others) + (0 if s.position is None else 2)
        inputs.update({name: (rank, Term(name, (), read.line, read.col)) for name in s.names.values()})
        charts.update({c + OPEN: syntax.charts[c] for c in s.open})
    return replace(syntax, inputs=inputs, charts=charts)


def _var(name: str) -> Affine:
    return Affine(((name, 1),))


def shapes(systems: list[System], shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The input shapes with the derived inputs' (``[*others, labels of the head chart, labels of the
    read chart]``, ``others`` alone in a system without labels)."""
    out = dict(shapes)
    for system in systems:
        labels, others = _sizes(system, shapes)
        out.update({name: (*others, *(() if system.position is None else (labels[h], labels[r])))
                    for (h, r), name in system.names.items()})
    return out


def _sizes(system: System, shapes: dict[str, tuple[int, ...]]) -> tuple[dict[str, int], tuple[int, ...]]:
    """The number of labels of each chart of the system (from its weights' label dimensions, else
    from its constant labels) and the sizes of the weights' other indices; refuses sizes that disagree."""
    said: dict[object, tuple[int, Step, int]] = {}  # a chart or an other index -> (size, the step, the dimension that says so)

    def agree(key: object, size: int, step: Step, dim: int, what: str) -> None:
        if key not in said:
            said[key] = (size, step, dim)
            return
        known, by, at = said[key]
        if known != size:
            whose = f"Its weights '{step.weights.name}' need" if by.weights.name == step.weights.name else \
                f"The weights '{by.weights.name}' and '{step.weights.name}' need"
            raise step.error(f"{whose} as many entries in dimension {at + 1} as in dimension {dim + 1} ({what}), "
                             f"got {known} and {size}")

    for step in system.steps:
        if step.weights is None:
            continue
        shape = shapes[step.weights.name]
        for chart, label, dim in ((step.head, step.row, step.axes[0]), (step.read.name, step.col, step.axes[1])):
            if dim is not None:
                agree(chart, shape[dim], step, dim, "one per label" + (f" of '{chart}'" if len(system.charts) > 1 else ""))
        for ix, dim in step.others:
            agree(ix.renamed(dict(zip(step.group, system.group))), shape[dim], step, dim, f"one per value of '{ix}'")
    labels = {c: said[c][0] for c in system.charts if c in said}
    for step in system.steps:
        for chart, label in ((step.head, step.row), (step.read.name, step.col)):
            if isinstance(label, int) and chart in said and label >= labels[chart]:
                raise step.error(f"Its constant label (entry {label}) of '{chart}' is beyond the {labels[chart]} labels "
                                 "its weights give")
            if isinstance(label, int) and chart not in said:
                labels[chart] = max(labels.get(chart, 0), label + 1)
    return labels, tuple(said[ix][0] for ix in system.others)


def derive(systems: list[System], semiring: Semiring, elements: dict[str, Tensor]) -> dict[str, Tensor]:
    """The elements of the derived inputs, the blocks of ``M⁺``, from the weights' elements ``[B, *shape]``."""
    if type(semiring) not in CLOSED:
        raise systems[0].error(f"The {semiring.name} semiring has no closure of a cycle (Log, Real, Max and Count have)")
    shapes = {name: tuple(x.shape[1:]) for name, x in elements.items()}
    like = next(x for x in elements.values() if x.is_floating_point())
    out: dict[str, Tensor] = {}
    for system in systems:
        labels, _ = _sizes(system, shapes)
        p = strict(semiring, _matrix(system, semiring, elements, labels, like), system, labels)
        start = dict(zip(system.charts, np.cumsum([0] + [labels[c] for c in system.charts]).tolist()))
        for (h, r), name in system.names.items():
            block = p[..., start[h]:start[h] + labels[h], start[r]:start[r] + labels[r]]
            out[name] = block[..., 0, 0] if system.position is None else block
    return out


def _matrix(system: System, semiring: Semiring, elements: dict[str, Tensor], labels: dict[str, int], like: Tensor) -> Tensor:
    """``M [B, *others, L, L]`` over the labels of every chart of the system, chart after chart."""
    blocks: dict[tuple[str, str], list[Tensor]] = {}
    for step in system.steps:
        blocks.setdefault((step.head, step.read.name), []).append(_block(system, step, semiring, elements, labels, like))
    summed = {k: v[0] if len(v) == 1 else semiring.sum(torch.stack(torch.broadcast_tensors(*v)), 0) for k, v in blocks.items()}
    lead = torch.broadcast_shapes(*(b.shape[:-2] for b in summed.values()))
    rows = []
    for h in system.charts:
        row = [summed[h, r].expand(*lead, -1, -1) if (h, r) in summed else semiring.zero((*lead, labels[h], labels[r]), like)
               for r in system.charts]
        rows.append(torch.cat(row, -1))
    return torch.cat(rows, -2)


def _block(system: System, step: Step, semiring: Semiring, elements: dict[str, Tensor], labels: dict[str, int],
           like: Tensor) -> Tensor:
    """A step's weights as its block of ``M``, ``[B, *others, labels of the head, labels of the read]``:
    every row and column where its labels are variables, the one of a constant, the diagonal where
    the head's label is the read's."""
    size = (labels[step.head], labels[step.read.name])
    diagonal = isinstance(step.row, str) and step.row == step.col
    if step.weights is None:
        value = semiring.one((1,) * (len(system.others) + 3), like)
    else:
        where = {ix.renamed(dict(zip(step.group, system.group))): d for ix, d in step.others}
        axes = (*(where[ix] for ix in system.others), step.axes[0], None if diagonal else step.axes[1])
        value = _arrange(elements[step.weights.name], axes)
    rows, cols = (torch.arange(n, device=like.device) for n in size)
    mask = (rows[:, None] == cols) if diagonal else _labels(rows, step.row)[:, None] & _labels(cols, step.col)
    return torch.where(mask, value, semiring.zero((), value))


def _labels(labels: Tensor, label: Label) -> Tensor:
    """Which of ``labels`` a step's label takes: all for a variable, one for a constant."""
    return torch.ones_like(labels, dtype=torch.bool) if isinstance(label, str) else labels == label


def _arrange(x: Tensor, axes: tuple[int | None, ...]) -> Tensor:
    """``x [B, *shape]`` as ``[B, *(shape[a] for a in axes)]``, a size-1 dimension where ``a`` is None."""
    kept = [a for a in axes if a is not None]
    return x.permute(0, *(1 + a for a in kept)).reshape(x.shape[0], *(x.shape[1 + a] if a is not None else 1 for a in axes))


def strict(semiring: Semiring, m: Tensor, system: System, labels: dict[str, int]) -> Tensor:
    """``M⁺ = M ⊕ M² ⊕ ...`` of ``m [*, L, L]`` (``m[.., a, b]``: deriving label a from label b)."""
    kind = type(semiring)
    if m.shape[-1] == 0:
        return m
    if kind is LogSemiring or kind is RealSemiring:
        return _solve(m, system, log=kind is LogSemiring)
    if kind is MaxSemiring:
        return _best(semiring, m, system, labels)
    return _count(m, system, labels)


def _solve(m: Tensor, system: System, log: bool) -> Tensor:
    """Log and Real: ``M⁺ = (I - M)^-1 M``, the sum over paths of any length, in float64
    (probabilities in Log). In Log one exact step of ``M⁺ = M ⊕ M ⊗ M⁺`` in log space then restores
    the paths too light for float64's range (a single rule of weight -800)."""
    w = m.double()
    u = w.exp() if log else w
    _converges(u, system, log)
    eye = torch.eye(u.shape[-1], dtype=u.dtype, device=u.device)
    p = torch.linalg.solve(eye - u, u)
    if not log:
        return p.to(m.dtype)
    some = p > 0
    lp = torch.where(some, torch.where(some, p, 1.0).log(), -math.inf)
    lp = Log.plus(w, Log.sum(w.unsqueeze(-1) + lp.unsqueeze(-3), -2))
    return lp.to(m.dtype)


def _converges(u: Tensor, system: System, log: bool) -> None:
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
        weights = [f"exp({w})" if log else w for w in system.weights()] or ["ones"]
        what = weights[0] if len(weights) == 1 and len(system.charts) == 1 else f"the block matrix of {', '.join(weights)}"
        of = f" of {', '.join(map(repr, system.charts))}" if len(system.charts) > 1 else ""
        if system.position is None and len(system.charts) == 1:
            measure = f"the weight {what} of the cycle"
        elif system.position is None:
            measure = f"the spectral radius of {what} over the charts {', '.join(map(repr, system.charts))}"
        else:
            measure = f"the spectral radius of {what} over the labels{of}"
        raise system.error(f"The sum over derivations of any length diverges: {measure} is {float(radius[where]):.6g} "
                           f">= 1{_at(system, where)}")


def _best(semiring: Semiring, m: Tensor, system: System, labels: dict[str, int]) -> Tensor:
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
    _no_cycle(on_cycle, m, system, labels, "whose weights sum to more than 0 in Max, so no best derivation exists")
    return q


def _count(m: Tensor, system: System, labels: dict[str, int]) -> Tensor:
    """Count: the number of paths of one or more steps, ``Σ_{k=1..L} M^k``; refused where a cycle of
    finite weights makes it infinite."""
    q = m
    for _ in range(m.shape[-1] - 1):
        q = m + m @ q
    _no_cycle(q.diagonal(dim1=-2, dim2=-1) > 0, torch.where(m > 0, 1.0, -math.inf).to(m.dtype), system, labels,
              "of finite weights, so the count of derivations is infinite")
    return q


def _no_cycle(on_cycle: Tensor, w: Tensor, system: System, labels: dict[str, int], what: str) -> None:
    """Raise, naming a cycle of positive weight, where ``on_cycle [*, L]`` marks a label on one
    (reads one value on the host)."""
    if _capturing(on_cycle) or not bool(on_cycle.any()):
        return
    where = tuple(int(i) for i in on_cycle.nonzero()[0][:-1])
    cycle = _positive_cycle(w[where].detach().double().cpu().numpy())
    if system.position is None:
        names, whose = list(system.charts), "The charts"
    else:
        names = [f"{c} {k}" if len(system.charts) > 1 else str(k) for c in system.charts for k in range(labels[c])]
        whose = "The labels"
    shown = " -> ".join(names[k] for k in cycle) if cycle else names[int(on_cycle[where].nonzero()[0])]
    raise system.error(f"{whose} {shown} form a cycle {what}{_at(system, where)}")


def _capturing(t: Tensor) -> bool:
    """Whether a CUDA graph is being captured (no value may be read on the host then: not checked)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _at(system: System, where: tuple[int, ...]) -> str:
    """Where in the weights a group is: ``where`` indexes the weights' batch and other dimensions."""
    if not where:
        return ""
    weights = system.weights()
    whose = f"'{weights[0]}'" if len(weights) == 1 else "the weights"
    rest = f" at the other indices {where[1:]} of {whose}" if len(where) > 1 else ""
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

