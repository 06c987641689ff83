"""The C scan (:mod:`semiring.cpu_scan`) computes what the torch calls of ``Semiring.scan`` compute, in
the Log and Max semirings: the states of every step and the gradients of the initial state, the
matrices and the unaries (Max: the backtrace, to the same bits), for a matrix per step and example
and one matrix for every step and example, with and without unaries, forbidden (-inf) transitions and
states no path reaches, float32 and float64, on every instruction set the CPU runs and any number of
threads; a chain program runs its whole chain in one call each way; and float32 marginals of a
long chain stay close to float64's."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import semiring as sr
from semiring import cpu_scan
from semiring.language import kernel
from semiring.language.execute import SCAN_LEVELS
from structures import EmissionCRF, LinearChainCRF
from scans import SHAPES, scan_inputs, states_and_gradients

pytestmark = pytest.mark.skipif(not cpu_scan.enabled, reason="the C scan was not built")

def run(semiring, init, xs, u, native: bool, weighting: str = "every state"):
    """The states, and the gradients of (init, xs, u) against a weighting of the states."""
    def check(*leaves):
        assert cpu_scan.applies(*leaves) == native

    with cpu_scan.enabled.to(native):
        return states_and_gradients(semiring, init, xs, u, weighting, check)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("unary", [True, False])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_log_scan_gives_the_torch_calls_values_and_gradients(shape, unary, dtype):
    inputs = scan_inputs(shape, unary, dtype)
    (a, grads), (a0, grads0) = run(sr.Log, *inputs, native=True), run(sr.Log, *inputs, native=False)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    assert_close(a, a0, **tol)
    assert torch.isneginf(a[:, :, 4]).all()
    for g, g0 in zip(grads, grads0):
        assert_close(g, g0, **tol)


@pytest.mark.parametrize("weighting", ["every state", "one end state"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("unary", [True, False])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_max_scan_gives_the_torch_calls_bits(shape, unary, dtype, weighting):
    inputs = scan_inputs(shape, unary, dtype)
    (a, grads), (a0, grads0) = (run(sr.Max, *inputs, native=n, weighting=weighting) for n in (True, False))
    assert torch.equal(a, a0)
    for i, (g, g0) in enumerate(zip(grads, grads0)):
        if i == 1 and shape == "one matrix for every step and example":  # summed over examples and steps in another order
            assert_close(g, g0)
        else:
            assert torch.equal(g, g0)


@pytest.mark.parametrize("semiring", [sr.Log, sr.Max], ids=["Log", "Max"])
def test_every_instruction_set_and_thread_count_gives_the_same_numbers(semiring):
    inputs = scan_inputs("a matrix per step and example", True, torch.float32, B=8, T=300, K=16)  # B T K^2 > 2 threads' grain
    first = cpu_scan._scan.isa()
    threads = torch.get_num_threads()
    # Log against float64 (float32's torch calls are the less exact), Max against float32's bits
    expected = run(semiring, *[t.double() if semiring is sr.Log else t for t in inputs], native=False)
    try:
        for isa in ["sse2", "avx2+fma", "avx512", "generic"]:
            try:
                cpu_scan._scan.set_isa(isa)
            except ValueError:  # not this CPU's
                continue
            torch.set_num_threads(1)
            one = run(semiring, *inputs, native=True)
            torch.set_num_threads(3)
            three = run(semiring, *inputs, native=True)
            for x, y, z in zip([one[0], *one[1]], [three[0], *three[1]], [expected[0], *expected[1]]):
                assert torch.equal(x, y)  # each example is computed as on one thread
                if semiring is sr.Max:
                    assert torch.equal(x, z)
                else:
                    assert_close(x, z.float(), rtol=1e-5, atol=1e-4)
    finally:
        cpu_scan._scan.set_isa(first)
        torch.set_num_threads(threads)


class Calls:
    """Counts the C scan's calls each way."""

    def __init__(self, monkeypatch):
        self.forward = self.backward = 0
        native = cpu_scan._scan

        class Counted:
            PAD_TO = native.PAD_TO

            @staticmethod
            def forward(*args):
                self.forward += 1
                return native.forward(*args)

            @staticmethod
            def backward(*args):
                self.backward += 1
                return native.backward(*args)

        monkeypatch.setattr(cpu_scan, "_scan", Counted)


@pytest.mark.parametrize("structure", ["LinearChainCRF", "EmissionCRF"])
def test_a_chain_program_runs_its_chain_in_one_call_each_way(structure, monkeypatch):
    g = torch.Generator().manual_seed(1)
    if structure == "LinearChainCRF":
        x = torch.randn(2, 40, 4, 4, generator=g)
        make = LinearChainCRF
    else:
        x = torch.randn(2, 41, 4, generator=g)
        trans = torch.randn(4, 4, generator=g)
        make = lambda e: EmissionCRF(e, trans)  # noqa: E731
    calls = Calls(monkeypatch)
    marginals = make(x).marginals
    assert (calls.forward, calls.backward) == (1, 1)
    with kernel.disabled():
        assert_close(marginals, make(x).marginals, rtol=1e-5, atol=1e-6)
    assert (calls.forward, calls.backward) == (1, 1)  # the kernel's switch turns the scan off too


def test_a_short_chain_of_a_matrix_per_level_runs_in_the_kernel_level_by_level(monkeypatch):
    x = torch.randn(2, SCAN_LEVELS - 1, 4, 4, generator=torch.Generator().manual_seed(2))  # SCAN_LEVELS - 1 levels
    calls = Calls(monkeypatch)
    marginals = LinearChainCRF(x).marginals
    assert (calls.forward, calls.backward) == (0, 0)
    longer = torch.cat([x, x[:, :1]], 1)
    assert_close(LinearChainCRF(longer).marginals[:, :-1].sum(-1).sum(-1), torch.ones(2, SCAN_LEVELS - 1))
    assert (calls.forward, calls.backward) == (1, 1)
    with kernel.disabled():
        assert_close(marginals, LinearChainCRF(x).marginals, rtol=1e-5, atol=1e-6)


def test_float32_marginals_of_a_long_chain_stay_close_to_float64():
    # the state relative to a running shift: weights keep their precision at any length (the
    # torch calls' log-space sums, of size ~t, were 1.9e-3 off here; SynJax's 1.8e-4 was quoted)
    x = torch.randn(2, 4095, 16, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    exact = LinearChainCRF(x).marginals
    assert (LinearChainCRF(x.float()).marginals.double() - exact).abs().max() < 1.5e-4


def test_a_log_scan_keeps_its_weights_only_within_the_budget(monkeypatch):
    init, xs, u = scan_inputs("one matrix for every step and example", True, torch.float32, B=2, T=10, K=8)
    monkeypatch.setattr(cpu_scan, "KEEP", 2 * 10 * 8 * 8 - 1)  # one number fewer than the weights
    calls = Calls(monkeypatch)
    value = sr.Log.scan(init, xs, u)  # no backward wanted: nothing kept, the C scan runs
    assert (calls.forward, calls.backward) == (1, 0)
    leaves = [t.clone().requires_grad_() for t in (init, xs, u)]
    alphas = sr.Log.scan(*leaves)
    alphas.sum().backward()
    assert (calls.forward, calls.backward) == (1, 0)  # over the budget: the torch calls
    assert_close(alphas.detach(), value)
