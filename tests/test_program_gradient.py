"""A query that is a gradient (marginals, argmax, samples) runs the program's two passes directly
(``Program.gradient``), without an autograd graph, and gives what autograd of the run gives:
the same numbers, for every program of the suite, every floating input, Log and Max, with random
lengths and forbidden (-inf) entries; where it cannot (closures, potentials the semiring
converts), the structures differentiate through autograd as before."""

from __future__ import annotations

import pytest
import torch

import semiring as sr
import structures as st
from test_kernel import run
from test_language_cycles import UNARY_CFG
from test_reference import PROGRAMS


@pytest.mark.parametrize("semiring", [sr.Log, sr.Max], ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_direct_gradient_is_autograds_of_the_run(name, dtype, semiring):
    text, inputs, lengths = run(name, dtype)
    program = sr.program(text)
    batch, shapes = program.shapes(inputs)
    floats = [k for k, v in inputs.items() if v.dtype.is_floating_point]
    xs = {k: inputs[k].clone().requires_grad_() for k in floats}
    value = program(semiring, lengths=lengths, **{**inputs, **xs})
    expected = torch.autograd.grad(value, list(xs.values()), torch.ones_like(value), allow_unused=True)
    got_value, got = program.gradient(semiring, inputs, lengths, batch, shapes, floats)
    torch.testing.assert_close(got_value, value.detach(), rtol=0, atol=0, equal_nan=True)
    for name, g, e in zip(floats, got, expected):
        assert not g.requires_grad and not got_value.requires_grad
        torch.testing.assert_close(g, torch.zeros_like(g) if e is None else e, rtol=0, atol=0, equal_nan=True, msg=name)


def test_a_program_with_closures_is_refused_by_name():
    program = sr.program(UNARY_CFG)
    g = torch.Generator().manual_seed(0)
    inputs = dict(word=torch.randn(2, 3, 2, generator=g), rule=torch.randn(2, 2, 2, 2, generator=g) - 3,
                  unary=torch.randn(2, 2, 2, generator=g) - 3)
    batch, shapes = program.shapes(inputs)
    with pytest.raises(ValueError, match="gradient: a program with closures"):
        program.gradient(sr.Log, inputs, None, batch, shapes, ["word"])


def _no_autograd(*args, **kwargs):
    raise AssertionError("torch.autograd.grad was called")


QUERIES = {
    "marginals": lambda d: d.marginals,
    "argmax": lambda d: d.argmax,
    "sample": lambda d: d.sample((2,), generator=torch.Generator().manual_seed(0)),
}
STRUCTURES = {
    "chain": lambda x: st.LinearChainCRF(x[:, :, :3, :3], lengths=torch.tensor([2, 5, 4])),
    "alignment": lambda x: st.AlignmentCRF(x[:, 0, :5, :4]),
    "projective": lambda x: st.ProjectiveDependencyCRF(x[:, 0], lengths=torch.tensor([5, 3, 1])),
}


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("structure", STRUCTURES)
def test_queries_that_are_gradients_take_no_autograd_graph_and_give_its_numbers(structure, query, monkeypatch):
    """Log and Max write their steps' gradients out: no autograd at all. A sampling semiring's
    levels are differentiated one by one by autograd inside the backward pass (as before)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 6, 6, dtype=torch.float64, generator=g)
    x[0, 0, 2, 1] = float("-inf")  # (an arc, a transition and a match that every structure here reads)
    expected = QUERIES[query](STRUCTURES[structure](x.clone().requires_grad_()))  # (θ requires grad: autograd's path)
    if query != "sample":
        monkeypatch.setattr(torch.autograd, "grad", _no_autograd)
    got = QUERIES[query](STRUCTURES[structure](x))
    torch.testing.assert_close(got, expected.detach(), rtol=1e-12, atol=1e-12)


def test_a_structure_with_closures_still_differentiates_through_autograd():
    """A user's structure over a program with a closure (unary rules inside spans): the marginals
    are autograd's, and equal the marginals by finite differences of log Z."""

    class UnaryCFG(st.StructuredDistribution):
        program = sr.program(UNARY_CFG)
        shape = "B, N, NT"
        potentials = "word"

    g = torch.Generator().manual_seed(5)
    word = torch.randn(2, 3, 2, dtype=torch.float64, generator=g)
    shared = dict(rule=torch.randn(1, 2, 2, 2, dtype=torch.float64, generator=g) - 2,
                  unary=torch.randn(1, 2, 2, dtype=torch.float64, generator=g) - 3)
    dist = UnaryCFG(word, shared=shared)
    calls = []
    grad = torch.autograd.grad

    def counting(*args, **kwargs):
        calls.append(1)
        return grad(*args, **kwargs)

    torch.autograd.grad, original = counting, torch.autograd.grad
    try:
        marginals = dist.marginals
    finally:
        torch.autograd.grad = original
    assert calls
    eps = 1e-6
    bump = torch.zeros_like(word)
    bump[1, 2, 0] = eps
    up, down = UnaryCFG(word + bump, shared=shared).log_partition, UnaryCFG(word - bump, shared=shared).log_partition
    assert abs(float((up - down)[1]) / (2 * eps) - float(marginals[1, 2, 0])) < 1e-6


SHARED = {
    "EmissionCRF": lambda x: st.EmissionCRF(x[:, :, 0, :3], x[0, 0, :3, :3], x[0, 1, 0, :3], x[0, 2, 0, :3],
                                            lengths=torch.tensor([2, 5, 4])),
    "SecondOrderDependencyCRF": lambda x: st.SecondOrderDependencyCRF(x[:, 0, :5, :5], x[:, :5, :5, :5],
                                                                      lengths=torch.tensor([4, 2, 3])),
}
EXPECTED = {
    "shared_marginals": lambda d: d.shared_marginals,
    "entropy": lambda d: {"": d.entropy()},
    "cross_entropy": lambda d: {"": d.cross_entropy(d)},
    "kl": lambda d: {"": d.kl(d)},
}


@pytest.mark.parametrize("query", EXPECTED)
@pytest.mark.parametrize("structure", SHARED)
def test_expected_counts_of_shared_scores_take_no_autograd_graph_and_give_its_numbers(structure, query, monkeypatch):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 5, 6, 6, dtype=torch.float64, generator=g)
    x[0, 0, 2, 1] = float("-inf")
    expected = EXPECTED[query](SHARED[structure](x.clone().requires_grad_()))  # (θ requires grad: autograd's path)
    monkeypatch.setattr(torch.autograd, "grad", _no_autograd)
    got = EXPECTED[query](SHARED[structure](x))
    assert got.keys() == expected.keys() and got
    for name in got:
        torch.testing.assert_close(got[name], expected[name].detach(), rtol=1e-12, atol=1e-12, msg=name)
