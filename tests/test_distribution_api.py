"""The distribution API of every structure against independent enumeration (tests/brute.py).

Each structure family runs at every small size, with and without ``lengths``, with finite
potentials and with some parts forbidden (-inf); every query is checked against the enumeration.
A structure whose constructor takes more than potentials and lengths (HMM, CTC, AlignmentCRF,
SecondOrderDependencyCRF, PCFG, TDPCFG) joins through an adapter (brute.ADAPTED) that fixes the rest;
where a check cannot apply to one, the exclusion says why.
"""

from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass

import pytest
import torch
from torch.testing import assert_close

from brute import (ADAPTED, ALIGNMENT, ALIGNMENT_ONE_TO_MANY, CTC_FAMILY, FAMILIES, HMM_FAMILY, Enumeration, Family, as_multiset,
                   random_potentials)
from structures import HMM, EmissionCRF, HopChainCRF, LinearChainCRF

FAMILIES = FAMILIES + ADAPTED  # and the structures whose constructors take more, through adapters


@dataclass(frozen=True)
class Case:
    family: Family
    shape: tuple[int, ...]
    with_lengths: bool
    forbid: float

    def __str__(self) -> str:
        return f"{self.family}-{'x'.join(map(str, self.shape))}-{'lengths' if self.with_lengths else 'full'}{'-forbid' if self.forbid else ''}"


CASES = [Case(f, s, with_lengths, forbid) for f in FAMILIES for s in f.shapes
         for with_lengths in (False, True) for forbid in (0.0, 0.3)]


@dataclass
class Problem:
    theta: torch.Tensor  # [B, *shape] float64
    lengths: torch.Tensor | None
    enums: list[Enumeration]
    q_theta: torch.Tensor  # a second distribution over the same structures
    q_enums: list[Enumeration]


@functools.lru_cache(maxsize=None)
def problem(case: Case) -> Problem:
    g = torch.Generator().manual_seed(zlib.crc32(str(case).encode()))
    batch = 3 if case.with_lengths else 2
    theta = random_potentials(case.shape, batch, g, case.forbid)
    lengths = case.family.random_lengths(batch, case.shape, g) if case.with_lengths else None
    q_theta = random_potentials(case.shape, batch, g, case.forbid)
    return Problem(theta, lengths, case.family.enumerate(theta, lengths), q_theta, case.family.enumerate(q_theta, lengths))


def dist(case: Case, theta: torch.Tensor | None = None):
    p = problem(case)
    return case.family.cls(p.theta if theta is None else theta, p.lengths)


per_case = pytest.mark.parametrize("case", CASES, ids=str)


def per_case_but(*excluded: Family):
    return pytest.mark.parametrize("case", [c for c in CASES if c.family not in excluded], ids=str)


# ---------------------------------------------------------------- every query equals enumeration


@per_case
def test_log_partition_is_logsumexp_of_every_score(case):
    expected = torch.stack([e.log_partition for e in problem(case).enums])
    assert_close(dist(case).log_partition, expected)


@per_case
def test_marginals_are_expected_parts(case):
    expected = torch.stack([e.marginals for e in problem(case).enums])
    assert_close(dist(case).marginals, expected)


@per_case
def test_count_is_number_of_structures_of_finite_score(case):
    expected = torch.tensor([e.count for e in problem(case).enums], dtype=torch.float64)
    assert_close(dist(case).count, expected)


@per_case
def test_max_and_argmax_are_a_best_structure(case):
    d, enums = dist(case), problem(case).enums
    assert_close(d.max, torch.stack([e.max for e in enums]))
    for b, e in enumerate(enums):
        if e.count == 0:
            assert (d.argmax[b] == 0).all()
        else:
            assert e.scores[e.index(d.argmax[b])] == e.max


@per_case
def test_topk_are_the_k_best_distinct_structures(case):
    k = 4
    d, enums = dist(case), problem(case).enums
    scores, best = d.topk_scores(k), d.topk(k)
    for b, e in enumerate(enums):
        assert_close(scores[:, b], e.topk_scores(k))
        found = min(k, e.count)
        assert (best[found:, b] == 0).all()  # slots past the count are empty
        assert not as_multiset(best[:found, b]) - e.support()  # real structures, none repeated
        for j in range(found):
            assert_close(e.scores[e.index(best[j, b])], scores[j, b])


