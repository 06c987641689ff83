"""The C scan (:mod:`semiring.cpu_scan`) computes what the torch calls of ``Semiring.scan`` compute, in
the Log and Max semirings: the states of every step and the gradients of the initial state, the
matrices and the unaries (Max: the backtrace, to the same bits), for a matrix per step and example
and one matrix for every step and example, with and without unaries, forbidden (-inf) transitions and
states no path reaches, float32 and float64, on every instruction set the CPU runs and any number of
threads; a chain program runs its whole chain in one call each way; float32 marginals of a
long chain stay close to float64's; and on pairs (value, tangent), the Hessian-vector product's,
the scan gives the Log scan's forward-mode derivatives, a chain's whole run in one call each way."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import semiring as sr
from semiring import cpu_scan
from semiring.language import kernel
from semiring.language.execute import SCAN_LEVELS
from structures import EmissionCRF, HopChainCRF, LinearChainCRF
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_log_scan_of_one_matrix_is_the_c_scans_only_within_its_terms_and_the_max_scan_always(dtype, monkeypatch):
    """Beyond ``SHARED_TERMS`` the torch scan's matrix products take it (``B K`` exps a step, not
    ``B K^2``), with the same values; per-step matrices and the Max scan stay the C scan's."""
    init, xs, u = scan_inputs("one matrix for every step and example", True, dtype, B=4, T=10, K=8)
    monkeypatch.setitem(cpu_scan.SHARED_TERMS, dtype, 4 * 8 * 8 - 1)  # one term fewer than a step's
    calls = Calls(monkeypatch)
    value = sr.Log.scan(init, xs, u)
    assert (calls.forward, calls.backward) == (0, 0)
    best = sr.Max.scan(init, xs, u)
    assert calls.forward == 1
    per_step = xs.expand(4, 10, 8, 8).contiguous()
    sr.Log.scan(init, per_step, u)
    assert calls.forward == 2
    monkeypatch.setitem(cpu_scan.SHARED_TERMS, dtype, 4 * 8 * 8)
    assert_close(sr.Log.scan(init, xs, u), value)
    assert calls.forward == 3
    assert_close(best, sr.Max.scan(init, xs, u))


def log_scan_by_definition(init, xs, u):
    """``alpha_t[c] = logsumexp_y(alpha_{t-1}[y] + xs_t[y, c]) + u_t[c]`` in plain torch calls (which
    forward mode differentiates): ``[B, T, K]``."""
    T = u.shape[1] if u is not None else xs.shape[1]
    alphas, alpha = [], init
    for t in range(T):
        alpha = torch.logsumexp(alpha.unsqueeze(-1) + xs[:, t if xs.shape[1] > 1 else 0], -2)
        alpha = alpha + u[:, t] if u is not None else alpha
        alphas.append(alpha)
    return torch.stack(alphas, 1)


def pair_inputs(shape: str, unary: bool, dtype) -> list:
    """Pairs (value, tangent) ``[2, ...]`` of the scan inputs: forbidden transitions keep tangents."""
    values = scan_inputs(shape, unary, dtype)
    tangents = scan_inputs(shape, unary, dtype, seed=1)
    return [None if v is None else torch.stack((v, t.nan_to_num(neginf=0.5))) for v, t in zip(values, tangents)]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (torch scripts its jvp decompositions on first use)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("unary", [True, False])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_pair_scan_is_the_forward_mode_derivative_of_the_log_scan_and_its_gradient(shape, unary, dtype):
    """On pairs (value, tangent), the states and the gradients of the inputs are the Log scan's, and
    their tangents its directional derivatives (torch's forward mode on the torch calls)."""
    import torch.autograd.forward_ad as fwAD

    init, xs, u = pair_inputs(shape, unary, dtype)
    assert cpu_scan.pair_applies(init, xs, u)
    alphas, backward = cpu_scan.pair_forward(init, xs, u)
    weight = torch.linspace(-1, 1, alphas[0].numel(), dtype=dtype).reshape(alphas[0].shape)
    grad = torch.stack((torch.where(alphas[0].isfinite(), weight, 0), torch.zeros_like(weight)))
    grads = backward(grad)
    with fwAD.dual_level():
        # (-inf as -1e4: the same values in double, exp(-1e4) being 0, where torch's logsumexp of
        # -inf terms only has a tangent of NaN)
        duals = [None if p is None else fwAD.make_dual(p[0].double().clamp_min(-1e4), p[1].double()) for p in (init, xs, u)]
        with torch.enable_grad():
            leaves = [None if d is None else d.requires_grad_() for d in duals]
            a = log_scan_by_definition(*leaves)
            found = torch.autograd.grad((torch.where(a.isfinite(), a, 0) * grad[0].double()).sum(),
                                        [t for t in leaves if t is not None], create_graph=True)
        expected_alphas = fwAD.unpack_dual(a)
        expected_grads = [fwAD.unpack_dual(g) for g in found]
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    finite = alphas[0].isfinite()
    assert torch.equal(finite, expected_alphas.primal > -5e3)
    assert_close(alphas[0][finite], expected_alphas.primal[finite].to(dtype), **tol)
    assert_close(alphas[1], torch.where(finite, expected_alphas.tangent, 0).to(dtype), **tol)  # (tangent 0 where no path reaches)
    for g, e in zip([g for g in grads if g is not None], expected_grads):
        assert_close(g[0], e.primal.to(dtype), **tol)
        assert_close(g[1], e.tangent.to(dtype), **tol)


@pytest.mark.parametrize("structure", ["LinearChainCRF", "HopChainCRF"])
def test_a_loss_on_a_chains_marginals_runs_its_chain_as_one_pair_scan_each_way(structure, monkeypatch):
    """The Hessian-vector product of a chain (structured attention's training step) takes the pair
    scan, a call each way, and gives what the pair levels give one by one, with forbidden
    transitions and lengths."""
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([12, 7])
    if structure == "LinearChainCRF":
        x = torch.randn(2, 11, 4, 4, generator=g, dtype=torch.float64)
        x[:, :, 1, 2] = float("-inf")
        make = lambda e: LinearChainCRF(e, lengths)  # noqa: E731
    else:  # (a chain over hops, one matrix each; the facts a hop may not repeat are forbidden)
        x = torch.randn(2, 12, 4, 4, generator=g, dtype=torch.float64)
        x[:, 1:, 1, 1] = float("-inf")
        make = lambda e: HopChainCRF(e, lengths)  # noqa: E731
    v = torch.randn(x.shape, generator=g, dtype=torch.float64)

    def hvp():
        leaf = x.clone().requires_grad_()
        return torch.autograd.grad((make(leaf).marginals * v).sum(), leaf)[0]

    calls = {"pair_forward": 0, "pair_backward": 0}
    native = cpu_scan._scan

    class Counted:
        PAD_TO = native.PAD_TO
        forward, backward = native.forward, native.backward

        @staticmethod
        def pair_forward(*args):
            calls["pair_forward"] += 1
            return native.pair_forward(*args)

        @staticmethod
        def pair_backward(*args):
            calls["pair_backward"] += 1
            return native.pair_backward(*args)

    monkeypatch.setattr(cpu_scan, "_scan", Counted)
    got = hvp()
    assert calls == {"pair_forward": 1, "pair_backward": 1}
    with cpu_scan.enabled.to(False):
        expected = hvp()
    assert calls == {"pair_forward": 1, "pair_backward": 1}
    assert_close(got, expected, rtol=1e-10, atol=1e-10)
