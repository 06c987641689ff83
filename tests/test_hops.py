"""HopChainCRF: closed-form counts, the unary and binary constructors, facts per hop."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.testing import assert_close

from brute import HOPS, random_potentials
from structures import HopChainCRF


@pytest.mark.parametrize("K", range(1, 6))
@pytest.mark.parametrize("F", range(1, 5))
def test_count_is_f_to_the_number_of_hops(K, F):
    lengths = torch.arange(K, 0, -1)
    assert HopChainCRF(torch.zeros(K, K, F, F), lengths).count.tolist() == [F**n for n in lengths.tolist()]


@pytest.mark.parametrize("K", range(1, 6))
@pytest.mark.parametrize("F", range(1, 5))
def test_no_repeat_count_is_f_times_f_minus_1_to_the_k_minus_1(K, F):
    assert HopChainCRF.unary(torch.zeros(1, K, F), no_repeat=True).count.item() == F * (F - 1) ** (K - 1)


def test_fact_mask_leaves_only_real_facts():
    K, F = 3, 5
    mask = torch.tensor([[True, True, True, False, False], [True, False, False, False, False]])
    crf = HopChainCRF.unary(torch.zeros(2, K, F), fact_mask=mask, no_repeat=True)
    assert crf.count.tolist() == [3 * 2 ** (K - 1), 0]
    assert (crf.hop_marginals[0, :, 3:] == 0).all()


def test_unary_hops_are_independent():
    g = torch.Generator().manual_seed(40)
    scores = random_potentials((3, 4), 2, g)
    crf = HopChainCRF.unary(scores)
    assert_close(crf.log_partition, torch.logsumexp(scores, -1).sum(-1))
    assert_close(crf.hop_marginals, scores.softmax(-1))
    assert torch.equal(crf.decode(), scores.argmax(-1))


def fact_sequences(first: torch.Tensor, pairwise: torch.Tensor, F: int, no_repeat: bool):
    """(facts, score) of every fact sequence, scored first[f_0] + Σ_k pairwise[k-1, f_{k-1}, f_k]."""
    for facts in itertools.product(range(F), repeat=pairwise.shape[0] + 1):
        if no_repeat and any(a == b for a, b in zip(facts, facts[1:])):
            continue
        yield facts, first[facts[0]] + sum(pairwise[k, facts[k], facts[k + 1]] for k in range(len(facts) - 1))


@pytest.mark.parametrize("no_repeat", [False, True])
def test_binary_scores_first_hop_and_pairs_of_hops(no_repeat):
    g = torch.Generator().manual_seed(41)
    K, F = 3, 3
    first, pairwise = random_potentials((F,), 2, g), random_potentials((K - 1, F, F), 2, g)
    saved = first.clone(), pairwise.clone()
    crf = HopChainCRF.binary(first, pairwise, no_repeat=no_repeat)
    for b in range(2):
        facts, scores = zip(*fact_sequences(first[b], pairwise[b], F, no_repeat))
        scores = torch.stack(scores)
        log_z = torch.logsumexp(scores, 0)
        assert_close(crf.log_partition[b], log_z)
        assert crf.decode()[b].tolist() == list(facts[int(scores.argmax())])
        hop_marginals = torch.zeros(K, F, dtype=torch.float64)
        for sequence, p in zip(facts, (scores - log_z).exp()):
            hop_marginals[range(K), sequence] += p
        assert_close(crf.hop_marginals[b], hop_marginals)
    assert torch.equal(first, saved[0]) and torch.equal(pairwise, saved[1])  # inputs are never mutated


def test_decode_gives_the_best_facts_and_to_parts_inverts_it():
    g = torch.Generator().manual_seed(42)
    theta = random_potentials((4, 3, 3), 3, g)
    crf = HopChainCRF(theta)
    expected = [list(e.parts[e.scores.argmax()].sum(-2).argmax(-1).tolist()) for e in HOPS.enumerate(theta)]
    assert crf.decode().tolist() == expected
    assert torch.equal(crf.to_parts(crf.decode()), crf.argmax)
    assert_close(crf.log_prob(crf.decode()), crf.log_prob(crf.argmax))


@pytest.mark.parametrize("argument, build", [
    ("scores", lambda: HopChainCRF.unary(torch.zeros(2, 3))),
    ("fact_mask", lambda: HopChainCRF.unary(torch.zeros(2, 3, 4), fact_mask=torch.ones(2, 4))),
    ("fact_mask", lambda: HopChainCRF.unary(torch.zeros(2, 3, 4), fact_mask=torch.ones(2, 5, dtype=torch.bool))),
    ("first", lambda: HopChainCRF.binary(torch.zeros(2, 4, 1), torch.zeros(2, 2, 4, 4))),
    ("pairwise", lambda: HopChainCRF.binary(torch.zeros(2, 4), torch.zeros(2, 2, 4, 3))),
    ("pairwise", lambda: HopChainCRF.binary(torch.zeros(2, 4), torch.zeros(2, 2, 5, 5))),
    ("pairwise", lambda: HopChainCRF.binary(torch.zeros(2, 4), torch.zeros(3, 2, 4, 4))),
    ("scores", lambda: HopChainCRF.unary(torch.full((2, 3, 4), math.nan))),
])
def test_constructors_refuse_bad_input_naming_the_argument(argument, build):
    with pytest.raises(ValueError, match=argument):
        build()



def test_log_prob_of_decoded_facts_ignores_hops_past_each_length():
    g = torch.Generator().manual_seed(31)
    theta = torch.randn(3, 4, 3, 3, generator=g, dtype=torch.float64)
    chain = HopChainCRF(theta, torch.tensor([4, 2, 1]))
    torch.testing.assert_close(chain.log_prob(chain.decode()), chain.log_prob(chain.argmax))
