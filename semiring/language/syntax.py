"""Parsing rule text into a checked intermediate representation.

A program is a list of weighted deduction rules, one per line::

    alpha[0, c]  = 1
    alpha[i, c] += alpha[i-1, y] * edge[i-1, y, c]
    goal        += alpha[n-1, c]

``head (= | +=) term * term * ... [for v in lo..hi]* [if cond [and cond]*]``. A term is a chart
(a name that heads some rule), an input (any other name) or the semiring one ``1``. Indices are
affine expressions of lowercase variables and integers, or UPPERCASE constants naming the entries
of a label dimension (``R``, ``L``). ``n`` is each example's length and may only appear in rules for
``goal``. ``#`` starts a comment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Union


class _kept:
    """A computed attribute of an immutable object, kept in the object once computed (as
    ``functools.cached_property``, without its lock, which in Python 3.11 costs more than what it
    keeps here: the planner asks for millions of these)."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, owner: type | None = None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


class ProgramError(ValueError):
    """An error in a program's text, reported with its line and column."""

    def __init__(self, message: str, line: int = 0, col: int = 0, text: str = ""):
        where = f"line {line}, column {col}: " if line else ""
        shown = f"\n    {text.strip()}" if text else ""
        super().__init__(f"{where}{message}{shown}")
        self.line, self.col = line, col


@dataclass(frozen=True)
class Affine:
    """``sum(coeffs[v] * v) + const`` over integer variables."""

    coeffs: tuple[tuple[str, int], ...]
    const: int = 0

    @_kept
    def variables(self) -> frozenset[str]:
        return frozenset(v for v, _ in self.coeffs)

    def __hash__(self) -> int:  # (kept: the planner's remembered projections hash the same forms often)
        return self._hash

    @_kept
    def _hash(self) -> int:
        return hash((self.coeffs, self.const))

    def shifted(self, delta: int) -> "Affine":
        return Affine(self.coeffs, self.const + delta)

    def minus(self, other: "Affine") -> "Affine":
        c = dict(self.coeffs)
        for v, a in other.coeffs:
            c[v] = c.get(v, 0) - a
        return Affine(tuple(sorted((v, a) for v, a in c.items() if a)), self.const - other.const)

    def renamed(self, names: dict[str, str]) -> "Affine":
        return Affine(tuple(sorted((names.get(v, v), a) for v, a in self.coeffs)), self.const)

    def __str__(self) -> str:
        parts = [(f"{'-' if a < 0 else '+'}{abs(a) if abs(a) != 1 else ''}{v}") for v, a in self.coeffs]
        if self.const or not parts:
            parts.append(f"{'-' if self.const < 0 else '+'}{abs(self.const)}")
        s = "".join(parts)
        return s[1:] if s.startswith("+") else s


@dataclass(frozen=True)
class Const:
    """An UPPERCASE constant naming an entry of a label dimension."""

    name: str

    @property
    def variables(self) -> set[str]:
        return set()

    def renamed(self, names: dict[str, str]) -> "Const":
        return self

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Lookup:
    """An index read from data: ``label[s]`` in ``emit[t, label[s]]`` is the integer input ``label``
    at ``s`` (each example's own)."""

    name: str
    indices: tuple[Affine, ...]
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)

    @property
    def variables(self) -> set[str]:
        return set().union(*(i.variables for i in self.indices)) if self.indices else set()

    def renamed(self, names: dict[str, str]) -> "Lookup":
        return Lookup(self.name, tuple(i.renamed(names) for i in self.indices), self.line, self.col)

    def __str__(self) -> str:
        return f"{self.name}[{', '.join(map(str, self.indices))}]"


Index = Union[Affine, Const, Lookup]


@dataclass(frozen=True)
class Term:
    name: str  # "1" for the semiring one
    indices: tuple[Index, ...]
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)

    @property
    def is_one(self) -> bool:
        return self.name == "1"

    @_kept
    def variables(self) -> frozenset[str]:  # (cached: a rule of thousands of terms asks often)
        return frozenset().union(*(i.variables for i in self.indices))

    def renamed(self, names: dict[str, str]) -> "Term":
        return Term(self.name, tuple(i.renamed(names) for i in self.indices), self.line, self.col)

    @_kept
    def _text(self) -> str:
        return self.name if not self.indices else f"{self.name}[{', '.join(map(str, self.indices))}]"

    def __str__(self) -> str:
        return self._text


@dataclass(frozen=True)
class Range:
    var: str
    lo: Affine
    hi: Affine  # inclusive

    def renamed(self, names):
        return Range(names.get(self.var, self.var), self.lo.renamed(names), self.hi.renamed(names))

    def __str__(self):
        return f"for {self.var} in {self.lo}..{self.hi}"


