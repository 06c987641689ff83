"""The Triton kernels of the Log and Max levels (:mod:`semiring.language.triton_levels`) compute what
the torch calls compute: values and gradients (marginals; Max: the best structure) of every program
of the suite and of every program structure, with random lengths and forbidden (-inf) entries, and
a run of a program (its levels looked up from data too) is one launch forward and one backward.

Marked ``triton``; skipped where Triton is not installed. Without a CUDA device the kernels run in
Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``, which conftest.py sets before torch
imports Triton)."""

from __future__ import annotations

import importlib.util
import math
import os
from contextlib import ExitStack, contextmanager

import pytest
import torch
from torch.testing import assert_close

import semiring as sr
from semiring.language import kernel, triton_levels
from structures import ConstituencyCRF, ProjectiveDependencyCRF
from structures.projective import _MULTI_ROOT
from test_cuda import BUILDERS
from test_kernel import hessian_vector_product, pair_steps_off, run, value_and_gradients
from test_reference import PROGRAMS

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")

pytestmark = [pytest.mark.triton,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # (the interpreter's numpy: log(0), inf - inf)
              pytest.mark.skipif(not CUDA and os.environ.get("TRITON_INTERPRET") != "1", reason="no CUDA and no interpreter"),
              pytest.mark.skipif(CUDA and os.environ.get("TRITON_INTERPRET") == "1",
                                 reason="TRITON_INTERPRET=1 beside a GPU: the interpreter cannot read device buffers")]


@contextmanager
def on_triton():
    """Runs inside take the Triton kernels (in the interpreter, on CPU tensors, without CUDA)."""
    with ExitStack() as stack:
        if not CUDA:
            stack.enter_context(triton_levels.interpreted())
        yield


@contextmanager
def on_torch():
    with kernel.disabled(), triton_levels.disabled():
        yield


def launches(monkeypatch, module=None) -> list[tuple]:
    """The kernels' launches from now on: (forward or backward, "pair forward" or "pair backward" on
    pairs, then the last three arguments: for the levels' kernels first level, last level + 1, the
    only step run or -1: all); ``module``: of other kernels named forward and backward (the scan's)."""
    seen = []
    module = module or triton_levels._kernels()
    for name in ("forward", "backward"):
        fn = getattr(module, name)

        class Counted:
            def __init__(self, fn, name):
                self.fn, self.name = fn, name

            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    seen.append(("pair " * bool(kwargs.get("PAIRS")) + self.name, *args[-3:]))
                    return self.fn[grid](*args, **kwargs)
                return launch

        monkeypatch.setattr(module, name, Counted(fn, name))
    return seen


def _to(inputs: dict, device) -> dict:
    return {k: v.to(device) for k, v in inputs.items()}


def on_device(name: str, dtype: torch.dtype = torch.float64):
    """(text, inputs, lengths) of a program of test_reference (:func:`test_kernel.run`) on DEVICE."""
    text, inputs, lengths = run(name, dtype)
    lengths = None if lengths is None else _to(lengths, DEVICE) if isinstance(lengths, dict) else lengths.to(DEVICE)
    return text, _to(inputs, DEVICE), lengths


def compare(name: str, semiring, monkeypatch, dtype: torch.dtype = torch.float64) -> list:
    """A program's value and gradients through the Triton kernels equal the torch calls'; returns the launches."""
    text, inputs, lengths = on_device(name, dtype)
    seen = launches(monkeypatch)
    with on_triton():
        value, grads = value_and_gradients(text, inputs, lengths, semiring)
    with on_torch():
        value_torch, grads_torch = value_and_gradients(text, inputs, lengths, semiring)
    tolerance = {} if dtype is torch.float64 else dict(rtol=1e-5, atol=1e-5)
    assert_close(value, value_torch, **tolerance)
    for g, gt in zip(grads, grads_torch):
        assert_close(g, gt, **tolerance)
    return seen


