"""ProjectiveDependencyCRF: closed-form counts, heads, the root constraint."""

from __future__ import annotations

import math

import pytest
import torch

from brute import PROJECTIVE, PROJECTIVE_SINGLE_ROOT, projective_trees, random_lengths, random_potentials
from structures import ProjectiveDependencyCRF


@pytest.mark.parametrize("n", range(1, 9))
def test_counts_are_the_closed_forms(n):
    """Multi-root: binom(3n, n)/(2n+1); single root: binom(3n-2, n-1)/n (projective trees)."""
    theta = torch.zeros(1, n + 1, n + 1)
    assert ProjectiveDependencyCRF(theta).count.item() == math.comb(3 * n, n) // (2 * n + 1)
    assert ProjectiveDependencyCRF(theta, single_root=True).count.item() == math.comb(3 * n - 2, n - 1) // n


@pytest.mark.parametrize("n", range(1, 6))
def test_forbidding_arcs_into_a_word_leaves_the_trees_without_them(n):
    theta = torch.zeros(1, n + 1, n + 1)
    theta[0, 0, 1] = -math.inf  # word 1 may not attach to the root
    expected = sum(1 for t in projective_trees(n) if (0, 1) not in t)
    assert ProjectiveDependencyCRF(theta).count.item() == expected


@pytest.mark.parametrize("family", [PROJECTIVE, PROJECTIVE_SINGLE_ROOT], ids=str)
def test_decode_gives_the_heads_of_the_best_tree_and_to_parts_inverts_it(family):
    g = torch.Generator().manual_seed(3)
    theta = random_potentials((6, 6), 4, g)
    lengths = random_lengths(4, 5, g)
    tree = family.cls(theta, lengths)
    heads = tree.decode()
    for b, (e, n) in enumerate(zip(family.enumerate(theta, lengths), lengths.tolist())):
        best = e.parts[e.scores.argmax()]
        assert heads[b, :n].tolist() == best[:, 1 : n + 1].argmax(0).tolist()
        assert heads[b, n:].eq(0).all()
    assert torch.equal(tree.to_parts(heads), tree.argmax)
    torch.testing.assert_close(tree.log_prob(heads), tree.log_prob(tree.argmax))


def test_single_root_trees_give_the_root_exactly_one_child():
    g = torch.Generator().manual_seed(4)
    tree = ProjectiveDependencyCRF(random_potentials((7, 7), 3, g), single_root=True)
    samples = tree.sample((200,))
    assert samples[..., 0, 1:].sum(-1).eq(1).all()
    torch.testing.assert_close(tree.marginals[:, 0, 1:].sum(-1), torch.ones(3, dtype=torch.float64))


def test_every_word_has_one_head_in_every_sample():
    g = torch.Generator().manual_seed(5)
    lengths = torch.tensor([6, 3])
    samples = ProjectiveDependencyCRF(random_potentials((7, 7), 2, g), lengths).sample((100,))
    heads_per_word = samples[..., 1:].sum(-2)  # [S, B, N]
    assert heads_per_word[:, 0].eq(1).all()
    assert heads_per_word[:, 1, :3].eq(1).all() and heads_per_word[:, 1, 3:].eq(0).all()


@pytest.mark.parametrize("single_root", [False, True])
def test_derivatives_to_the_third_order_of_a_nonlinear_loss(single_root):
    """A loss on the marginals whose own gradient depends on θ (here ∂(log Z)²/∂θ, whose gradient
    weights the marginals by 2 log Z): the tape's gradient node, its forward-mode Hessian-vector
    product and the third order behind it, all against finite differences."""
    g = torch.Generator().manual_seed(3)
    theta = random_potentials((4, 4), 2, g).requires_grad_()
    lengths = torch.tensor([3, 2])

    def gradient_of_squared_log_z(x):
        log_z = ProjectiveDependencyCRF(x, lengths, single_root=single_root).log_partition
        return torch.autograd.grad(log_z.pow(2).sum(), x, create_graph=True)[0]

    assert torch.autograd.gradcheck(gradient_of_squared_log_z, (theta,))
    assert torch.autograd.gradgradcheck(gradient_of_squared_log_z, (theta,))
