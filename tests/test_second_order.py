"""SecondOrderDependencyCRF: every query against enumerating every projective tree scored by arcs and
adjacent siblings; the first-order CRF when siblings score 0; SuPar's Dependency2oCRF; gradients by the
siblings. (The checks every structure shares, with fixed siblings, are in test_distribution_api.py:
families second-order and second-order-single-root.)"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from brute import (Enumeration, as_multiset, assert_queries_match, projective_trees, random_lengths, random_potentials,
                   sibling_triples)
from structures import ProjectiveDependencyCRF, SecondOrderDependencyCRF


class Trees(Enumeration):
    """Every projective tree of ``n`` words: one-hot arcs ``parts [S, N+1, N+1]``, one-hot siblings
    ``siblings [S, N+1, N+1, N+1]``, scores = arcs + siblings."""

    def __init__(self, arc: torch.Tensor, sib: torch.Tensor, n: int, single_root: bool = False):
        trees = [t for t in projective_trees(n) if not single_root or sum(h == 0 for h, _ in t) == 1]
        super().__init__(arc, trees)
        self.siblings = torch.zeros(len(trees), *sib.shape, dtype=sib.dtype)
        for i, t in enumerate(trees):
            for triple in sibling_triples(t):
                self.siblings[(i, *triple)] = 1.0
        self.scores = self.scores + (self.siblings * sib.nan_to_num(neginf=-1e300)).flatten(1).sum(1).where(
            ~(self.siblings.bool() & sib.isneginf()).flatten(1).any(1), -math.inf)

    @property
    def sibling_marginals(self) -> torch.Tensor:
        return torch.einsum("s,s...->...", self.probs, self.siblings)


def problem(n_max: int, seed: int, forbid: float = 0.0, batch: int = 3):
    g = torch.Generator().manual_seed(seed)
    arc = random_potentials((n_max + 1, n_max + 1), batch, g, forbid)
    sib = random_potentials((n_max + 1,) * 3, batch, g, forbid)
    return arc, sib, random_lengths(batch, n_max, g)


CASES = [(n, single_root, forbid) for n in range(1, 6) for single_root in (False, True) for forbid in (0.0, 0.2)]


@pytest.mark.parametrize("n,single_root,forbid", CASES)
def test_every_query_equals_enumeration_of_every_projective_tree(n, single_root, forbid):
    arc, sib, lengths = problem(n, seed=10 * n + single_root, forbid=forbid)
    q_arc, q_sib, _ = problem(n, seed=99, forbid=forbid)
    d = SecondOrderDependencyCRF(arc, sib, lengths, single_root)
    q = SecondOrderDependencyCRF(q_arc, q_sib, lengths, single_root)
    enums = [Trees(arc[b], sib[b], int(k), single_root) for b, k in enumerate(lengths)]
    q_enums = [Trees(q_arc[b], q_sib[b], int(k), single_root) for b, k in enumerate(lengths)]
    assert_queries_match(d, q, enums, q_enums)
    assert_close(d.sibling_marginals, torch.stack([e.sibling_marginals for e in enums]))
    for b, e in enumerate(enums):
        if e.count:
            best = e.parts[e.scores.argmax()]
            assert torch.equal(d.argmax[b], best)
            assert d.decode()[b].tolist() == d.heads(best).tolist()
            samples = d.sample((4,))[:, b]
            assert not as_multiset(samples.unique(dim=0)) - e.support()  # each sample is a tree


def test_the_convention_on_one_tree():
    """Root -> 2; 2 takes 1 on its left and 3, then 4 on its right: one sibling part, (2, 3, 4)."""
    arc = torch.randn(1, 5, 5, dtype=torch.float64)
    sib = torch.randn(1, 5, 5, 5, dtype=torch.float64)
    heads = torch.tensor([[2, 0, 2, 2]])
    d = SecondOrderDependencyCRF(arc, sib)
    assert d.shared_counts(d.to_parts(heads))["sib"].nonzero().tolist() == [[0, 2, 3, 4]]
    expected = arc[0, 0, 2] + arc[0, 2, 1] + arc[0, 2, 3] + arc[0, 2, 4] + sib[0, 2, 3, 4]
    assert_close(d.score(heads), expected.reshape(1))


def test_entries_outside_the_convention_are_never_used():
    """Sibling scores with s not strictly between h and m (the first modifier's 'sibling' s = h, a
    sibling beyond the modifier, the other side) change nothing."""
    n = 5
    arc, sib, lengths = problem(n, seed=5)
    k = torch.arange(n + 1)
    h, s, m = k[:, None, None], k[None, :, None], k[None, None, :]
    unused = ~(((h < s) & (s < m)) | ((m < s) & (s < h)))
    d = SecondOrderDependencyCRF(arc, sib, lengths)
    e = SecondOrderDependencyCRF(arc, sib.masked_fill(unused, -math.inf), lengths)
    assert_close(e.log_partition, d.log_partition)
    assert_close(e.marginals, d.marginals)


@pytest.mark.parametrize("single_root", [False, True])
def test_zero_siblings_give_the_first_order_crf(single_root):
    arc, sib, lengths = problem(7, seed=6, forbid=0.1, batch=4)
    d = SecondOrderDependencyCRF(arc, torch.zeros_like(sib), lengths, single_root)
    first = ProjectiveDependencyCRF(arc, lengths, single_root)
    assert_close(d.log_partition, first.log_partition)
    assert_close(d.marginals, first.marginals)
    assert torch.equal(d.decode(), first.decode())
    assert torch.equal(d.count, first.count)


@pytest.mark.parametrize("single_root", [False, True])
def test_equals_supar_dependency2o_crf(single_root):
    """SuPar scores arcs [b, m, h] and siblings [b, m, h, s]; its marginals are the arcs' (the
    siblings' are the gradient of its log Z by them); lengths exclude the root as ours."""
    supar = pytest.importorskip("supar.structs")
    arc, sib, lengths = problem(8, seed=7, batch=4)
    a = arc.transpose(1, 2).clone().requires_grad_()
    s = sib.permute(0, 3, 1, 2).clone().requires_grad_()
    peer = supar.Dependency2oCRF((a, s), lengths, multiroot=not single_root)
    d = SecondOrderDependencyCRF(arc, sib, lengths, single_root)
    assert_close(d.log_partition, peer.log_partition)
    assert_close(d.marginals, peer.marginals.transpose(1, 2))
    (sib_grad,) = torch.autograd.grad(peer.log_partition.sum(), s)
    assert_close(d.sibling_marginals, sib_grad.permute(0, 2, 3, 1))
    assert torch.equal(d.decode()[:, :], peer.argmax[:, 1:])