@dataclass(frozen=True)
class Cond:
    left: Affine
    op: str
    right: Affine

    @property
    def variables(self):
        return self.left.variables | self.right.variables

    def renamed(self, names):
        return Cond(self.left.renamed(names), self.op, self.right.renamed(names))

    def __str__(self):
        return f"{self.left} {self.op} {self.right}"


@dataclass(frozen=True)
class Rule:
    head: Term
    terms: tuple[Term, ...]
    ranges: tuple[Range, ...] = ()
    conds: tuple[Cond, ...] = ()
    line: int = field(default=0, compare=False)
    text: str = field(default="", compare=False)
    outer: int = 0  # the last ``outer`` terms do not depend on the summed variables: ⊗ after the ⊕

    @_kept
    def variables(self) -> frozenset[str]:
        vs = self.head.variables.union(*(t.variables for t in self.terms))
        for r in self.ranges:
            vs |= {r.var} | r.lo.variables | r.hi.variables
        for c in self.conds:
            vs |= c.variables
        return vs

    @property
    def reads(self) -> tuple[Term, ...]:
        """The terms, and a term per index looked up from data (``label[s]``: the input ``label``)."""
        looked = [Term(ix.name, ix.indices, self.line, ix.col) for t in (self.head, *self.terms) for ix in t.indices if isinstance(ix, Lookup)]
        return (*self.terms, *looked)

    def error(self, message: str, col: int = 0) -> ProgramError:
        """An error in this rule, at column ``col`` (default: the rule's head)."""
        return ProgramError(message, self.line, col or self.head.col, self.text)

    def column_of(self, var: str) -> int:
        """The column of the variable's first use in the rule's text (0 where it is not written there)."""
        m = re.search(rf"(?<![A-Za-z_0-9]){re.escape(var)}(?![A-Za-z_0-9])", self.text)
        return m.start() + 1 if m else 0

    @_kept
    def _text(self) -> str:  # (kept: the compiler orders variables by where they first occur in it)
        body = " * ".join(map(str, self.terms))
        extra = "".join(f" {r}" for r in self.ranges)
        if self.conds:
            extra += " if " + " and ".join(map(str, self.conds))
        return f"{self.head} += {body}{extra}"

    def __str__(self) -> str:
        return self._text


INDEX_LIMIT = 2**62  # index constants and coefficients stay far inside int64, whatever arithmetic follows

_TOKEN = re.compile(r"\s*(?:(?P<num>[0-9]+)|(?P<name>[A-Za-z_][A-Za-z_0-9]*)|(?P<op>\+=|\.\.|<=|>=|==|!=|[-+*=\[\],<>]))")
_KEYWORDS = {"for", "in", "if", "and"}
_KINDS = {"name": "a variable", "op": "a comparison", "num": "a number", None: "more"}  # tokens, in the docs' words


class _Line:
    def __init__(self, text: str, line: int):
        self.text, self.line = text, line
        self.tokens: list[tuple[str, str, int]] = []
        pos, end = 0, len(text.rstrip())
        while pos < end:
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                col = len(text) - len(text[pos:].lstrip()) + 1
                char = text[col - 1]
                if char.isdigit():  # '١', '３', '²': a digit, but not one an index is written with
                    raise ProgramError(f"{char!r} is not an ASCII digit: write numbers with 0-9", line, col, text)
                raise ProgramError(f"unexpected character {char!r}", line, col, text)
            kind = m.lastgroup
            self.tokens.append((kind, m.group(kind), m.start(kind) + 1))
            pos = m.end()
        self.i = 0

    def peek(self, value: str | None = None) -> bool:
        if self.i >= len(self.tokens):
            return False
        return value is None or self.tokens[self.i][1] == value

    def col(self) -> int:
        return self.tokens[self.i][2] if self.i < len(self.tokens) else len(self.text.rstrip()) + 1

    def take(self, kind: str | None = None, value: str | None = None) -> tuple[str, str, int]:
        wanted = value or _KINDS.get(kind, kind)
        if self.i >= len(self.tokens):
            raise ProgramError(f"expected {wanted}, found the end of the line", self.line, self.col(), self.text)
        tok = self.tokens[self.i]
        if (kind and tok[0] != kind) or (value and tok[1] != value):
            raise ProgramError(f"expected {wanted}, found {tok[1]!r}", self.line, tok[2], self.text)
        self.i += 1
        return tok

    def error(self, message: str) -> ProgramError:
        return ProgramError(message, self.line, self.col(), self.text)


def _is_const(name: str) -> bool:
    return name.isupper()


