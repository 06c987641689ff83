"""The ``from_supar`` constructors against SuPar's formulas, reimplemented here (SuPar is not
installed): each example's log Z is the logsumexp, over every structure enumerated by brute force,
of the score SuPar's docstrings define in SuPar's own layout (``[b, dependent, head]`` arcs,
``[b, modifier, head, sibling]`` siblings, fencepost spans, a start/end row and column in the
chain's transitions)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.testing import assert_close

from brute import binary_trees, compositions, dependency_trees, projective_trees
from structures import (ConstituencyCRF, EmissionCRF, NonProjectiveDependencyCRF, ProjectiveDependencyCRF,
                        SecondOrderDependencyCRF, SemiMarkovCRF)

LENGTHS = torch.tensor([4, 2, 3])


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def logsumexp(scores: list[torch.Tensor]) -> torch.Tensor:
    return torch.logsumexp(torch.stack(scores), 0)


def test_chain_is_supars_linear_chain_crf():
    """SuPar: trans[-1, t_0] + Σ_i scores[i, t_i] + Σ_i trans[t_i, t_{i+1}] + trans[t_{n-1}, -1]."""
    T = 3
    scores, trans = randn(3, 4, T), randn(T + 1, T + 1, seed=1)
    d = EmissionCRF.from_supar(scores, trans, LENGTHS)
    for b, n in enumerate(LENGTHS.tolist()):
        def score(tags):
            inner = sum(trans[p, q] for p, q in zip(tags, tags[1:]))
            return trans[-1, tags[0]] + sum(scores[b, i, t] for i, t in enumerate(tags)) + inner + trans[tags[-1], -1]
        everything = {tags: score(tags) for tags in itertools.product(range(T), repeat=n)}
        assert_close(d.log_partition[b], logsumexp(list(everything.values())))
        best = max(everything, key=everything.get)
        assert d.decode()[b, :n].tolist() == list(best)


def test_semimarkov_is_supars_semimarkov_crf():
    """SuPar: Σ over segments i..j (inclusive) labelled t of scores[i, j, t], plus trans[t, t'] for
    every pair of consecutive segments labelled t, t'; segments of any length."""
    T = 2
    scores, trans = randn(3, 4, 4, T), randn(T, T, seed=1)
    d = SemiMarkovCRF.from_supar(scores, trans, LENGTHS)
    for b, n in enumerate(LENGTHS.tolist()):
        everything = []
        for sizes in compositions(n, n):
            ends = list(itertools.accumulate(sizes))
            spans = [(end - size, end - 1) for size, end in zip(sizes, ends)]
            for labels in itertools.product(range(T), repeat=len(spans)):
                s = sum(scores[b, i, j, t] for (i, j), t in zip(spans, labels))
                everything.append(s + sum(trans[p, q] for p, q in zip(labels, labels[1:])))
        assert_close(d.log_partition[b], logsumexp(everything))


@pytest.mark.parametrize("multiroot", [False, True], ids=["one root child (SuPar's default)", "multiroot"])
@pytest.mark.parametrize("cls, trees", [(ProjectiveDependencyCRF, projective_trees), (NonProjectiveDependencyCRF, dependency_trees)],
                         ids=["DependencyCRF", "MatrixTree"])
def test_dependency_is_supars_dependency_crf(cls, trees, multiroot):
    """SuPar: Σ over words d with head h of scores[d, h]."""
    scores = randn(3, 5, 5)
    d = cls.from_supar(scores, LENGTHS, multiroot=multiroot)
    for b, n in enumerate(LENGTHS.tolist()):
        kept = [arcs for arcs in trees(n) if multiroot or sum(h == 0 for h, _ in arcs) == 1]
        assert_close(d.log_partition[b], logsumexp([sum(scores[b, m, h] for h, m in arcs) for arcs in kept]))


def siblings_of(arcs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(head, sibling, modifier) of every two adjacent modifiers on one side of a head, the sibling closer."""
    out = []
    for h in {h for h, _ in arcs}:
        right = sorted(m for g, m in arcs if g == h and m > h)
        left = sorted((m for g, m in arcs if g == h and m < h), reverse=True)
        out += [(h, s, m) for side in (right, left) for s, m in zip(side, side[1:])]
    return out


@pytest.mark.parametrize("multiroot", [False, True], ids=["one root child (SuPar's default)", "multiroot"])
def test_second_order_is_supars_dependency2o_crf(multiroot):
    """SuPar: Σ scores[d, h] over arcs plus Σ sibs[m, h, s] over adjacent siblings s, m of h."""
    arcs, sibs = randn(3, 5, 5), randn(3, 5, 5, 5, seed=1)
    d = SecondOrderDependencyCRF.from_supar((arcs, sibs), LENGTHS, multiroot=multiroot)
    for b, n in enumerate(LENGTHS.tolist()):
        everything = [sum(arcs[b, m, h] for h, m in tree) + sum(sibs[b, m, h, s] for h, s, m in siblings_of(tree))
                      for tree in projective_trees(n) if multiroot or sum(h == 0 for h, _ in tree) == 1]
        assert_close(d.log_partition[b], logsumexp(everything))


@pytest.mark.parametrize("labels", [None, 2], ids=["unlabelled", "labelled"])
def test_constituency_is_supars_constituency_crf(labels):
    """SuPar: Σ over the spans of a binary tree (the words and the sentence included), fenceposts
    [i, k] covering words i..k-1, of scores[i, k] (summed over the labels where there are labels)."""
    scores = randn(3, 5, 5) if labels is None else randn(3, 5, 5, labels)
    d = ConstituencyCRF.from_supar(scores, LENGTHS)
    per_span = scores if labels is None else scores.logsumexp(-1)
    for b, n in enumerate(LENGTHS.tolist()):
        trees = [tree + [(i, i + 1) for i in range(n)] for tree in binary_trees(0, n)]
        assert_close(d.log_partition[b], logsumexp([sum(per_span[b, i, k] for i, k in tree) for tree in trees]))
