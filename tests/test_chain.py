"""LinearChainCRF: closed-form counts, tags, the emission parameterization, random inputs."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from brute import CHAIN, random_lengths, random_potentials
from structures import LinearChainCRF


@pytest.mark.parametrize("N", range(1, 9))
@pytest.mark.parametrize("C", range(1, 5))
def test_count_is_c_to_the_n(N, C):
    lengths = torch.arange(N, 0, -1)
    crf = LinearChainCRF(torch.zeros(N, N - 1, C, C), lengths)
    assert crf.count.tolist() == [C**n for n in lengths.tolist()]


@pytest.mark.parametrize("N", range(1, 8))
@pytest.mark.parametrize("C", range(1, 4))
def test_forbidding_repeated_tags_leaves_c_times_c_minus_1_to_the_n_minus_1(N, C):
    theta = torch.zeros(1, N - 1, C, C).masked_fill(torch.eye(C, dtype=torch.bool), -math.inf)
    assert LinearChainCRF(theta).count.item() == C * (C - 1) ** (N - 1)


def best_tags(theta: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The best tag sequence of every example by enumeration, 0 past its length."""
    out = torch.zeros(theta.shape[0], theta.shape[1] + 1, dtype=torch.long)
    for b, (t, n) in enumerate(zip(theta, lengths.tolist())):
        tags = max(itertools.product(range(t.shape[-1]), repeat=n), key=lambda s: sum(t[i, s[i], s[i + 1]] for i in range(n - 1)))
        out[b, :n] = torch.tensor(tags)
    return out


@pytest.mark.parametrize("N", [1, 2, 5])
def test_decode_gives_the_best_tags_and_to_parts_inverts_it(N):
    g = torch.Generator().manual_seed(20)
    theta = random_potentials((N - 1, 3, 3), 4, g)
    lengths = random_lengths(4, N, g)
    crf = LinearChainCRF(theta, lengths)
    tags = crf.decode()
    assert torch.equal(tags, best_tags(theta, lengths))
    assert torch.equal(crf.to_parts(tags), crf.argmax)
    assert torch.equal(crf.tags(crf.argmax), tags)
    assert_close(crf.log_prob(tags), crf.log_prob(crf.argmax))


@pytest.mark.parametrize("N", [1, 2, 4])
def test_tag_marginals_are_the_probabilities_of_each_tag(N):
    g = torch.Generator().manual_seed(21)
    theta = random_potentials((N - 1, 3, 3), 3, g, forbid=0.2)
    lengths = random_lengths(3, N, g)
    expected = torch.zeros(3, N, 3, dtype=torch.float64)
    for b, e in enumerate(CHAIN.enumerate(theta, lengths)):
        for tags, p in zip(itertools.product(range(3), repeat=int(lengths[b])), e.probs):
            expected[b, range(len(tags)), tags] += p
    assert_close(LinearChainCRF(theta, lengths).tag_marginals, expected)


# ---------------------------------------------------------------- from_emissions


def emission_scores(emissions, transitions, start, end, n):
    """(tag sequence, score) of every sequence of length n, scored as from_emissions documents."""
    C = emissions.shape[-1]
    for tags in itertools.product(range(C), repeat=n):
        score = start[tags[0]] + end[tags[-1]] + sum(emissions[i, c] for i, c in enumerate(tags))
        yield tags, score + sum(transitions[tags[i], tags[i + 1]] for i in range(n - 1))


@pytest.mark.parametrize("N", [1, 2, 4])
@pytest.mark.parametrize("C", [1, 3])
def test_from_emissions_scores_start_emissions_transitions_end(N, C):
    g = torch.Generator().manual_seed(22)
    B = 3
    emissions = random_potentials((N, C), B, g)
    transitions, start, end = (random_potentials(s, 1, g)[0] for s in ((C, C), (C,), (C,)))
    lengths = random_lengths(B, N, g)
    inputs = (emissions, transitions, start, end, lengths)
    saved = [x.clone() for x in inputs]
    crf = LinearChainCRF.from_emissions(*inputs)
    tag_marginals = torch.zeros(B, N, C, dtype=torch.float64)
    for b, n in enumerate(lengths.tolist()):
        tags, scores = zip(*emission_scores(emissions[b], transitions, start, end, n))
        scores = torch.stack(scores)
        log_z = torch.logsumexp(scores, 0)
        assert_close(crf.log_partition[b], log_z)
        assert crf.count[b] == C**n
        assert crf.decode()[b, :n].tolist() == list(tags[int(scores.argmax())])
        for sequence, p in zip(tags, (scores - log_z).exp()):
            tag_marginals[b, range(n), sequence] += p
        one = torch.tensor(tags[1 % len(tags)])
        value = torch.zeros(B, N, dtype=torch.long)
        value[b, :n] = one
        assert_close(crf.log_prob(value)[b], scores[1 % len(tags)] - log_z)
    assert_close(crf.tag_marginals, tag_marginals)
    assert all(torch.equal(x, before) for x, before in zip(inputs, saved))  # inputs are never mutated


