"""Every program of the suite, compiled and run, equals the slow reference interpreter
(:mod:`semiring.language.reference`: item by item, nothing shared with the compiler but the parser),
in every semiring, with random lengths and forbidden (-inf) entries."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import semiring as sr
from semiring.language.reference import interpret
from structures.chain import LinearChainCRF
from structures.emission import EmissionCRF
from structures.hops import HopChainCRF
from structures.projective import _MULTI_ROOT, _SINGLE_ROOT
from structures.semimarkov import SemiMarkovCRF
from structures.tour import BRACKETS
from test_language import ALIGNMENT, CKY, CTC, EISNER, PCFG, PCFG_BY_HAND, ctc_inputs

B = 3

# r reads f at 3-i: no level function orders the two charts together, but r reads only finished
# items of f (a later phase of the plan).
READ_BACKWARDS = """
    f[0]  = a[0]
    f[i] += f[i-1] * a[i]
    r[i] += f[3-i] * b[i]
    r[i] += r[i-1] * c[i]
    goal += r[n-1]
"""


def potentials(g: torch.Generator, *shape: int, batch: int = B, forbid: float = 0.2) -> torch.Tensor:
    x = torch.randn(batch, *shape, generator=g, dtype=torch.float64)
    return x.masked_fill(torch.rand(x.shape, generator=g, dtype=torch.float64) < forbid, -math.inf)


def ctc(g):
    ext, skip, first = ctc_inputs(torch.randint(1, 3, (B, 2), generator=g))
    logp = torch.randn(B, 6, 3, generator=g, dtype=torch.float64).log_softmax(-1)
    lengths = {"n": torch.randint(3, 7, (B,), generator=g), "m": 2 * torch.randint(1, 3, (B,), generator=g) + 1}
    return dict(logp=logp, first=first, skip=skip, ext=ext), lengths


PROGRAMS = {  # name -> (text, g -> (inputs, lengths or None: random in the allowed range))
    "chain": (LinearChainCRF.program.text, lambda g: (dict(edge=potentials(g, 4, 2, 2)), None)),
    "emission": (EmissionCRF.program.text, lambda g: (dict(
        start=potentials(g, 2, batch=1), emit=potentials(g, 5, 2), trans=potentials(g, 2, 2, batch=1),
        end=potentials(g, 2, batch=1)), None)),
    "hops": (HopChainCRF.program.text, lambda g: (dict(theta=potentials(g, 3, 3, 3)), None)),
    "semimarkov": (SemiMarkovCRF.program.text, lambda g: (dict(seg=potentials(g, 4, 2, 2, 2)), None)),
    "projective multi-root": (_MULTI_ROOT, lambda g: (dict(arc=potentials(g, 5, 5)), None)),
    "projective single-root": (_SINGLE_ROOT, lambda g: (dict(arc=potentials(g, 5, 5)), None)),
    "brackets (tour)": (BRACKETS.text, lambda g: (dict(span=potentials(g, 4, 4)), None)),
    "eisner": (EISNER, lambda g: (dict(arc=potentials(g, 4, 4)), None)),
    "cky": (CKY, lambda g: (dict(word=potentials(g, 4), rule=potentials(g, 5, 5)), None)),
    "pcfg": (PCFG, lambda g: (dict(term=potentials(g, 4, 2), rule=potentials(g, 2, 2, 2, batch=1)), None)),
    "pcfg by hand": (PCFG_BY_HAND, lambda g: (dict(term=potentials(g, 4, 2), rule=potentials(g, 2, 2, 2, batch=1)), None)),
    "alignment (n, m)": (ALIGNMENT, lambda g: (dict(a=potentials(g, 3, 4), b=potentials(g, 3, 4), c=potentials(g, 3, 4)),
                                              {"n": torch.randint(0, 3, (B,), generator=g), "m": torch.randint(0, 4, (B,), generator=g)})),
    "ctc (lookup)": (CTC, ctc),
    "a chain read backwards (two phases)": (READ_BACKWARDS, lambda g: (dict(
        a=potentials(g, 4), b=potentials(g, 4), c=potentials(g, 4)), None)),
}

SEMIRINGS = [sr.Log, sr.Max, sr.KMax(3), sr.Count, sr.Real]


@pytest.mark.parametrize("semiring", SEMIRINGS, ids=str)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_compiled_program_equals_the_reference_interpreter(name, semiring):
    text, make = PROGRAMS[name]
    g = torch.Generator().manual_seed(7)
    inputs, lengths = make(g)
    program = sr.program(text)
    if semiring is sr.Count:  # counts of structures: every entry allowed, or forbidden
        inputs = {k: torch.where(v.isfinite(), 0.0, v) if v.dtype.is_floating_point else v for k, v in inputs.items()}
    if lengths is None and program.syntax.lengths:
        _, shapes = program.shapes(inputs)
        allowed = program.lengths_allowed(shapes)
        lengths = torch.from_numpy(allowed[torch.randint(len(allowed), (B,), generator=g).numpy()])
    got = program(semiring, lengths=lengths, **inputs)
    expected = interpret(text, semiring, lengths=lengths, **inputs)
    if semiring is sr.Count:
        assert torch.equal(got, expected)
    else:
        assert_close(got, expected)


def test_the_interpreter_refuses_a_cycle():
    with pytest.raises(ValueError, match="depends on itself"):
        interpret("x[i] = a[i]\nx[i] += y[i]\ny[i] += x[i]\ngoal += x[n-1]", sr.Log, a=torch.zeros(1, 3))


@pytest.mark.parametrize("text", ["p[0] = a[0]\np[i] += p[i-1]\ngoal += p[n-1]",
                                  "goal += x[k] for k in 0..n"])
def test_the_interpreter_refuses_a_program_nothing_bounds(text):
    with pytest.raises(ValueError, match="edge of the interpreter's box"):
        interpret(text, sr.Log, a=torch.zeros(1, 3), x=torch.zeros(1, 3), y=torch.zeros(1, 3))


def test_sibling_rules_run_as_one_step_with_positive_strides():
    """Eisner's two complete-span rules (``C[s, t, R]``, ``C[s, t, L]``) are one fused step at every
    level where both fire; the arena orders the charts' buffers so that every stride is positive
    (the values of fused runs are the interpreter's: the test above)."""
    from semiring.language.fuse import Fused

    plan = sr.program(_MULTI_ROOT).plan({"arc": (6, 6)})
    fused = [step for level in plan.fused for step in level if isinstance(step.form, Fused)]
    both = [level for level in plan.levels if sum(str(s.form.rule.head).startswith("C[s, t") for s in level) == 2]
    assert len(fused) == len(both) > 0
    for step in fused:
        assert step.sizes[0] == 2
        assert all(s >= 0 for v in [*step.reads, *step.heads] if v is not None for s in v.strides)
        assert all(v.strides[0] > 0 for v in step.heads)


def test_a_chart_computed_along_diagonals_holds_each_level_adjacent():
    """An alignment's chart ``A[i, j]`` is computed a level ``i + j`` at a time and no rule sums over
    it, so its buffer holds it level by level (``A[i + j, i]``): every step writes its items and
    reads the chart's at stride 1, where row-major ``A[i, j]`` put each on a cache line of its own.
    The values are the interpreter's (the tests above)."""
    plan = sr.program(ALIGNMENT).plan({x: (6, 9) for x in "abc"})
    steps = [step for level in plan.levels for step in level if step.sizes and step.sizes[0] > 1]
    assert steps
    for step in steps:
        charts = [v for v in [*step.reads, *step.heads] if v is not None and v.source == "A"]
        assert charts and all(v.strides == (1,) and not v.gather for v in charts)
    assert plan.size["A"] == (6 + 9 - 1) * 6
