"""The C kernel of the Log semiring's levels (:mod:`semiring.language.kernel`) computes what the
torch calls compute, and what the reference interpreter computes: values and gradients of every
program of the suite, float64 and float32, with random lengths and forbidden (-inf) entries; and it
is the path the CPU takes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

import semiring as sr
from semiring import cpu_scan
from semiring.language import execute, kernel
from semiring.language.reference import interpret
from structures import ConstituencyCRF, LinearChainCRF, ProjectiveDependencyCRF
from structures.alignment import _PROGRAMS as _ALIGNMENTS
from structures.projective import _MULTI_ROOT
from test_reference import B, PCFG, PROGRAMS, potentials

pytestmark = pytest.mark.skipif(kernel._kernel is None, reason="the optional C extension is not built")


def run(name: str, dtype: torch.dtype):
    """(text, inputs, lengths) of a program of test_reference, floating inputs in ``dtype``."""
    text, make = PROGRAMS[name]
    g = torch.Generator().manual_seed(11)
    inputs, lengths = make(g)
    program = sr.program(text)
    if lengths is None and program.syntax.lengths:
        _, shapes = program.shapes(inputs)
        allowed = program.lengths_allowed(shapes)
        lengths = torch.from_numpy(allowed[torch.randint(len(allowed), (B,), generator=g).numpy()])
    inputs = {k: v.to(dtype) if v.dtype.is_floating_point else v for k, v in inputs.items()}
    return text, inputs, lengths


def value_and_gradients(text, inputs, lengths, semiring=sr.Log):
    floats = {k: v.clone().requires_grad_() for k, v in inputs.items() if v.dtype.is_floating_point}
    out = sr.program(text)(semiring, lengths=lengths, **{**inputs, **floats})
    grads = torch.autograd.grad(out[out.isfinite()].sum(), list(floats.values()), allow_unused=True)
    return out.detach(), [torch.zeros_like(x) if g is None else g for x, g in zip(floats.values(), grads)]


@pytest.mark.parametrize("semiring", [sr.Log, sr.Max], ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_kernel_equals_the_torch_calls_and_the_interpreter(name, dtype, semiring):
    """Log: values and gradients (marginals); Max: values and the gradient (the best structure,
    ties to the first rule and the first instance, as the torch calls break them)."""
    text, inputs, lengths = run(name, dtype)
    value, grads = value_and_gradients(text, inputs, lengths, semiring)
    with kernel.disabled():
        value_torch, grads_torch = value_and_gradients(text, inputs, lengths, semiring)
    tolerance = {} if dtype is torch.float64 else dict(rtol=1e-5, atol=1e-5)
    assert_close(value, value_torch, **tolerance)
    for g, gt in zip(grads, grads_torch):
        assert_close(g, gt, **tolerance)
    expected = interpret(text, semiring, lengths=lengths, **{k: v.double() if v.dtype.is_floating_point else v for k, v in inputs.items()})
    assert_close(value.double(), expected, **tolerance)


def test_max_ties_go_to_the_first_rule_and_instance_as_in_the_torch_calls():
    """Integer-valued scores make ties everywhere: the kernel's best structure is the torch calls'."""
    g = torch.Generator().manual_seed(3)
    for text, shape in ((_MULTI_ROOT, (4, 7, 7)), (ConstituencyCRF.program.text, (4, 6, 6, 2))):
        x = torch.randint(-2, 2, shape, generator=g).double()
        value, (grad,) = value_and_gradients(text, dict(arc=x) if len(shape) == 3 else dict(score=x), None, sr.Max)
        with kernel.disabled():
            value_torch, (grad_torch,) = value_and_gradients(text, dict(arc=x) if len(shape) == 3 else dict(score=x), None, sr.Max)
        assert torch.equal(value, value_torch) and torch.equal(grad, grad_torch)


@pytest.mark.parametrize("name", ["projective multi-root", "cky", "ctc (lookup)", "alignment (n, m)"])
def test_the_cpu_runs_every_level_in_the_kernel(name, monkeypatch):
    """Every level of Eisner's, CKY's, CTC's (positions looked up from data, as docs/language.md
    writes it) and alignment's programs is packed for the kernel (none falls back to torch calls),
    and a run on the CPU binds it, int32 indices too."""
    text, inputs, lengths = run(name, torch.float64)
    inputs = {k: v.int() if not v.dtype.is_floating_point else v for k, v in inputs.items()}
    bound = []
    bind = kernel.bind
    monkeypatch.setattr(kernel, "bind", lambda *args, **kwargs: bound.append(bind(*args, **kwargs)) or bound[-1])
    program = sr.program(text)
    program(sr.Log, lengths=lengths, **inputs)
    (plan,) = program._plans.values()
    assert all(d is not None for d in plan.packed.forward + plan.packed.backward)
    assert bound and all(b is not None for b in bound)
    with kernel.disabled():
        assert not kernel.available()
    assert kernel.available()


def test_a_stretch_of_levels_is_one_call_each_way(monkeypatch):
    """A run whose levels all run in C crosses from Python into the kernel once forward and once
    backward (a level per call cost microseconds each), with the bits of one call per level."""
    x = torch.randn(3, 9, 4, 4, dtype=torch.float64)
    calls = []
    for name in ("forward", "backward"):
        inner = getattr(kernel._kernel, name)
        monkeypatch.setattr(kernel._kernel, name, lambda *a, _f=inner, _n=name: calls.append(_n) or _f(*a), raising=False)
    crf = LinearChainCRF(x)  # (9 positions: a chain below SCAN_LEVELS runs level by level in the kernel)
    got = crf.log_partition, crf.marginals
    assert calls == ["forward", "forward", "backward"]
    monkeypatch.undo()
    per_level, packed = [], []

    def one_level_at_a_time(self, lev):
        packed.append(sum(d is not None for d in self.levels.forward))
        end = self.end[lev]
        for d in self.levels.forward[lev:end]:
            kernel._kernel.forward(self.max, self.double, self.batch, self.threads, self.table, d)
            per_level.append(d)
        return end - lev

    monkeypatch.setattr(kernel.Bound, "forward", one_level_at_a_time)
    assert torch.equal(LinearChainCRF(x).log_partition, got[0])
    assert packed == [len(per_level)] and len(per_level) > 2


def test_malformed_stretches_are_refused():
    table, level = np.zeros((1, 2), dtype=np.int64), np.zeros(1, dtype=np.int64)  # a level of no steps
    kernel._kernel.forward(False, True, 1, 1, table, level, np.array([0, 1], dtype=np.int64))
    for starts in ([0, 2], [1, 0], [-1, 1]):
        with pytest.raises(ValueError, match="malformed"):
            kernel._kernel.forward(False, True, 1, 1, table, level, np.array(starts, dtype=np.int64))


def test_the_kernel_gives_exact_gradients_in_float64():
    arc = torch.randn(2, 6, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: ProjectiveDependencyCRF(a).partition, (arc,))
    span = torch.randn(2, 5, 5, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: ConstituencyCRF(s).partition, (span,))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_extreme_entries_give_what_the_torch_calls_give(dtype):
    """-inf everywhere (no structure), +inf, NaN and huge magnitudes."""
    base = torch.randn(4, 6, 6, dtype=dtype) * 50
    base[0] = -math.inf
    base[1, 2, 3] = math.inf
    base[2, 1, 4] = math.nan
    base[3] *= 1e30 if dtype is torch.float64 else 1e5
    eisner = sr.program(_MULTI_ROOT)
    batch, shapes = eisner.shapes({"arc": base})

    def run(scores):  # Program.run: a call refuses NaN (a ValueError), a structure not validating does not
        return eisner.run(sr.Log, {"arc": sr.Log.convert(scores)}, None, batch, shapes)

    for scores in (base, base.clamp(-1e3, 1e3)):
        got = run(scores)
        with kernel.disabled():
            expected = run(scores)
        assert_close(got, expected, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_the_kernel_exp_is_exact_over_its_whole_range(dtype):
    """The kernel's own vector exp, seen through ``goal += a[k]`` (log Σ exp) on rows ``[0, d, ...]``:
    values and gradients (the softmax) as torch's in float64, for differences d from -1e4 to 0, one
    row of 97 evenly spaced differences per example."""
    d = torch.cat([-torch.logspace(-8, 4, 200, dtype=torch.float64), torch.tensor([0.0, -87.0, -87.5, -88.5, -700.0, -708.5, -745.0])])
    a = torch.stack([d, torch.zeros_like(d)], -1)
    a = torch.cat([a, torch.linspace(-110, 0, 97, dtype=torch.float64).expand(3, -1)[:, :2] + 0], 0)
    a = a.to(dtype).requires_grad_()
    got = sr.program("goal += a[k]")(sr.Log, a=a)
    (grad,) = torch.autograd.grad(got.sum(), a)
    exact = a.detach().double().requires_grad_()
    expected = torch.logsumexp(exact, -1)
    (grad_expected,) = torch.autograd.grad(expected.sum(), exact)
    tol = dict(rtol=1e-15, atol=1e-15) if dtype is torch.float64 else dict(rtol=1e-5, atol=1e-6)  # (float32: the item, rounded, enters every weight)
    assert_close(got.double(), expected, **tol)
    assert_close(grad.double(), grad_expected, **tol)
    spread = torch.linspace(-120, 0, 97, dtype=torch.float64).reshape(1, -1).to(dtype)
    assert_close(sr.program("goal += a[k]")(sr.Log, a=spread).double(), torch.logsumexp(spread.double(), -1), **tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_the_kernel_logaddexp_is_exact(dtype):
    """Two rules writing the same items without a sum (the second ⊕-ed into the first's, as CTC's
    three moves are): torch.logaddexp's values and gradients, over differences from 0 to -1e4 and
    infinite entries."""
    d = torch.cat([-torch.logspace(-8, 4, 300, dtype=torch.float64), torch.tensor([0.0, -math.inf, math.inf])])
    g = torch.Generator().manual_seed(0)
    a = torch.stack([torch.randn(len(d), generator=g, dtype=torch.float64) * 30, torch.zeros(len(d), dtype=torch.float64)], -1)
    b = a + torch.stack([d, d], -1)
    b[-1, 0] = -math.inf  # (both -inf in the last row's first item)
    a[-1, 0] = -math.inf
    a, b = a.to(dtype).requires_grad_(), b.to(dtype).requires_grad_()
    both = sr.program("x[i] = a[i]\nx[i] += b[i]\ngoal += x[0] * x[1]")
    got = both(sr.Log, a=a, b=b)
    ga, gb = torch.autograd.grad(got[got.isfinite()].sum(), (a, b))
    exact_a, exact_b = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    expected = torch.logaddexp(exact_a, exact_b).sum(-1)
    ea, eb = torch.autograd.grad(expected[expected.isfinite()].sum(), (exact_a, exact_b))
    tol = dict(rtol=1e-14, atol=1e-14) if dtype is torch.float64 else dict(rtol=1e-5, atol=1e-5)  # (float32: the rounded item enters the weights)
    assert_close(got.double(), expected, equal_nan=True, **tol)  # (the last row: -inf + inf)
    assert_close(ga.double()[:-1], ea[:-1], **tol)  # (torch.logaddexp's gradient at two -inf is nan)
    assert_close(gb.double()[:-1], eb[:-1], **tol)
    assert ga[-1].isfinite().all() and gb[-1].isfinite().all()


_ALIGNMENT = _ALIGNMENTS["many_to_many"]


def _large(name: str, g: torch.Generator) -> tuple[str, dict, object]:
    """(text, inputs, lengths) of a program at sizes whose stretches of levels split the batch across
    two threads (B x instances >= 2 x the kernel's grain; the alignment's levels are each below it):
    random lengths, -inf entries, and for the PCFG a rule tensor shared by the batch (its gradient,
    written by every example, keeps those levels on one thread)."""
    B = 8
    if name == "alignment":
        lengths = {"n": torch.randint(1, 41, (2 * B,), generator=g), "m": torch.randint(1, 45, (2 * B,), generator=g)}
        return _ALIGNMENT.text, dict(score=potentials(g, 40, 44, batch=2 * B)), lengths
    if name == "chain":
        return LinearChainCRF.program.text, dict(edge=potentials(g, 24, 64, 64, batch=B)), torch.randint(1, 26, (B,), generator=g)
    if name == "projective":
        return _MULTI_ROOT, dict(arc=potentials(g, 40, 40, batch=4 * B)), torch.randint(1, 40, (4 * B,), generator=g)
    if name == "constituency":
        return ConstituencyCRF.program.text, dict(score=potentials(g, 30, 30, 8, batch=B)), torch.randint(1, 31, (B,), generator=g)
    return PCFG, dict(term=potentials(g, 24, 12, batch=B), rule=potentials(g, 12, 12, 12, batch=1)), torch.randint(1, 25, (B,), generator=g)


@pytest.mark.skipif(kernel._kernel is None or not kernel._kernel.threaded, reason="the kernel is built without threads")
@pytest.mark.parametrize("semiring", [sr.Log, sr.Max], ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("name", ["chain", "projective", "constituency", "pcfg", "alignment"])
def test_two_threads_give_the_numbers_of_one(name, dtype, semiring):
    """The batch split across threads: values and gradients bit-identical to one thread's."""
    text, inputs, lengths = _large(name, torch.Generator().manual_seed(5))
    inputs = {k: v.to(dtype) for k, v in inputs.items()}
    was = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = value_and_gradients(text, inputs, lengths, semiring)
        torch.set_num_threads(2)
        two = value_and_gradients(text, inputs, lengths, semiring)
    finally:
        torch.set_num_threads(was)
    program = sr.program(text)
    program(semiring, lengths=lengths, **inputs)
    (plan,) = program._plans.values()
    assert sum(plan.packed.work) * next(iter(inputs.values())).shape[0] >= 2 * kernel._kernel.GRAIN  # (the stretch does split)
    assert torch.equal(one[0], two[0])
    assert all(torch.equal(a, b) for a, b in zip(one[1], two[1]))