def _affine(ln: _Line) -> Affine:
    coeffs: dict[str, int] = {}
    const = 0
    sign = 1
    if ln.peek("-"):
        ln.take()
        sign = -1
    while True:
        kind, value, col = ln.take()
        if kind == "num":
            if int(value) > INDEX_LIMIT:
                raise ProgramError(f"the index constant {value} is beyond what an index can be (at most {INDEX_LIMIT})", ln.line, col, ln.text)
            if ln.peek("*"):
                ln.take()
                _, var, vcol = ln.take("name")
                if var in _KEYWORDS or _is_const(var):
                    raise ProgramError(f"expected a variable after '*', found {var!r}", ln.line, vcol, ln.text)
                coeffs[var] = coeffs.get(var, 0) + sign * int(value)
            else:
                const += sign * int(value)
        elif kind == "name" and value not in _KEYWORDS and not _is_const(value):
            coeffs[value] = coeffs.get(value, 0) + sign
        else:
            raise ProgramError(f"expected an index expression, found {value!r}", ln.line, col, ln.text)
        if ln.peek("+") or ln.peek("-"):
            sign = 1 if ln.take()[1] == "+" else -1
        else:
            return Affine(tuple(sorted((v, a) for v, a in coeffs.items() if a)), const)


def _index(ln: _Line) -> Index:
    if ln.i < len(ln.tokens) and ln.tokens[ln.i][0] == "name" and _is_const(ln.tokens[ln.i][1]):
        return Const(ln.take()[1])
    if ln.i + 1 < len(ln.tokens) and ln.tokens[ln.i][0] == "name" and ln.tokens[ln.i + 1][1] == "[":
        _, name, col = ln.take()
        ln.take(value="[")
        indices = [_affine(ln)]
        while ln.peek(","):
            ln.take()
            indices.append(_affine(ln))
        ln.take(value="]")
        return Lookup(name, tuple(indices), ln.line, col)
    return _affine(ln)


def _term(ln: _Line) -> Term:
    kind, value, col = ln.take()
    if kind == "num":
        if value != "1":
            raise ProgramError(f"the only number that can be a term is 1 (the semiring one), found {value}", ln.line, col, ln.text)
        return Term("1", (), ln.line, col)
    if kind != "name" or value in _KEYWORDS:
        raise ProgramError(f"expected a chart, an input or 1, found {value!r}", ln.line, col, ln.text)
    indices: list[Index] = []
    if ln.peek("["):
        ln.take()
        indices.append(_index(ln))
        while ln.peek(","):
            ln.take()
            indices.append(_index(ln))
        ln.take(value="]")
    return Term(value, tuple(indices), ln.line, col)


def parse_rule(text: str, line: int) -> Rule:
    ln = _Line(text, line)
    head = _term(ln)
    if head.is_one:
        raise ln.error("a rule's head must be a chart")
    if not (ln.peek("=") or ln.peek("+=")):
        raise ln.error("expected '=' or '+=' after the head")
    ln.take()
    terms = [_term(ln)]
    while ln.peek("*"):
        ln.take()
        terms.append(_term(ln))
    ranges, conds = [], []
    while ln.peek("for"):
        ln.take()
        _, var, col = ln.take("name")
        ln.take(value="in")
        lo = _affine(ln)
        ln.take(value="..")
        hi = _affine(ln)
        ranges.append(Range(var, lo, hi))
    if ln.peek("if"):
        ln.take()
        while True:
            left = _affine(ln)
            _, op, col = ln.take("op")
            if op not in ("<", "<=", ">", ">=", "==", "!="):
                raise ProgramError(f"expected a comparison, found {op!r}", line, col, text)
            conds.append(Cond(left, op, _affine(ln)))
            if not ln.peek("and"):
                break
            ln.take()
    if ln.peek():
        raise ln.error(f"unexpected {ln.tokens[ln.i][1]!r}")
    return Rule(head, tuple(terms), tuple(ranges), tuple(conds), line, text)


GOAL = "goal"
LENGTH = "n"  # each example's length; only rules for 'goal' may use it
LENGTHS = ("n", "m")  # the lengths an example may have: 'm' is one where a rule for 'goal' uses it without a 'for' range


@dataclass
class Syntax:
    """A parsed and statically checked program."""

    rules: list[Rule]
    charts: dict[str, int]  # chart name -> rank
    inputs: dict[str, tuple[int, Term]]  # input name -> (rank, first use)
    constants: dict[str, int]  # UPPERCASE constant -> code
    lengths: list[str]  # the length variables the rules for 'goal' use (in LENGTHS order)
    lookups: dict[str, tuple[int, Lookup]] = field(default_factory=dict)  # integer input -> (rank, first use)

    @property
    def uses_length(self) -> bool:
        return bool(self.lengths)


