"""HMM: the posterior over states against enumeration, EM against a hand-written Baum-Welch, the metrics
of the POS-induction experiment on hand-made examples, and the experiment's quick run. (The checks every
structure shares, on the emission scores of the words, are in test_distribution_api.py: family hmm.)"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from brute import random_lengths
from structures import HMM, HMMParameters
from structures.experiments import default_data_dir, hmm_pos
from structures.experiments.clustering import many_to_one, v_measure
from structures.hmm import batches, em_step, fit


def random_problem(B: int, N: int, C: int, V: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    params = HMMParameters.random(C, V, noise=3.0, generator=g)
    words = torch.randint(0, V, (B, N), generator=g)
    return params, words, random_lengths(B, N, g)


def joint(params: HMMParameters, x: list[int], z: tuple[int, ...]) -> torch.Tensor:
    """log p(x, z), straight from the definition."""
    return (params.start[z[0]] + sum(params.emission[z[i], x[i]] for i in range(len(x)))
            + sum(params.transitions[z[i], z[i + 1]] for i in range(len(x) - 1)))


@pytest.mark.parametrize("N, C", [(1, 3), (3, 1), (3, 2), (4, 3)])
def test_likelihood_marginals_viterbi_counts_and_samples_match_enumeration(N, C):
    params, words, lengths = random_problem(3, N, C, 4, seed=10 * N + C)
    hmm = params.posterior(words, lengths)
    counts, log_z = hmm.expected_counts()
    brute = {k: torch.zeros_like(v) for k, v in counts.items()}
    for b in range(3):
        x = words[b, :lengths[b]].tolist()
        zs = list(itertools.product(range(C), repeat=len(x)))
        scores = torch.stack([joint(params, x, z) for z in zs])
        log_px = torch.logsumexp(scores, 0)
        assert_close(hmm.log_partition[b], log_px)
        assert_close(log_z[b], log_px)
        p = (scores - log_px).exp()
        mu = torch.zeros(N, C, dtype=torch.float64)
        for z, pz in zip(zs, p):
            mu[range(len(x)), z] += pz
            brute["start"][z[0]] += pz
            for i in range(len(x) - 1):
                brute["transitions"][z[i], z[i + 1]] += pz
            for i, w in enumerate(x):
                brute["emission"][z[i], w] += pz
        assert_close(hmm.marginals[b], mu)
        assert hmm.decode()[b, :len(x)].tolist() == list(zs[int(scores.argmax())])
        assert hmm.posterior_decode()[b].tolist() == (mu.argmax(-1) * (torch.arange(N) < len(x))).tolist()
        assert_close(hmm.log_prob(hmm.decode())[b], scores.max() - log_px)
    for k in counts:
        assert_close(counts[k], brute[k])


def test_samples_follow_the_posterior():
    params, words, lengths = random_problem(2, 3, 2, 3, seed=5)
    hmm = params.posterior(words, lengths)
    draws = hmm.sample((4000,))  # [S, B, N, C] one-hot states
    for b in range(2):
        n = int(lengths[b])
        seen = Counter(tuple(d[b, :n].argmax(-1).tolist()) for d in draws)
        for z in itertools.product(range(2), repeat=n):
            p = (joint(params, words[b, :n].tolist(), z) - hmm.log_partition[b]).exp().item()
            assert abs(seen[z] / 4000 - p) < 4 * math.sqrt(p * (1 - p) / 4000) + 1e-3


def baum_welch(params: HMMParameters, sequences: list[list[int]], smoothing: float) -> tuple[HMMParameters, float]:
    """One EM step written out with loops in probability space (Rabiner 1989): forward α, backward β,
    γ and ξ per position, counts summed over the sequences, rows normalized."""
    pi, A, E = (np.exp(t.numpy()) for t in (params.start, params.transitions, params.emission))
    C, V = E.shape
    start, trans, emit, ll = np.zeros(C), np.zeros((C, C)), np.zeros((C, V)), 0.0
    for x in sequences:
        n = len(x)
        alpha, beta = np.zeros((n, C)), np.ones((n, C))
        for c in range(C):
            alpha[0, c] = pi[c] * E[c, x[0]]
        for i in range(1, n):
            for c in range(C):
                alpha[i, c] = sum(alpha[i - 1, y] * A[y, c] for y in range(C)) * E[c, x[i]]
        for i in range(n - 2, -1, -1):
            for y in range(C):
                beta[i, y] = sum(A[y, c] * E[c, x[i + 1]] * beta[i + 1, c] for c in range(C))
        px = alpha[n - 1].sum()
        ll += math.log(px)
        for c in range(C):
            start[c] += alpha[0, c] * beta[0, c] / px
            for i in range(n):
                emit[c, x[i]] += alpha[i, c] * beta[i, c] / px
            for i in range(n - 1):
                for d in range(C):
                    trans[c, d] += alpha[i, c] * A[c, d] * E[d, x[i + 1]] * beta[i + 1, d] / px
    rows = [(m + smoothing) / (m + smoothing).sum(-1, keepdims=True) for m in (start, trans, emit)]
    with np.errstate(divide="ignore"):  # log 0 = -inf: an event never counted
        return HMMParameters(*(torch.from_numpy(np.log(r)) for r in rows)), ll


@pytest.mark.parametrize("smoothing", [0.0, 0.5])
def test_em_step_matches_a_hand_written_baum_welch(smoothing):
    params, words, lengths = random_problem(5, 4, 3, 6, seed=3)
    sequences = [words[b, :lengths[b]].tolist() for b in range(5)]
    ours, ll = em_step(params, batches(sequences, batch_size=2), smoothing)
    reference, reference_ll = baum_welch(params, sequences, smoothing)
    assert ll == pytest.approx(reference_ll, rel=1e-12)
    for k in ("start", "transitions", "emission"):
        assert_close(getattr(ours, k), getattr(reference, k))


def test_em_never_decreases_the_likelihood():
    params, words, lengths = random_problem(20, 8, 4, 7, seed=4)
    data = batches([words[b, :lengths[b]].tolist() for b in range(20)], batch_size=6)
    _, history = fit(params, data, iterations=15)
    assert len(history) == 15
    assert all(b >= a - 1e-9 for a, b in zip(history, history[1:]))
    assert history[-1] > history[0] + 1


def test_the_log_likelihood_gradient_is_the_expected_counts():
    params, words, lengths = random_problem(3, 4, 3, 5, seed=6)
    leaves = [t.clone().requires_grad_() for t in (params.start, params.transitions, params.emission)]
    log_px = HMM(words, leaves[2], leaves[1], leaves[0], lengths).log_partition.sum()
    grads = torch.autograd.grad(log_px, leaves)
    counts, _ = params.posterior(words, lengths).expected_counts()
    for g, k in zip(grads, ("start", "transitions", "emission")):
        assert_close(g, counts[k])


@pytest.mark.parametrize("with_lengths", [False, True])
def test_gradcheck_and_gradgradcheck_float64(with_lengths):
    """log p(x) and the posterior marginals are differentiable in float64 w.r.t. every parameter,
    to second order for log p(x), with and without lengths (padding included)."""
    params, words, lengths = random_problem(3, 4, 3, 5, seed=11)
    lengths = lengths if with_lengths else None
    leaves = tuple(t.clone().requires_grad_() for t in (params.emission, params.transitions, params.start))

    def log_px(emission, transitions, start):
        return HMM(words, emission, transitions, start, lengths).log_partition

    def marginals(emission, transitions, start):
        return HMM(words, emission, transitions, start, lengths).marginals

    assert torch.autograd.gradcheck(log_px, leaves)
    assert torch.autograd.gradgradcheck(log_px, leaves)
    assert torch.autograd.gradcheck(marginals, leaves)


def test_a_sequence_of_probability_zero_counts_nothing():
    params, words, lengths = random_problem(3, 4, 3, 5, seed=7)
    emission = torch.cat([params.emission, torch.full((3, 1), -math.inf, dtype=torch.float64)], 1)  # a word never emitted
    words = words.clone()
    words[0, 0] = 5  # ... is the first of example 0
    hmm = HMM(words, emission, params.transitions, params.start, lengths)
    counts, log_z = hmm.expected_counts()
    assert log_z[0] == -math.inf and torch.isfinite(log_z[1:]).all()
    assert (hmm.marginals[0] == 0).all()
    assert all(torch.isfinite(v).all() for v in counts.values())
    others, _ = HMM(words[1:], emission, params.transitions, params.start, lengths[1:]).expected_counts()
    for k in counts:
        assert_close(counts[k], others[k])


def test_padding_and_batch_size_change_nothing():
    params, words, lengths = random_problem(7, 5, 3, 6, seed=8)
    sequences = [words[b, :lengths[b]].tolist() for b in range(7)]
    one = em_step(params, batches(sequences, 1), 0.1)
    many = em_step(params, batches(sequences, 3), 0.1)
    assert one[1] == pytest.approx(many[1], rel=1e-12)
    for k in ("start", "transitions", "emission"):
        assert_close(getattr(one[0], k), getattr(many[0], k))
    for batch in batches(sequences, 3):
        assert [sequences[i] for i in batch.index] == [w[:n].tolist() for w, n in zip(batch.words, batch.lengths)]


@pytest.mark.parametrize("argument, kwargs", [
    ("words", dict(words=torch.zeros(2, 4))),
    ("words", dict(words=torch.full((2, 4), 6))),
    ("words", dict(words=torch.full((2, 4), -1))),
    ("words", dict(words=torch.tensor([[0, 0, 0, 9], [0, 0, 0, 0]]), lengths=torch.tensor([4, 2]))),
    ("transitions", dict(transitions=torch.zeros(3, 4))),
    ("start", dict(start=torch.zeros(2))),
])
def test_bad_input_names_the_argument(argument, kwargs):
    inputs = dict(words=torch.zeros(2, 4, dtype=torch.long), emission=torch.zeros(3, 6), transitions=torch.zeros(3, 3),
                  start=torch.zeros(3), lengths=None)
    with pytest.raises(ValueError, match=argument):
        HMM(**{**inputs, **kwargs})


def test_words_past_each_length_are_ignored():
    params, words, lengths = random_problem(3, 4, 3, 5, seed=9)
    padded = words.masked_fill(torch.arange(4) >= lengths.unsqueeze(-1), 99)  # not even a word id
    assert_close(params.posterior(padded, lengths).marginals, params.posterior(words, lengths).marginals)


def test_many_to_one_maps_each_cluster_to_its_most_frequent_class():
    assert many_to_one([0, 0, 1, 1], ["a", "a", "b", "b"]) == 1.0
    assert many_to_one([7, 7, 3, 3], ["a", "a", "b", "b"]) == 1.0  # names of clusters do not matter
    assert many_to_one([0, 0, 0, 1], ["a", "a", "b", "b"]) == 0.75
    assert many_to_one([0, 1, 2, 3], ["a", "a", "b", "b"]) == 1.0  # one cluster per token
    assert many_to_one([0, 0, 0, 0, 0], ["a", "a", "a", "b", "c"]) == 0.6


def test_v_measure_on_hand_made_clusterings():
    assert v_measure([0, 0, 1, 1], ["a", "a", "b", "b"]) == (1.0, 1.0, 1.0)
    h, c, v = v_measure([0, 0, 0, 0], ["a", "a", "b", "b"])  # one cluster: complete, not homogeneous
    assert (h, c, v) == (pytest.approx(0.0), 1.0, pytest.approx(0.0))
    h, c, v = v_measure([0, 1, 2, 3], ["a", "a", "b", "b"])  # one cluster per token: homogeneous, not complete
    assert (h, c) == (pytest.approx(1.0), pytest.approx(0.5))
    assert v == pytest.approx(2 / 3)
    # clusters {a, a, b} and {b}: H(gold) = log 2, H(gold | cluster) = 3/4 H(2/3, 1/3), H(cluster) = H(3/4, 1/4),
    # H(cluster | gold) = 1/2 H(1/2, 1/2)
    h, c, v = v_measure([0, 0, 0, 1], ["a", "a", "b", "b"])
    H = lambda *p: -sum(q * math.log(q) for q in p)  # noqa: E731
    assert h == pytest.approx(1 - 0.75 * H(2 / 3, 1 / 3) / math.log(2))
    assert c == pytest.approx(1 - 0.5 * math.log(2) / H(0.75, 0.25))
    assert v == pytest.approx(2 * h * c / (h + c))
    with pytest.raises(ValueError, match="predicted, gold"):
        v_measure([0], ["a", "b"])


@pytest.mark.skipif(not (default_data_dir() / "ud" / "UD_English-EWT").exists(), reason="UD English EWT is not in ../shared/data")
def test_quick_command(tmp_path):
    result = hmm_pos.main(["--quick", "--out", str(tmp_path)])
    assert 0 < result["many_to_one"]["viterbi"] <= 1 and 0 <= result["v_measure"]["viterbi"] <= 1
    assert all(b >= a - 1e-6 * abs(a) for a, b in zip(result["log_likelihood"], result["log_likelihood"][1:]))
    assert (tmp_path / "hmm_pos_log_likelihood.png").exists()