@pytest.mark.parametrize("semiring", [sr.Log, sr.Max], ids=str)
@pytest.mark.parametrize("name", ["chain", "projective", "constituency", "pcfg", "alignment"])
def test_parts_of_the_batch_that_fit_the_cache_give_the_numbers_of_one_pass(name, semiring):
    """One thread taking the batch a part at a time through a stretch of levels (a part's rows of
    the buffers within part_bytes(): here one example a part) gives the values and gradients of one
    pass over the whole batch per level, bit for bit."""
    text, inputs, lengths = _large(name, torch.Generator().manual_seed(6))
    was, threads = kernel._kernel.part_bytes(), torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        kernel._kernel.set_part_bytes(1 << 62)
        whole = value_and_gradients(text, inputs, lengths, semiring)
        kernel._kernel.set_part_bytes(1)
        parts = value_and_gradients(text, inputs, lengths, semiring)
    finally:
        kernel._kernel.set_part_bytes(was)
        torch.set_num_threads(threads)
    assert torch.equal(whole[0], parts[0])
    assert all(torch.equal(a, b) for a, b in zip(whole[1], parts[1]))
    with pytest.raises(ValueError, match="positive"):
        kernel._kernel.set_part_bytes(0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("isa", kernel._kernel.isas() if kernel._kernel else [])
def test_every_instruction_set_of_the_cpu_computes_what_the_torch_calls_compute(isa, dtype):
    """The kernel's code for each instruction set this CPU runs (SSE2, AVX2 with FMA, AVX-512):
    values and gradients of every program of the suite within the tolerances of the default one."""
    was = kernel._kernel.isa()
    tolerance = {} if dtype is torch.float64 else dict(rtol=1e-5, atol=1e-5)
    try:
        kernel._kernel.set_isa(isa)
        for name in PROGRAMS:
            text, inputs, lengths = run(name, dtype)
            value, grads = value_and_gradients(text, inputs, lengths)
            with kernel.disabled():
                value_torch, grads_torch = value_and_gradients(text, inputs, lengths)
            assert_close(value, value_torch, **tolerance)
            for g, gt in zip(grads, grads_torch):
                assert_close(g, gt, **tolerance)
    finally:
        kernel._kernel.set_isa(was)


def test_the_kernel_runs_the_best_instruction_set_of_the_cpu():
    assert kernel._kernel.isa() == kernel._kernel.isas()[-1]
    with pytest.raises(ValueError, match="isa"):
        kernel._kernel.set_isa("vax")


# ---------------------------------------------------------------- pairs: the Hessian-vector product


def hessian_vector_product(text, inputs, lengths) -> list[torch.Tensor]:
    """A loss on the marginals, backpropagated (structured attention's training step): ``∂⟨∂ log Z /
    ∂x, v⟩ / ∂x`` for every floating input x, v fixed and random."""
    floats = {k: v.clone().requires_grad_() for k, v in inputs.items() if v.dtype.is_floating_point}
    out = sr.program(text)(sr.Log, lengths=lengths, **{**inputs, **floats})
    grads = torch.autograd.grad(out[out.isfinite()].sum(), list(floats.values()), create_graph=True, allow_unused=True)
    g = torch.Generator().manual_seed(3)
    loss = sum((d * torch.randn(d.shape, generator=g, dtype=d.dtype)).sum() for d in grads if d is not None)
    hv = torch.autograd.grad(loss, list(floats.values()), allow_unused=True)
    return [torch.zeros_like(x) if h is None else h for x, h in zip(floats.values(), hv)]


def pair_steps_off(monkeypatch) -> None:
    """Runs on pairs take the torch calls, level by level (the path the kernel's pair steps replace)."""
    monkeypatch.setattr(execute, "PAIR_KERNELS", False)


def counted_pair_calls(monkeypatch) -> dict[str, int]:
    """Counts the calls of the kernel's pair passes."""
    calls = {"pair_forward": 0, "pair_backward": 0}
    native = kernel._kernel

    class Counting:
        def __getattr__(self, name):
            if name not in calls:
                return getattr(native, name)

            def call(*args):
                calls[name] += 1
                return getattr(native, name)(*args)

            return call

    monkeypatch.setattr(kernel, "_kernel", Counting())
    return calls


_PAIRED = ["chain", "hops", "semimarkov", "projective multi-root", "projective single-root", "brackets (tour)",
           "eisner", "cky", "alignment (n, m)", "a chain read backwards (two phases)"]
# (the others have inputs shared by the batch or lookups: their product re-runs the program under autograd)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("name", _PAIRED)
def test_a_loss_on_the_marginals_runs_in_the_kernels_pair_steps_as_the_torch_calls_run_it(name, dtype, monkeypatch):
    """The Hessian-vector product's passes on pairs (value, tangent) run every level in the kernel
    (one call each way per stretch) and give what the torch calls' pair levels give, with random
    lengths and forbidden (-inf) entries (float64: to rounding)."""
    text, inputs, lengths = run(name, dtype)
    with monkeypatch.context() as m:
        pair_steps_off(m)
        expected = hessian_vector_product(text, inputs, lengths)
    calls = counted_pair_calls(monkeypatch)
    got = hessian_vector_product(text, inputs, lengths)
    assert calls["pair_forward"] >= 1 and calls["pair_backward"] >= 1
    tolerance = dict(rtol=1e-10, atol=1e-10) if dtype is torch.float64 else dict(rtol=1e-4, atol=1e-4)
    for a, b in zip(got, expected):
        assert_close(a, b, **tolerance)


@pytest.mark.parametrize("isa", kernel._kernel.isas() if kernel._kernel else [])
def test_every_instruction_set_runs_the_pair_steps_alike(isa, monkeypatch):
    """The pair steps compiled for each instruction set this CPU runs give the torch calls' numbers."""
    was = kernel._kernel.isa()
    try:
        kernel._kernel.set_isa(isa)
        for name in ["projective single-root", "cky", "semimarkov"]:
            for dtype in (torch.float64, torch.float32):
                text, inputs, lengths = run(name, dtype)
                with monkeypatch.context() as m:
                    pair_steps_off(m)
                    expected = hessian_vector_product(text, inputs, lengths)
                got = hessian_vector_product(text, inputs, lengths)
                tolerance = dict(rtol=1e-10, atol=1e-10) if dtype is torch.float64 else dict(rtol=1e-4, atol=1e-4)
                for a, b in zip(got, expected):
                    assert_close(a, b, **tolerance)
    finally:
        kernel._kernel.set_isa(was)


@pytest.mark.skipif(kernel._kernel is None or not kernel._kernel.threaded, reason="the kernel is built without threads")
@pytest.mark.parametrize("name", ["projective", "constituency"])
def test_two_threads_give_the_pair_steps_numbers_of_one(name):
    """The pair passes split the batch across threads as the first-order ones do, bit for bit."""
    text, inputs, lengths = _large(name, torch.Generator().manual_seed(7))
    inputs = {k: v.double() for k, v in inputs.items()}
    was = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = hessian_vector_product(text, inputs, lengths)
        torch.set_num_threads(2)
        two = hessian_vector_product(text, inputs, lengths)
    finally:
        torch.set_num_threads(was)
    assert all(torch.equal(a, b) for a, b in zip(one, two))


@pytest.mark.skipif(not cpu_scan.enabled, reason="the C scan is not built")
def test_a_level_is_packed_when_a_run_first_takes_it():
    """The kernel packs a level when first a run takes it: none of a chain's levels the C scan runs;
    a later run of the same plan without the scan packs them (its table then names what they
    read), and both runs give the torch calls' values and marginals."""
    g = torch.Generator().manual_seed(3)
    inputs = dict(edge=potentials(g, 2 * execute.SCAN_LEVELS, 4, 4, batch=3))
    lengths = torch.tensor([2 * execute.SCAN_LEVELS + 1, 9, 1])
    program = sr.program(LinearChainCRF.program.text)

    def value_and_marginals():
        edge = inputs["edge"].clone().requires_grad_()
        out = program(sr.Log, lengths=lengths, edge=edge)
        return out.detach(), torch.autograd.grad(out.sum(), edge)[0]

    scanned = value_and_marginals()
    (plan,) = program._plans.values()
    in_scans = {lev for scan in plan.scans.values() for lev in range(scan.start, scan.stop)}
    assert in_scans and all(plan.packed.forward[lev] is None for lev in in_scans)
    with cpu_scan.enabled.to(False):
        levels = value_and_marginals()
    assert all(plan.packed.forward[lev] is not None for lev in in_scans)
    with kernel.disabled():
        expected = value_and_marginals()
    for got in (scanned, levels):
        assert_close(got[0], expected[0])
        assert_close(got[1], expected[1])