def parse(text: str) -> Syntax:
    if not isinstance(text, str):
        raise ProgramError(f"a program is text (a str), got {type(text).__name__}")
    rules = []
    for number, raw in enumerate(text.splitlines(), start=1):
        body = raw.split("#", 1)[0]
        if body.strip():
            rules.append(parse_rule(body, number))
    if not rules:
        raise ProgramError("a program needs at least one rule", 1, 1)
    return check(rules)


def check_base_cases(rules: list[Rule]) -> None:
    """A ``ProgramError`` for a chart none of whose rules can ever fire: each reads a chart without
    items (``alpha[i, c] += alpha[i-1, y] * edge[i-1, y, c]`` and no ``alpha[0, c] = ...``)."""
    charts = {r.head.name for r in rules}
    started: set[str] = set()
    grown = True
    while grown:
        grown = False
        for r in rules:
            if r.head.name not in started and all(t.is_one or t.name not in charts or t.name in started for t in r.terms):
                started.add(r.head.name)
                grown = True
    empty = [r for r in rules if r.head.name not in started]
    if empty:
        r = next((r for r in empty if r.head.name != GOAL), empty[0])
        raise r.error(f"no base case for chart {r.head.name!r}: each of its rules reads a chart that has no items; add "
                      "a rule for it that reads only inputs or 1 (as a chain's 'alpha[0, c] = 1')")


def check(rules: list[Rule]) -> Syntax:
    charts: dict[str, int] = {}
    for r in rules:
        if r.head.name in charts and charts[r.head.name] != len(r.head.indices):
            raise r.error(f"chart {r.head.name!r} has {charts[r.head.name]} indices elsewhere, {len(r.head.indices)} here", r.head.col)
        charts[r.head.name] = len(r.head.indices)
    if GOAL not in charts:
        raise ProgramError("no rule defines 'goal'", rules[-1].line, 1, rules[-1].text)
    if charts[GOAL] != 0:
        raise next(r for r in rules if r.head.name == GOAL).error("'goal' takes no indices (its length index n is implicit)")
    inputs: dict[str, tuple[int, Term]] = {}
    lookups: dict[str, tuple[int, Lookup]] = {}
    constants: dict[str, int] = {}
    for r in rules:
        for t in (r.head, *r.terms):
            for ix in t.indices:
                if isinstance(ix, Const):
                    constants.setdefault(ix.name, len(constants))
        for t in r.terms:
            if t.is_one:
                continue
            if t.name == GOAL:
                raise r.error("'goal' cannot be read by a rule", t.col)
            if t.name in charts:
                if charts[t.name] != len(t.indices):
                    raise r.error(f"chart {t.name!r} has {charts[t.name]} indices, used here with {len(t.indices)}", t.col)
            elif t.name in inputs and inputs[t.name][0] != len(t.indices):
                raise r.error(f"input {t.name!r} is used with {inputs[t.name][0]} indices elsewhere, {len(t.indices)} here", t.col)
            else:
                inputs.setdefault(t.name, (len(t.indices), t))
        for t in (r.head, *r.terms):
            for ix in t.indices:
                if not isinstance(ix, Lookup):
                    continue
                if t.name in charts or t.is_one:
                    raise r.error("an index looked up from data may only index an input, not a chart", ix.col)
                if ix.name in charts:
                    raise r.error(f"{ix.name!r} is a chart; an index is looked up from an integer input", ix.col)
                if ix.name in lookups and lookups[ix.name][0] != len(ix.indices):
                    raise r.error(f"input {ix.name!r} is looked up with {lookups[ix.name][0]} indices elsewhere, {len(ix.indices)} here", ix.col)
                lookups.setdefault(ix.name, (len(ix.indices), ix))
        if LENGTH in r.variables and r.head.name != GOAL:
            raise r.error("the length 'n' may only appear in rules for 'goal'")
        for rg in r.ranges:
            if rg.var in r.head.variables:
                raise r.error(f"'{rg.var}' is summed by 'for' but also indexes the head")
            if rg.var == LENGTH:
                raise r.error("'n' is the length and cannot be a 'for' variable")
    goal_rules = [r for r in rules if r.head.name == GOAL]
    used = [[v for v in LENGTHS if v in r.variables and v not in {rg.var for rg in r.ranges}] for r in goal_rules]
    lengths = max(used, key=len)
    for r, u in zip(goal_rules, used):
        if u != lengths:
            raise r.error(f"every rule for 'goal' must use {' and '.join(repr(v) for v in lengths)} when one does")
    both = sorted(set(inputs) & set(lookups))
    if both:
        rank, use = lookups[both[0]]
        rule = next(r for r in rules if r.line == use.line)
        raise rule.error(f"input {both[0]!r} is both potentials and an index looked up from data", use.col)
    return Syntax(rules, charts, inputs, constants, lengths, lookups)