def test_gradcheck_and_gradgradcheck_by_the_siblings_in_float64():
    """Three words: siblings on both sides of a head. (By the arcs, the potentials, with lengths:
    test_distribution_api.py, family second-order.)"""
    arc, sib, _ = problem(3, seed=8, batch=1)
    sib.requires_grad_()

    def log_z(s):
        return SecondOrderDependencyCRF(arc, s).log_partition

    def marginals(s):
        return SecondOrderDependencyCRF(arc, s).marginals

    assert torch.autograd.gradcheck(log_z, (sib,))
    assert torch.autograd.gradcheck(marginals, (sib,))
    assert torch.autograd.gradgradcheck(log_z, (sib,))


def test_inputs_are_not_mutated():
    arc, sib, lengths = problem(4, seed=9, forbid=0.2)
    before = arc.clone(), sib.clone(), lengths.clone()
    d = SecondOrderDependencyCRF(arc, sib, lengths)
    for query in (lambda: d.marginals, lambda: d.sibling_marginals, lambda: d.decode(), lambda: d.sample((2,)),
                  lambda: d.topk(2), lambda: d.entropy(), lambda: d.log_prob(d.decode())):
        query()
    assert torch.equal(arc, before[0]) and torch.equal(sib, before[1]) and torch.equal(lengths, before[2])


@pytest.mark.parametrize("sib_shape", [(2, 4, 4), (2, 4, 4, 5), (2, 5, 5, 5), (1, 4, 4, 4)], ids=str)
def test_bad_sibling_shapes_raise_value_error_naming_siblings_and_shape(sib_shape):
    with pytest.raises(ValueError, match=r"siblings: expected .*shape \[B, N"):
        SecondOrderDependencyCRF(torch.zeros(2, 4, 4), torch.zeros(sib_shape))


def test_nan_siblings_raise_value_error():
    with pytest.raises(ValueError, match="siblings: contains NaN"):
        SecondOrderDependencyCRF(torch.zeros(1, 4, 4), torch.full((1, 4, 4, 4), math.nan))