@per_case
def test_enumerate_support_is_every_structure(case):
    values, valid = dist(case).enumerate_structures()
    for b, e in enumerate(problem(case).enums):
        assert as_multiset(values[valid[:, b], b]) == e.support()
        assert (values[~valid[:, b], b] == 0).all()


@per_case
def test_entropy_is_minus_sum_p_log_p(case):
    assert_close(dist(case).entropy(), torch.stack([e.entropy for e in problem(case).enums]))


@per_case
def test_kl_and_cross_entropy_between_two_distributions(case):
    p = problem(case)
    d, q = dist(case), dist(case, p.q_theta)
    assert_close(d.cross_entropy(q), torch.stack([e.cross_entropy(f) for e, f in zip(p.enums, p.q_enums)]))
    assert_close(d.kl(q), torch.stack([e.kl(f) for e, f in zip(p.enums, p.q_enums)]))


@per_case
def test_log_prob_of_every_structure(case):
    d, enums = dist(case), problem(case).enums
    for b, e in enumerate(enums):
        value = torch.zeros(len(e.scores), *d.log_potentials.shape, dtype=torch.float64)
        value[:, b] = e.parts
        assert_close(d.log_prob(value)[:, b], e.log_probs)


@per_case
def test_what_is_not_a_structure_has_log_prob_minus_inf(case):
    """Every structure is one; a structure with one part flipped is one only if the enumeration
    lists it; log_prob of what is not one is -inf (not a finite number), 0.5 or 2 are not parts."""
    d, enums = dist(case), problem(case).enums
    g = torch.Generator().manual_seed(zlib.crc32(str(case).encode()))
    for b, e in enumerate(enums):
        value = torch.zeros(len(e.parts), *d.log_potentials.shape, dtype=torch.float64)
        value[:, b] = e.parts
        assert d.is_structure(value)[:, b].all()
        if not e.parts[0].numel():
            continue
        flip = torch.randint(e.parts[0].numel(), (len(e.parts),), generator=g)
        value[:, b].view(len(e.parts), -1)[torch.arange(len(e.parts)), flip] -= 1
        value[:, b] = value[:, b].abs()
        expected = torch.tensor([tuple(v.flatten().int().tolist()) in as_multiset(e.parts) for v in value[:, b]])
        assert torch.equal(d.is_structure(value)[:, b], expected)
        assert torch.isneginf(d.log_prob(value)[~expected, b]).all()
        some = value[:, b].flatten(1).sum(1) > 0  # (a length-1 chain's structure has no part)
        assert not (d.is_structure(value * 0.5)[:, b] & some).any() and not (d.is_structure(value * 2)[:, b] & some).any()


@per_case
def test_expected_score_and_marginals_backward(case):
    """E_p[⟨v, z⟩] by the expectation semiring, and its gradient Cov_p(z) v (backpropagation
    through the marginals) in signed log space, for values v of either sign."""
    p = problem(case)
    d, v = dist(case), p.q_theta.nan_to_num(neginf=-2.0)
    assert_close(d.expected_score(v), torch.stack([e.expected_score(vb) for e, vb in zip(p.enums, v)]))
    assert_close(d.marginals_backward(v), torch.stack([e.covariance_times(vb) for e, vb in zip(p.enums, v)]))


@per_case
def test_autograd_through_the_marginals_is_the_covariance_times_v(case):
    """A loss on the marginals, backpropagated by autograd (the path structured attention takes:
    on the level tape, a Hessian-vector product in forward mode), gives Cov_p(z) v."""
    p = problem(case)
    theta = p.theta.clone().requires_grad_()
    v = p.q_theta.nan_to_num(neginf=-2.0)
    loss = (case.family.cls(theta, p.lengths).marginals * v).sum()
    expected = torch.stack([e.covariance_times(vb) for e, vb in zip(p.enums, v)])
    if not loss.requires_grad:  # a single structure per example: constant marginals
        assert_close(expected, torch.zeros_like(expected))
        return
    (grad,) = torch.autograd.grad(loss, theta)
    assert_close(grad, expected)


@per_case_but(ALIGNMENT, ALIGNMENT_ONE_TO_MANY, CTC_FAMILY)  # two lengths, a dict (their tests check its defaults)
def test_lengths_default_to_the_longest(case):
    p = problem(case)
    expected = p.lengths if p.lengths is not None else torch.full((2,), case.family.max_length(case.shape))
    assert torch.equal(dist(case).lengths, expected)