@pytest.mark.parametrize("argument, kwargs", [
    ("emissions", dict(emissions=torch.zeros(2, 3))),
    ("transitions", dict(transitions=torch.zeros(3, 3))),
    ("transitions", dict(transitions=torch.zeros(2, 2, 2))),
    ("start", dict(start=torch.zeros(3))),
    ("end", dict(end=torch.zeros(2, 1))),
    ("lengths", dict(lengths=torch.tensor([4, 1]))),
    ("lengths", dict(lengths=torch.tensor([0, 1]))),
    ("lengths", dict(lengths=torch.tensor([1.0, 1.0]))),
    ("emissions", dict(emissions=torch.full((2, 3, 2), math.nan))),
])
def test_from_emissions_refuses_bad_input_naming_the_argument(argument, kwargs):
    inputs = dict(emissions=torch.zeros(2, 3, 2), transitions=torch.zeros(2, 2), start=torch.zeros(2), end=torch.zeros(2))
    with pytest.raises(ValueError, match=argument):
        LinearChainCRF.from_emissions(**{**inputs, **kwargs})


# ---------------------------------------------------------------- random inputs


@st.composite
def chains(draw):
    """Potentials [B, N-1, C, C] mixing ordinary, huge and -inf values, and lengths."""
    B, N, C = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    value = st.one_of(st.floats(-5, 5), st.floats(-1e4, 1e4), st.just(-math.inf))
    entries = draw(st.lists(value, min_size=B * (N - 1) * C * C, max_size=B * (N - 1) * C * C))
    theta = torch.tensor(entries, dtype=torch.float64).reshape(B, N - 1, C, C)
    lengths = torch.tensor(draw(st.lists(st.integers(1, N), min_size=B, max_size=B)))
    return theta, lengths


@settings(max_examples=60, deadline=None)
@given(chains())
def test_random_chains_match_brute_force_and_are_never_nan(chain):
    theta, lengths = chain
    crf = LinearChainCRF(theta, lengths)
    enums = CHAIN.enumerate(theta, lengths)
    assert_close(crf.log_partition, torch.stack([e.log_partition for e in enums]))
    assert_close(crf.marginals, torch.stack([e.marginals for e in enums]))
    for result in (crf.log_partition, crf.marginals, crf.entropy(), crf.argmax, crf.max):
        assert not result.isnan().any()
    finite = crf.log_partition.isfinite()
    per_position = crf.marginals.sum((-1, -2))
    expected = (torch.arange(theta.shape[1]) < (lengths - 1).unsqueeze(-1)).to(theta.dtype)
    assert_close(per_position[finite], expected[finite])
    assert_close(crf.marginals.sum((1, 2, 3))[finite], (lengths - 1).to(theta.dtype)[finite])


@pytest.mark.parametrize("N", [2, 8])
def test_default_gradcheck_passes_a_second_backward_gives_the_same_bits(N):
    """torch's gradcheck runs the backward twice and wants the same bits (the fused scan's backward
    once consumed the weights its forward kept, and a second backward recomputed them)."""
    theta = torch.randn(2, N - 1, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: LinearChainCRF(x).log_partition, (theta,))
    assert torch.autograd.gradcheck(lambda x: LinearChainCRF(x).marginals, (theta,))


def test_from_emissions_reads_the_lengths_once(monkeypatch):
    """from_emissions checks the lengths in its own terms (1..N, one read of their values) and the
    chain it builds over N+1 positions takes them without reading them again; a length out of
    range is still refused in the caller's terms."""
    program = type(LinearChainCRF.program)
    check, reads = program.check_lengths, []

    def recorded(self, lengths, *args, values=True, **kwargs):
        reads.append(values)
        return check(self, lengths, *args, values=values, **kwargs)

    monkeypatch.setattr(program, "check_lengths", recorded)
    emissions, transitions = torch.zeros(2, 4, 3), torch.zeros(3, 3)
    LinearChainCRF.from_emissions(emissions, transitions, lengths=torch.tensor([4, 1]))
    assert reads == [False]
    LinearChainCRF(torch.zeros(2, 3, 3, 3), torch.tensor([4, 1]))
    assert reads == [False, True]  # (a chain built directly reads them)
    with pytest.raises(ValueError, match=r"^lengths: expected values in 1\.\.4, got \[5, 0\]"):
        LinearChainCRF.from_emissions(emissions, transitions, lengths=torch.tensor([5, 0]))