@pytest.mark.parametrize("semiring", [sr.Log, sr.Max], ids=str)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_every_program_equals_the_torch_calls(name, semiring, monkeypatch):
    """Log: values and gradients; Max: values and the gradient (the best structure, ties to the
    first rule and the first instance, as the torch calls break them), float64."""
    seen = compare(name, semiring, monkeypatch)
    assert {kind for kind, *_ in seen} == {"forward", "backward"}, "the kernels ran"


@pytest.mark.parametrize("name", ["projective multi-root", "cky", "semimarkov"])
def test_float32_equals_the_torch_calls(name, monkeypatch):
    compare(name, sr.Log, monkeypatch, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("name", ["cky", "semimarkov", "hops", "brackets (tour)"])
def test_a_loss_on_the_marginals_runs_its_pairs_in_the_kernels(name, dtype, monkeypatch):
    """A Hessian-vector product's passes on pairs (value, tangent) launch the kernels on pairs and
    give what the torch calls' pair levels give, with random lengths and -inf entries."""
    text, inputs, lengths = on_device(name, dtype)
    with monkeypatch.context() as m:
        pair_steps_off(m)
        with on_triton():
            expected = hessian_vector_product(text, inputs, lengths)
    seen = launches(monkeypatch)
    with on_triton():
        got = hessian_vector_product(text, inputs, lengths)
    assert {kind for kind, *_ in seen} == {"forward", "backward", "pair forward", "pair backward"}
    tolerance = dict(rtol=1e-10, atol=1e-10) if dtype is torch.float64 else dict(rtol=1e-4, atol=1e-4)
    for a, b in zip(got, expected):
        assert_close(a, b, **tolerance)


PROGRAM_STRUCTURES = {name: build for name, build in BUILDERS.items() if name not in ("nonprojective", "nonprojective-single-root")}


@pytest.mark.parametrize("build", PROGRAM_STRUCTURES.values(), ids=PROGRAM_STRUCTURES.keys())
def test_every_structure_equals_the_torch_calls(build):
    """log Z, the marginals (its gradient), the best score and the best structure (the Max gradient)."""
    answers = []
    for context in (on_triton, on_torch):
        make, _ = build(DEVICE)
        with context():
            d = make()
            answers.append([d.log_partition.detach(), d.marginals.detach(), d.max.detach(), d.argmax.detach()])
    for got, expected, query in zip(*answers, ("log_partition", "marginals", "max", "argmax")):
        assert_close(got, expected, msg=query)


def _value_and_gradient(semiring, x, context):
    """Through Program.run: a call refuses NaN entries (a ValueError), a structure not validating does not."""
    a = x.to(DEVICE).requires_grad_()
    program = sr.program(_MULTI_ROOT)
    batch, shapes = program.shapes({"arc": a})
    with context():
        value = program.run(semiring, {"arc": semiring.convert(a)}, None, batch, shapes)
        return value.detach(), torch.autograd.grad(value[value.isfinite()].sum(), a)[0]


@pytest.mark.parametrize("semiring", [sr.Log, sr.Max], ids=str)
def test_extreme_entries_give_what_the_torch_calls_give(semiring):
    """Values: -inf everywhere (no structure), +inf, NaN, magnitudes of 1e30; gradients where the
    entries are -inf or finite and below 1e4 (at +inf, NaN or 1e30, where float64 absorbs every
    other score, the C kernel's gradients are not the torch calls' either: the kernels recompute the
    weights exp(terms - item), which a tie of n terms at 1e30 makes n times 1)."""
    base = torch.randn(5, 6, 6, dtype=torch.float64) * 50
    base[0] = -math.inf
    base[1, 2, 3] = math.inf
    base[2, 1, 4] = math.nan
    base[3] *= 1e30
    base[4, 0, 2], base[4, 3, 1], base[4, 5, 2] = 1e4, -1e4, -math.inf
    (value, _), (expected, _) = (_value_and_gradient(semiring, base, c) for c in (on_triton, on_torch))
    assert_close(value, expected, equal_nan=True)
    finite = base[[0, 3, 4]]
    (value, grad), (expected, grad_expected) = (_value_and_gradient(semiring, finite, c) for c in (on_triton, on_torch))
    assert_close(value, expected)
    assert_close(grad, grad_expected)


@pytest.mark.parametrize("name", ["projective multi-root", "cky", "ctc (lookup)", "alignment (n, m)"])
def test_every_level_of_a_run_is_one_launch(name, monkeypatch):
    """Every level of Eisner's, CKY's, CTC's and alignment's programs is packed, lookups from data
    included: a value and its gradient are one launch each."""
    text, inputs, lengths = on_device(name)
    inputs = {k: v.requires_grad_() if v.dtype.is_floating_point else v for k, v in inputs.items()}
    program = sr.program(text)
    seen = launches(monkeypatch)
    with on_triton():
        floats = [x for x in inputs.values() if x.requires_grad]
        torch.autograd.grad(program(sr.Log, lengths=lengths, **inputs).sum(), floats)
    (plan,) = program._plans.values()
    levels = len(plan.fused) + 1  # (the goal's level last)
    assert seen == [("forward", 0, levels, -1), ("backward", 0, levels, -1)]


@pytest.mark.parametrize("name, semiring", [("projective single-root", sr.Log), ("projective single-root", sr.Max),
                                             ("pcfg", sr.Max), ("ctc (lookup)", sr.Log)], ids=str)
def test_levels_split_over_programs_give_the_same(name, semiring, monkeypatch):
    """With every level a stretch of its own, a step per launch, its items spread over programs (as
    large levels run): the torch calls' values and gradients, several rules writing one item included."""
    monkeypatch.setattr(triton_levels, "BI", 2)
    monkeypatch.setattr(triton_levels, "SPLIT", 0)
    seen = compare(name, semiring, monkeypatch)
    assert seen and all(last == first + 1 and only >= 0 for _, first, last, only in seen)


def test_the_kernels_apply_to_log_and_max_only():
    x = [torch.randn(2, 3, device=DEVICE)]
    with on_triton():
        assert triton_levels.applies(sr.Log, x) and triton_levels.applies(sr.Max, x)
        assert not triton_levels.applies(sr.Real, x) and not triton_levels.applies(sr.Log, [x[0].half()])
    with on_torch():
        assert not triton_levels.applies(sr.Log, x)


COMPILE = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from semiring.language import _triton_kernels as kernels, triton_levels as levels
for name, buffers in (("forward", ["table"]), ("backward", ["table", "gtable"])):
    for dtype, lowest in ((tl.float32, -3.4028234663852886e38), (tl.float64, -1.7976931348623157e308)):
        for is_max, pairs in ((False, False), (True, False), (False, True)):
            for bi, bk in ((levels.BI, levels.BK), (levels.POINTWISE_BI, 1)):
                atomics = {"SEM": levels.ATOMICS} if name == "backward" else {}
                constants = dict(IS_MAX=is_max, DTYPE=dtype, LOWEST=lowest, BI=bi, BK=bk, **atomics, PAIRS=pairs)
                signature = {"desc": "*i64", "starts": "*i64", **{b: "*i64" for b in buffers}, "S": "i32", "first": "i32",
                             "last": "i32", "only": "i32", **{c: "constexpr" for c in constants}}
                compiled = triton.compile(ASTSource(getattr(kernels, name), signature, constants), target=GPUTarget("cuda", 90, 32))
                assert len(compiled.asm["cubin"]) > 0
print("compiled")
"""


def test_the_kernels_compile_for_an_h100_without_one():
    """The interpreter runs Python, not the compiler: every kernel (forward and backward, Log, Max
    and Log on pairs, float32 and float64, both tiles) also compiles to a cubin for sm_90 (Triton's
    own ptxas, no GPU needed)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