# ---------------------------------------------------------------- one example or many


def largest(family: Family) -> tuple[int, ...]:
    return family.shapes[-1]


@pytest.mark.parametrize("family", FAMILIES, ids=str)
def test_padded_batch_equals_examples_one_by_one(family):
    shape = largest(family)
    longest = family.max_length(shape)
    g = torch.Generator().manual_seed(1)
    lengths = torch.arange(longest, family.min_length - 1, -1)
    theta = random_potentials(shape, len(lengths), g) * 50  # padding holds large values: it must carry no mass
    batch = family.cls(theta, lengths)
    for b, n in enumerate(lengths.tolist()):
        one = family.cls(family.truncate(theta[b : b + 1], n))
        pad = [x for d in reversed(range(len(shape))) for x in (0, shape[d] - one.log_potentials.shape[d + 1])]
        assert_close(batch.log_partition[b], one.log_partition[0])
        assert_close(batch.marginals[b], torch.nn.functional.pad(one.marginals, pad)[0])
        assert_close(batch.argmax[b], torch.nn.functional.pad(one.argmax, pad)[0])


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("family", FAMILIES, ids=str)
@pytest.mark.parametrize("with_lengths", [False, True])
def test_gradcheck_and_gradgradcheck(family, with_lengths):
    shape = family.shapes[len(family.shapes) // 2]
    g = torch.Generator().manual_seed(2)
    theta = random_potentials(shape, 2, g).requires_grad_()
    lengths = family.random_lengths(2, shape, g) if with_lengths else None

    def log_partition(x):
        return family.cls(x, lengths).log_partition

    def marginals(x):
        return family.cls(x, lengths).marginals

    assert torch.autograd.gradcheck(log_partition, (theta,))
    assert torch.autograd.gradgradcheck(log_partition, (theta,))
    assert torch.autograd.gradcheck(marginals, (theta,))


# ---------------------------------------------------------------- sampling


@pytest.mark.parametrize("family", FAMILIES, ids=str)
def test_sample_frequencies_match_marginals(family):
    torch.manual_seed(0)
    shape = largest(family)
    g = torch.Generator().manual_seed(3)
    theta = random_potentials(shape, 2, g, forbid=0.2)
    lengths = family.random_lengths(2, shape, g)
    d = family.cls(theta, lengths)
    n = 20000
    samples = d.sample((n,))
    assert samples.shape == (n, *theta.shape)
    mu = d.marginals
    bound = 5 * (mu * (1 - mu) / n).sqrt() + 1e-9  # five binomial standard errors
    assert ((samples.mean(0) - mu).abs() <= bound).all()
    for b, e in enumerate(family.enumerate(theta, lengths)):
        if e.count:
            assert not as_multiset(samples[:, b].unique(dim=0)) - e.support()  # each sample is a structure
        else:  # no structure remains: samples are 0 (docs/shapes.md)
            assert not samples[:, b].any()


@pytest.mark.parametrize("family", FAMILIES, ids=str)
def test_samples_from_a_generator_repeat_and_leave_the_global_stream_alone(family):
    shape = largest(family)
    g = torch.Generator().manual_seed(4)
    d = family.cls(random_potentials(shape, 2, g, forbid=0.2), family.random_lengths(2, shape, g))
    torch.manual_seed(0)
    expected_global = torch.rand(3)
    torch.manual_seed(0)
    first = d.sample((50,), generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.rand(3), expected_global)  # the draws used the generator, not the global stream
    assert torch.equal(d.sample((50,), generator=torch.Generator().manual_seed(1)), first)
    assert not torch.equal(d.sample((50,), generator=torch.Generator().manual_seed(2)), first)


@pytest.mark.parametrize("family", FAMILIES, ids=str)
@pytest.mark.parametrize("sample_shape", [(0,), (3, 0), (0, 2)], ids=str)
def test_an_empty_sample_shape_gives_no_samples(family, sample_shape):
    d = dist(Case(family, largest(family), True, 0.0))
    samples = d.sample(sample_shape)
    assert samples.shape == (*sample_shape, *d.log_potentials.shape)


@pytest.mark.parametrize("family", FAMILIES, ids=str)
@pytest.mark.parametrize("sample_shape", [(-1,), (2, -3), (1.5,), (True,), "4", None], ids=repr)
def test_a_bad_sample_shape_is_a_value_error_naming_it(family, sample_shape):
    d = dist(Case(family, largest(family), False, 0.0))
    with pytest.raises(ValueError, match="sample_shape: expected a sequence of sizes >= 0"):
        d.sample(sample_shape)


@per_case
def test_a_torch_distribution_with_kl_divergence_registered(case):
    """torch's names answer as the enumeration says: kl_divergence is KL(p || q), mean is E_p[z],
    mode a best structure, variance E_p[(z - E_p z)^2] per part, perplexity exp of the entropy."""
    p = problem(case)
    d, q = dist(case), dist(case, p.q_theta)
    assert isinstance(d, torch.distributions.Distribution)
    assert d.batch_shape == d.log_potentials.shape[:1] and d.event_shape == d.log_potentials.shape[1:]
    assert_close(torch.distributions.kl_divergence(d, q), torch.stack([e.kl(f) for e, f in zip(p.enums, p.q_enums)]))
    assert_close(d.mean, torch.stack([e.marginals for e in p.enums]))
    variance = [torch.einsum("s,s...->...", e.probs, (e.parts - e.marginals) ** 2) for e in p.enums]
    assert_close(d.variance, torch.stack(variance))
    for b, e in enumerate(p.enums):
        if e.count == 0:
            assert (d.mode[b] == 0).all()
        else:
            assert e.scores[e.index(d.mode[b])] == e.max
    assert_close(d.perplexity(), torch.stack([e.entropy for e in p.enums]).exp())


@pytest.mark.parametrize("family", FAMILIES, ids=str)
def test_enumerating_more_structures_than_the_limit_is_a_value_error(family):
    d = dist(Case(family, largest(family), False, 0.0))
    # (the dynamic programs count structures; the non-projective CRF, head assignments it would try)
    with pytest.raises(ValueError, match=r"enumerate_support: .* exceed limit=1\b"):
        d.enumerate_support(limit=1)


@pytest.mark.parametrize("family", FAMILIES, ids=str)
def test_an_empty_batch_answers_every_query_with_empty_results(family):
    shape = largest(family)
    theta = torch.zeros(0, *shape, dtype=torch.float64, requires_grad=True)
    d = family.cls(theta)
    lengths = d.lengths.values() if isinstance(d.lengths, dict) else [d.lengths]  # (a dict: several lengths)
    for value in (d.log_partition, d.max, d.count, d.entropy(), d.kl(d), *lengths):
        assert value.shape == (0,)
    for parts in (d.marginals, d.argmax):
        assert parts.shape == theta.shape
    assert d.sample((3,)).shape == (3, *theta.shape)
    assert d.topk(2).shape == (2, *theta.shape)
    values, valid = d.enumerate_structures()
    assert values.shape[1:] == theta.shape and valid.shape[1] == 0
    assert d.log_prob(d.argmax).shape == (0,)
    (g,) = torch.autograd.grad(d.log_partition.sum(), theta)
    assert g.shape == theta.shape


# ---------------------------------------------------------------- bad input


def bad_potentials(family: Family):
    """(name, tensor) pairs of potentials the structure must refuse."""
    shape = largest(family)
    ok = torch.zeros(2, *shape, dtype=torch.float64)
    symbols = [s.strip() for s in family.cls.shape.split(",")]
    tied = [i for i, s in enumerate(symbols) if symbols.count(s) > 1]  # sizes the spec ties to another
    wrong_size = list(ok.shape)
    if tied:
        wrong_size[max(tied)] += 1
    return [
        ("rank too small", ok[0]),
        ("rank too large", ok.unsqueeze(-1)),
        *([("size mismatch", torch.zeros(wrong_size, dtype=torch.float64))] if tied else []),
        ("integer", ok.long()),
        ("nan", with_first_entry(ok, math.nan)),
        ("+inf", with_first_entry(ok, math.inf)),
        ("overflowing", with_first_entry(ok.float(), 3e38)),  # finite, but a sum of such entries is +inf
        ("overflowing negative", with_first_entry(ok.float(), -3e38)),
    ]


def with_first_entry(theta: torch.Tensor, value: float) -> torch.Tensor:
    theta = theta.clone()
    theta.view(-1)[0] = value
    return theta


@pytest.mark.parametrize("family, what, theta",
                         [(f, what, t) for f in FAMILIES for what, t in bad_potentials(f)],
                         ids=lambda v: str(v) if not isinstance(v, torch.Tensor) else "")
def test_bad_potentials_raise_value_error_naming_argument_and_shape(family, what, theta):
    with pytest.raises(ValueError, match=family.argument) as error:
        family.cls(theta)
    if what in ("rank too small", "rank too large", "size mismatch"):
        spec = "C, V" if family is HMM_FAMILY else family.cls.shape  # (HMM's potentials are gathered from emission)
        assert f"[{spec}]" in str(error.value)


@pytest.mark.parametrize("family", FAMILIES, ids=str)
@pytest.mark.parametrize("what", ["zero", "too long", "negative", "batch size", "rank 2", "float", "bool"])
def test_bad_lengths_raise_value_error_naming_lengths(family, what):
    shape = largest(family)
    longest = family.max_length(shape)
    theta = torch.zeros(2, *shape, dtype=torch.float64)
    lengths = {
        "zero": torch.tensor([longest, 0]),
        "too long": torch.tensor([longest + 1, 1]),
        "negative": torch.tensor([-1, 1]),
        "batch size": torch.tensor([1, 1, 1]),
        "rank 2": torch.tensor([[1], [1]]),
        "float": torch.tensor([1.0, 1.0]),
        "bool": torch.tensor([True, True]),
    }[what]
    with pytest.raises(ValueError, match="lengths") as error:
        family.cls(theta, lengths)
    message = str(error.value)
    assert f"{family.min_length}..{longest}" in message if what in ("zero", "too long", "negative") else "[B]" in message


@pytest.mark.parametrize("family", FAMILIES, ids=str)
def test_no_query_mutates_its_inputs(family):
    shape = largest(family)
    g = torch.Generator().manual_seed(4)
    theta = random_potentials(shape, 3, g, forbid=0.2)
    lengths = family.random_lengths(3, shape, g)
    other = random_potentials(shape, 3, g)
    saved = theta.clone(), lengths.clone(), other.clone()
    d, q = family.cls(theta, lengths), family.cls(other, lengths)
    queries = [
        lambda: d.log_partition, lambda: d.marginals, lambda: d.max, lambda: d.argmax, lambda: d.decode(),
        lambda: d.topk(3), lambda: d.topk_scores(3), lambda: d.sample((5,)), lambda: d.count,
        lambda: d.entropy(), lambda: d.cross_entropy(q), lambda: d.kl(q), lambda: d.enumerate_support(),
        lambda: d.log_prob(d.argmax), lambda: d.lengths, lambda: d.expected_score(other),
        lambda: d.marginals_backward(other),
        lambda: family.cls(theta.clone().requires_grad_(), lengths).marginals.sum().backward(),
    ]
    for query in queries:
        query()
        for now, before in zip((theta, lengths, other), saved):
            assert torch.equal(now, before)


# ---------------------------------------------------------------- constraints


@pytest.mark.parametrize("family", FAMILIES, ids=str)
def test_nothing_left_gives_minus_inf_zero_marginals_and_no_nan(family):
    shape = largest(family)
    g = torch.Generator().manual_seed(5)
    theta = random_potentials(shape, 2, g)
    theta[0] = float("-inf")  # example 0: every part forbidden; example 1: untouched
    d, q = family.cls(theta), family.cls(random_potentials(shape, 2, g))
    e = family.enumerate(theta)[1]
    assert d.log_partition[0] == -math.inf and d.max[0] == -math.inf and d.count[0] == 0
    assert_close(d.log_partition[1], e.log_partition)
    for zero in (d.marginals, d.argmax, d.topk(2).transpose(0, 1), d.sample((3,)).transpose(0, 1)):
        assert (zero[0] == 0).all()
    assert (d.topk_scores(2)[:, 0] == -math.inf).all()
    values, valid = d.enumerate_structures()
    assert not valid[:, 0].any()
    for result in (d.marginals, d.argmax, d.entropy(), d.cross_entropy(q), d.kl(q), q.kl(d), q.cross_entropy(d),
                   d.log_prob(d.sample((3,))), d.topk(2), d.sample((3,)), d.expected_score(theta.nan_to_num()),
                   d.marginals_backward(theta.nan_to_num())):
        assert not result.isnan().any()
    assert q.kl(d)[0] == math.inf and q.cross_entropy(d)[0] == math.inf  # q puts mass where d has none


# ---------------------------------------------------------------- low precision


@pytest.mark.parametrize("family", FAMILIES, ids=str)
@pytest.mark.parametrize("dtype, tol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)], ids=["float16", "bfloat16"])
def test_half_precision_is_computed_in_float32_and_returned_in_input_dtype(family, dtype, tol):
    shape = largest(family)
    g = torch.Generator().manual_seed(6)
    low = random_potentials(shape, 2, g, forbid=0.2, dtype=torch.float32).to(dtype)
    lengths = family.random_lengths(2, shape, g)
    d, ref = family.cls(low, lengths), family.cls(low.float(), lengths)
    queries = {"log_partition": lambda x: x.log_partition, "marginals": lambda x: x.marginals, "max": lambda x: x.max,
               "argmax": lambda x: x.argmax, "entropy": lambda x: x.entropy()}
    for query, ask in queries.items():
        got, expected = ask(d), ask(ref)
        assert got.dtype == dtype, query
        assert_close(got.float(), expected, rtol=tol, atol=tol, msg=query)
    assert d.sample((2,)).dtype == dtype and d.topk(2).dtype == dtype


@pytest.mark.parametrize("family", FAMILIES, ids=str)
def test_gradient_queries_work_under_no_grad(family):
    """argmax, marginals, samples, topk and entropy are gradients of programs: torch.no_grad()
    around the call must not turn them into zeros."""
    shape = largest(family)
    theta = random_potentials(shape, 2, torch.Generator().manual_seed(41)).requires_grad_()
    expected = family.cls(theta.detach())
    with torch.no_grad():
        d = family.cls(theta)
        assert_close(d.marginals, expected.marginals)
        assert_close(d.argmax, expected.argmax)
        assert_close(d.topk(2), expected.topk(2))
        assert_close(d.entropy(), expected.entropy())
        assert d.sample((3,)).flatten(2).sum(-1).gt(0).all() or expected.max.isneginf().any()


TAGGERS = {  # structures whose decoded form is one integer per position: tags (or facts) 0..2
    "LinearChainCRF": lambda: LinearChainCRF(torch.randn(2, 3, 3, 3), torch.tensor([4, 2])),
    "EmissionCRF": lambda: EmissionCRF(torch.randn(2, 4, 3), torch.randn(3, 3), lengths=torch.tensor([4, 2])),
    "HopChainCRF": lambda: HopChainCRF(torch.randn(2, 4, 3, 3), torch.tensor([4, 2])),
    "HMM": lambda: HMM(torch.randint(5, (2, 4)), torch.randn(3, 5), torch.randn(3, 3), torch.randn(3), torch.tensor([4, 2])),
}


@pytest.mark.parametrize("name", TAGGERS)
@pytest.mark.parametrize("bad", [3, -1, 7], ids=str)
def test_tags_out_of_range_within_the_length_are_a_value_error_naming_value(name, bad):
    d = TAGGERS[name]()
    tags = torch.tensor([[0, 1, 2, 0], [1, 0, 0, 0]])
    inside = tags.clone()
    inside[0, 3] = bad
    with pytest.raises(ValueError, match="value"):
        d.log_prob(inside)
    past = tags.clone()
    past[1, 3] = bad  # past the length: ignored
    assert torch.isfinite(d.log_prob(past)).all()
    with pytest.raises(ValueError, match="value"):
        d.log_prob(tags.bool())


@pytest.mark.parametrize("family", FAMILIES, ids=str)
def test_validate_args_off_skips_the_checks_that_read_values_but_not_shapes(family, monkeypatch):
    """``Distribution.set_default_validate_args(False)``, as in torch.distributions: potentials and
    lengths are not read (no device synchronisation) — NaN and out-of-range lengths go through —
    while types and shapes are still checked."""
    shape = largest(family)
    nan = torch.full((2, *shape), math.nan, dtype=torch.float64)
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", False)
    family.cls(nan)  # no ValueError
    with pytest.raises(ValueError, match=family.argument):
        family.cls(nan[0])
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", True)
    with pytest.raises(ValueError, match=family.argument):
        family.cls(nan)
