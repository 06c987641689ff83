"""structures.Distribution, the base of every structure: a structure that is not a dynamic program
registers one algorithm per semiring and gets the whole API and its validation from the base.

The structure here is the smallest one: independent bits ``z ∈ {0, 1}^n`` with ``p(z) ∝ exp⟨θ, z⟩``
(potentials ``[B, N]``, ``lengths[b]`` bits), checked against every assignment."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.testing import assert_close

import semiring as sr
from semiring.semirings import CountSemiring, KMax, LogSemiring, MaxSemiring, RealSemiring, SampledSemiring
from structures import Distribution, NonProjectiveDependencyCRF, StructuredDistribution
from structures.base import algorithm


class Bits(Distribution):
    """Independent bits: ``log_potentials[b, i]`` scores bit i being 1."""

    shape = "B, N"

    @property
    def max_length(self) -> int:
        return self._theta.shape[-1]

    def _inside(self, theta: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        n = torch.full((theta.shape[0],), self.max_length) if lengths is None else lengths
        return torch.arange(theta.shape[-1]) < n[:, None]

    @algorithm(LogSemiring)
    def _log(self, semiring, theta, lengths):
        return torch.nn.functional.softplus(theta).masked_fill(~self._inside(theta, lengths), 0.0).sum(-1)

    @algorithm(MaxSemiring)
    def _max(self, semiring, theta, lengths):
        return theta.relu().masked_fill(~self._inside(theta, lengths), 0.0).sum(-1)

    @algorithm(SampledSemiring)
    def _sample(self, semiring, theta, lengths):
        p = torch.sigmoid(theta.detach()) * self._inside(theta, lengths)
        z = torch.bernoulli(p, generator=semiring.generator)
        return (theta.masked_fill(~torch.isfinite(theta), 0.0) * z).sum(-1)

    @algorithm(CountSemiring)
    def _count(self, semiring, theta, lengths):
        return (torch.isfinite(theta) & self._inside(theta, lengths)).sum(-1).double().exp2()


def every_assignment(theta: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(z [S, N], p [S])``: every assignment of the first n bits of one example, and its probability."""
    z = torch.tensor(list(itertools.product([0.0, 1.0], repeat=n)), dtype=theta.dtype).reshape(-1, n)
    z = torch.cat([z, z.new_zeros(z.shape[0], theta.shape[-1] - n)], 1)
    return z, torch.softmax(z @ theta, 0)


def test_registered_algorithms_give_every_query():
    theta = torch.randn(2, 4, dtype=torch.float64)
    lengths = torch.tensor([4, 2])
    d, q = Bits(theta, lengths), Bits(torch.randn(2, 4, dtype=torch.float64), lengths)
    for b in range(2):
        n = int(lengths[b])
        z, p = every_assignment(theta[b], n)
        assert_close(d.log_partition[b], torch.logsumexp(z @ theta[b], 0))
        assert_close(d.marginals[b], p @ z)
        assert_close(d.entropy()[b], -(p * p.log()).sum())
        assert_close(d.log_prob(z[:, None].expand(-1, 2, -1))[:, b], p.log())
        assert torch.equal(d.argmax[b], z[p.argmax()])
        assert d.count[b] == 2**n
        _, pq = every_assignment(q.log_potentials[b], n)
        assert_close(d.kl(q)[b], (p * (p.log() - pq.log())).sum())
    samples = d.sample((3, 5), generator=torch.Generator().manual_seed(0))
    assert samples.shape == (3, 5, 2, 4) and not samples[..., 1, 2:].any()


def test_the_base_validates_what_a_registered_structure_is_given():
    theta = torch.randn(2, 4)
    with pytest.raises(ValueError, match="log_potentials"):
        Bits(theta.masked_fill(theta > 0, math.nan))
    with pytest.raises(ValueError, match="lengths"):
        Bits(theta, torch.tensor([5, 1]))
    with pytest.raises(ValueError, match="sample_shape"):
        Bits(theta).sample((-1,))
    d = Bits(theta, torch.tensor([4, 2]))
    past = torch.tensor([[1.0, 0, 0, 1], [1, 0, 1, 0]])  # example 1 sets a bit past its length
    assert torch.isneginf(d.log_prob(past)[1]) and torch.isfinite(d.log_prob(past)[0])
    assert torch.isneginf(d.log_prob(past * 0.5)).all()  # not one-hot
    with pytest.raises(ValueError, match="q"):
        d.kl(Bits(theta))  # other lengths


def test_a_semiring_without_an_algorithm_names_those_there_are():
    with pytest.raises(NotImplementedError, match="no algorithm for the SignedLog semiring.*LogSemiring"):
        Bits(torch.randn(1, 3)).run(sr.SignedLog)
    with pytest.raises(NotImplementedError, match="KMax"):
        Bits(torch.randn(1, 3)).topk(2)


def test_each_structure_registers_its_own_algorithms():
    assert set(NonProjectiveDependencyCRF.algorithms) == {
        LogSemiring, RealSemiring, MaxSemiring, KMax, SampledSemiring, CountSemiring}
    assert set(Bits.algorithms) == {LogSemiring, MaxSemiring, SampledSemiring, CountSemiring}
    assert StructuredDistribution.algorithms == {}  # it runs its program in any semiring
    assert Distribution.algorithms == {}
