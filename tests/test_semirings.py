"""The built-in semirings, operation by operation, on small arrays."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from torch.testing import assert_close

import semiring as sr
from semiring import cpu_scan

SL = sr.SignedLog


def real(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def negated(a: torch.Tensor) -> torch.Tensor:
    return torch.stack([a[0], -a[1]])


# ---------------------------------------------------------------- SignedLog (Table 1 of Kim et al.)


def test_signed_log_round_trips_real_numbers_of_either_sign():
    x = real(-3.5, -1e-300, 0.0, 2.0, 1e300)
    assert_close(SL.to_real(SL.from_real(x)), x)
    assert SL.from_real(real(0.0))[0].item() == -math.inf  # zero is (log 0, +1)
    assert SL.from_real(real(-2.0))[1].item() == -1


@pytest.mark.parametrize("log_magnitude", [-800.0, 0.0, 3.0, 800.0])
def test_a_plus_minus_a_is_an_exact_zero(log_magnitude):
    a = torch.stack([real(log_magnitude, log_magnitude), real(1.0, -1.0)])
    for zero in (SL.plus(a, negated(a)), SL.sum(torch.stack([a, negated(a)], -1), -1)):
        assert (zero[0] == -math.inf).all() and (zero[1] == 1).all()


@pytest.mark.parametrize("x, y", [(3.0, 2.0), (2.0, 3.0), (-3.0, 2.0), (-2.0, 3.0), (3.0, -2.0), (2.0, -3.0),
                                  (-3.0, -2.0), (-2.0, -3.0), (0.0, -2.0), (1.5, 0.0)])
def test_plus_and_times_equal_the_real_operations(x, y):
    """Equal signs: l_a + log1p(d); opposite signs: l_a + log1p(-d) with the sign of the larger;
    ⊗ adds the logs and multiplies the signs."""
    a, b = SL.from_real(real(x)), SL.from_real(real(y))
    assert_close(SL.to_real(SL.plus(a, b)), real(x + y))
    product = SL.times(a, b)
    assert_close(SL.to_real(product), real(x * y))
    assert_close(product[0], a[0] + b[0])
    assert_close(product[1], a[1] * b[1])


def test_sums_of_mixed_signs_equal_the_real_sum():
    x = torch.randn(6, 9, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert_close(SL.to_real(SL.sum(SL.from_real(x), -1)), x.sum(-1))
    assert_close(SL.to_real(SL.sum(SL.from_real(x), -2)), x.sum(-2))


def test_signed_log_adds_numbers_that_overflow_in_linear_space():
    a = torch.stack([real(1000.0 + math.log(3.0)), real(1.0)])  # 3 e^1000
    b = torch.stack([real(1000.0), real(-1.0)])  # -e^1000
    assert_close(SL.plus(a, b), torch.stack([real(1000.0 + math.log(2.0)), real(1.0)]))  # 2 e^1000


def test_signed_log_identities():
    a = SL.from_real(real(-2.0, 0.5, 0.0))
    assert_close(SL.plus(a, SL.zero((3,), a[0])), a)
    assert_close(SL.times(a, SL.one((3,), a[0])), a)


# ---------------------------------------------------------------- Log, Max, Count, Real


def test_log_sum_is_logsumexp_with_softmax_gradient():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    y = sr.Log.sum(x, -1)
    assert_close(y, torch.logsumexp(x, -1))
    (g,) = torch.autograd.grad(y.sum(), x)
    assert_close(g, x.softmax(-1))


REDUCTIONS = {  # each reads a [R, K] against zeros b [R, K] and ⊕-reduces over K, `copies` times per row
    "sum": (lambda a, b: sr.Log.sum(a, -1), 1),
    "dot": (lambda a, b: sr.Log.dot(a, b, -1), 1),
    "dot, one row against many": (lambda a, b: sr.Log.dot(a.unsqueeze(-2), b.unsqueeze(-2).expand(-1, 3, -1), -1), 3),
}


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_log_gradient_is_zero_not_nan_when_every_summand_is_minus_inf(reduction):
    reduce, copies = REDUCTIONS[reduction]
    empty = torch.full((2, 4), -math.inf, dtype=torch.float64, requires_grad=True)
    mixed = torch.tensor([[0.0, -math.inf, 1.0, -math.inf]] * 2, dtype=torch.float64, requires_grad=True)
    out = reduce(torch.cat([empty, mixed]), torch.zeros(4, 4, dtype=torch.float64))
    assert out[:2].eq(-math.inf).all()
    first = torch.autograd.grad(out.sum(), (empty, mixed), create_graph=True)
    assert (first[0] == 0).all()
    assert_close(first[1], copies * mixed.detach().softmax(-1))
    second = torch.autograd.grad(sum(g.pow(2).sum() for g in first), (empty, mixed))
    assert (second[0] == 0).all()
    assert not second[1].isnan().any()


def test_max_sum_is_max_with_one_hot_gradient():
    x = torch.tensor([[0.5, 2.0, -1.0], [-math.inf, -math.inf, 3.0]], requires_grad=True)
    y = sr.Max.sum(x, -1)
    assert y.tolist() == [2.0, 3.0]
    (g,) = torch.autograd.grad(y.sum(), x)
    assert g.tolist() == [[0, 1, 0], [0, 0, 1]]


def test_count_counts_summands_of_finite_score_in_float64():
    x = torch.tensor([[0.0, -math.inf, 5.0], [-math.inf, -math.inf, -math.inf]])
    c = sr.Count.sum(sr.Count.convert(x), -1)
    assert c.dtype == torch.float64 and c.tolist() == [2.0, 0.0]
    assert sr.Count.times(c, c).tolist() == [4.0, 0.0]


def test_real_is_linear_space():
    x = real(0.0, math.log(2.0), math.log(3.0))
    assert_close(sr.Real.sum(sr.Real.convert(x), -1), torch.tensor(6.0, dtype=torch.float64))
    assert_close(sr.Real.times(sr.Real.convert(x), sr.Real.convert(x)), real(1.0, 4.0, 9.0))


def test_sampled_forward_is_logsumexp_and_backward_is_an_exact_draw():
    torch.manual_seed(0)
    logits = torch.tensor([0.0, 1.0, -1.0, -math.inf], dtype=torch.float64)
    x = logits.expand(20000, 4).clone().requires_grad_()
    y = sr.Sampled.sum(x, -1)
    assert_close(y, torch.logsumexp(x.detach(), -1))
    (draws,) = torch.autograd.grad(y.sum(), x)
    assert (draws.sum(-1) == 1).all() and (draws[:, 3] == 0).all()
    p = logits.softmax(-1)
    assert ((draws.mean(0) - p).abs() <= 5 * (p * (1 - p) / 20000).sqrt() + 1e-12).all()


# ---------------------------------------------------------------- KMax


def test_kmax_sum_keeps_the_k_best_values_best_first():
    k3 = sr.KMax(3)
    x = real(0.5, 3.0, -1.0, 2.0, 7.0).reshape(1, 5)
    assert k3.sum(k3.convert(x), -1)[:, 0].tolist() == [7.0, 3.0, 2.0]
    short = real(1.0, 4.0).reshape(1, 2)
    assert k3.sum(k3.convert(short), -1)[:, 0].tolist() == [4.0, 1.0, -math.inf]  # fewer than k: -inf


def test_kmax_plus_is_the_best_of_the_union_and_times_the_best_pairwise_sums():
    k3 = sr.KMax(3)
    a = real(5.0, 1.0, 0.0).reshape(3, 1)
    b = real(4.0, 2.0, -math.inf).reshape(3, 1)
    assert k3.plus(a, b)[:, 0].tolist() == [5.0, 4.0, 2.0]
    assert k3.times(a, b)[:, 0].tolist() == [9.0, 7.0, 5.0]  # 5+4, 5+2, 1+4


def test_kmax_identities_and_k():
    k2 = sr.KMax(2)
    a = real(5.0, 1.0).reshape(2, 1)
    assert_close(k2.plus(a, k2.zero((1,), a)), a)
    assert_close(k2.times(a, k2.one((1,), a)), a)
    with pytest.raises(ValueError, match="k"):
        sr.KMax(0)


# ---------------------------------------------------------------- Derivations


def derivations(element: torch.Tensor) -> Counter:
    """The derivations of a one-item element ``[capacity, 1 + parts, 1]``, as multisets of part ids."""
    present = element[:, 0, 0] > 0
    return Counter(tuple(int(i) for i, m in enumerate(slot[1:, 0].tolist()) for _ in range(int(m)))
                   for slot in element[present])


@pytest.fixture
def parts():
    """Parts a0, a1 (ids 0, 1) and b0, b1, b2 (ids 2, 3, 4), each summed to one item."""
    d = sr.Derivations(8)
    a, b = torch.zeros(1, 2), torch.zeros(1, 3)
    d.prepare([a, b])
    return d, d.sum(d.convert(a), -1), d.sum(d.convert(b), -1)


def test_derivations_sum_is_the_union_of_the_parts(parts):
    d, a, b = parts
    assert derivations(a) == Counter({(0,): 1, (1,): 1})
    assert derivations(d.plus(a, b)) == Counter({(0,): 1, (1,): 1, (2,): 1, (3,): 1, (4,): 1})


def test_derivations_product_pairs_every_derivation(parts):
    d, a, b = parts
    assert derivations(d.times(a, b)) == Counter({(i, j): 1 for i in (0, 1) for j in (2, 3, 4)})
    assert derivations(d.times(a, d.one((1,), a))) == derivations(a)
    assert derivations(d.plus(a, d.zero((1,), a))) == derivations(a)


def test_derivations_outgrowing_the_capacity_raise_overflow(parts):
    d, a, b = parts
    d.capacity = 5
    with pytest.raises(OverflowError):
        d.times(a, b)


# ---------------------------------------------------------------- Expectation


@pytest.mark.parametrize("base", [sr.Real, sr.SignedLog], ids=str)
def test_expectation_semiring_gives_the_expected_value(base):
    g = torch.Generator().manual_seed(1)
    theta, v = torch.randn(2, 6, generator=g, dtype=torch.float64), torch.randn(2, 6, generator=g, dtype=torch.float64)
    e = sr.Expectation(base)
    p, r = e.sum(e.pair(theta, v), -1)
    p, r = (base.to_real(p), base.to_real(r)) if base is sr.SignedLog else (p, r)
    assert_close(p, theta.exp().sum(-1))
    assert_close(r / p, (theta.softmax(-1) * v).sum(-1))


def test_expectation_needs_a_signed_base():
    with pytest.raises(ValueError, match="base"):
        sr.Expectation(sr.Max)


# ---------------------------------------------------------------- fused scans


SCAN_CASES = {
    "a matrix per step": ((3, 5, 4, 4), None),
    "a matrix per step and a unary": ((3, 5, 4, 4), (3, 5, 4)),
    "one shared matrix and a unary": ((1, 1, 4, 4), (3, 5, 4)),
}


@pytest.mark.parametrize("semiring", [sr.Log, sr.Max], ids=str)
@pytest.mark.parametrize("case", SCAN_CASES, ids=str)
@pytest.mark.parametrize("forbid", [0.0, 0.4])
@pytest.mark.parametrize("native", [True, False], ids=["C scan", "torch calls"])
def test_fused_scans_equal_the_loop_of_dots_with_their_gradients(semiring, case, forbid, native):
    if native and not cpu_scan.enabled:
        pytest.skip("the C scan was not built")
    with cpu_scan.enabled.to(native):
        check_fused_scan(semiring, case, forbid)


def check_fused_scan(semiring, case, forbid):
    g = torch.Generator().manual_seed(17)
    xs_shape, unary_shape = SCAN_CASES[case]

    def draw(shape):
        t = torch.randn(shape, generator=g, dtype=torch.float64)
        return t.masked_fill(torch.rand(shape, generator=g) < forbid, float("-inf")).requires_grad_()

    init, xs = draw((3, 4)), draw(xs_shape)
    unary = draw(unary_shape) if unary_shape else None
    fused, loop = semiring.scan(init, xs, unary), sr.Semiring.scan(semiring, init, xs, unary)
    finite = torch.isfinite(loop)
    assert torch.equal(torch.isfinite(fused), finite)
    assert_close(fused[finite], loop[finite])
    w = torch.randn(loop.shape, generator=g, dtype=torch.float64)
    inputs = [t for t in (init, xs, unary) if t is not None]
    for a, b in zip(torch.autograd.grad((fused.masked_fill(~finite, 0) * w).sum(), inputs),
                    torch.autograd.grad((loop.masked_fill(~finite, 0) * w).sum(), inputs)):
        assert not a.isnan().any()
        assert_close(a, b)


def test_the_fused_log_scan_has_second_derivatives():
    g = torch.Generator().manual_seed(18)
    init = torch.randn(2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    for xs in (torch.randn(2, 4, 3, 3, generator=g, dtype=torch.float64), torch.randn(1, 1, 3, 3, generator=g, dtype=torch.float64)):
        unary = torch.randn(2, 4, 3, generator=g, dtype=torch.float64, requires_grad=True)
        xs.requires_grad_()
        assert torch.autograd.gradgradcheck(lambda i, x, u: sr.Log.scan(i, x, u), (init, xs, unary))
