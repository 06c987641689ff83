"""ConstituencyCRF against enumeration, against torch-struct's TreeCRF and SuPar's ConstituencyCRF, and
its spans / bracket strings. (The shared distribution API runs on it via tests/brute.py.)"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.testing import assert_close

from brute import CONSTITUENCY, random_lengths, random_potentials
from structures import ConstituencyCRF


def catalan(k: int) -> int:
    return math.comb(2 * k, k) // (k + 1)


def test_count_is_catalan_times_a_label_per_span():
    """n words have Catalan(n-1) binary trees, each with 2n - 1 spans that take any of L labels."""
    N, L = 9, 3
    lengths = torch.arange(1, N + 1)
    count = ConstituencyCRF(torch.zeros(N, N, N, L), lengths).count
    assert count.tolist() == [catalan(n - 1) * L ** (2 * n - 1) for n in range(1, N + 1)]


@pytest.mark.parametrize("forbid", [0.0, 0.3])
def test_every_query_equals_enumeration_at_four_words_two_labels(forbid):
    """640 labelled trees per example (lengths 4, 1, 3): log Z, marginals, the best tree and its score."""
    g = torch.Generator().manual_seed(7)
    theta = random_potentials((4, 4, 2), 3, g, forbid)
    lengths = torch.tensor([4, 1, 3])
    d = ConstituencyCRF(theta, lengths)
    enums = CONSTITUENCY.enumerate(theta, lengths)
    assert_close(d.log_partition, torch.stack([e.log_partition for e in enums]))
    assert_close(d.marginals, torch.stack([e.marginals for e in enums]))
    assert_close(d.max, torch.stack([e.max for e in enums]))
    for b, e in enumerate(enums):
        if e.count:
            assert e.scores[e.index(d.argmax[b])] == e.max


def peers_scores(B: int = 3, N: int = 7, L: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return random_potentials((N, N, L), B, g), random_lengths(B, N, g)


def test_log_partition_and_marginals_equal_torch_struct_tree_crf():
    """torch-struct 0.5 ``TreeCRF`` takes the same tensor [B, N, N, NT] (span i..j inclusive, label
    last): the conversion is the identity. (0.5 needs a non-leaf potential that requires grad.)"""
    torch_struct = pytest.importorskip("torch_struct")
    theta, lengths = peers_scores()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch-struct's Distribution has no arg_constraints
        peer = torch_struct.TreeCRF(theta.clone().requires_grad_() * 1, lengths=lengths)
    d = ConstituencyCRF(theta, lengths)
    assert_close(d.log_partition, peer.partition.detach())
    assert_close(d.marginals, peer.marginals.detach())


def test_log_partition_and_span_marginals_equal_supar_on_fenceposts():
    """SuPar's ``ConstituencyCRF`` scores unlabelled spans between fenceposts: its [b, i, j+1] is our
    span i..j with the labels summed out (logsumexp), and its marginals are ours summed over labels."""
    structs = pytest.importorskip("supar.structs")
    theta, lengths = peers_scores()
    B, N = theta.shape[:2]
    fence = torch.full((B, N + 1, N + 1), -1e4, dtype=theta.dtype)
    fence[:, :-1, 1:] = theta.logsumexp(-1)
    peer = structs.ConstituencyCRF(fence.requires_grad_(), lengths)
    d = ConstituencyCRF(theta, lengths)
    assert_close(d.log_partition, peer.log_partition.detach())
    upper = torch.ones(N, N, dtype=torch.bool).triu()
    assert_close(d.marginals.sum(-1), peer.marginals.detach()[:, :-1, 1:] * upper)


@pytest.mark.parametrize("with_lengths", [False, True])
def test_gradcheck_float64(with_lengths):
    g = torch.Generator().manual_seed(3)
    theta = random_potentials((4, 4, 2), 2, g).requires_grad_()
    lengths = torch.tensor([4, 2]) if with_lengths else None
    assert torch.autograd.gradcheck(lambda x: ConstituencyCRF(x, lengths).log_partition, (theta,))
    assert torch.autograd.gradgradcheck(lambda x: ConstituencyCRF(x, lengths).log_partition, (theta,))
    assert torch.autograd.gradcheck(lambda x: ConstituencyCRF(x, lengths).marginals, (theta,))


# ---------------------------------------------------------------- spans and brackets

TREE = [(0, 4, 0), (0, 1, 1), (0, 0, 2), (1, 1, 3), (2, 4, 0), (2, 2, 3), (3, 4, 1), (3, 3, 2), (4, 4, 3)]


def forced(tree: list[tuple[int, int, int]], N: int = 5, L: int = 4) -> torch.Tensor:
    """Potentials [1, N, N, L] under which ``tree`` is far ahead of every other tree."""
    theta = torch.randn(1, N, N, L, generator=torch.Generator().manual_seed(5))
    for s, t, label in tree:
        theta[0, s, t, label] += 20.0
    return theta


def test_decode_gives_the_best_tree_as_spans_in_preorder():
    d = ConstituencyCRF(forced(TREE))
    assert d.decode().tolist() == [[list(span) for span in TREE]]


def test_decode_pads_with_minus_one_past_each_length_and_where_nothing_is_left():
    theta = forced(TREE).repeat(3, 1, 1, 1)
    theta[2] = -math.inf
    spans = ConstituencyCRF(theta, torch.tensor([5, 2, 5])).decode()
    assert spans.shape == (3, 9, 3)
    assert (spans[1, 3:] == -1).all() and (spans[1, :3] >= 0).all()
    assert (spans[2] == -1).all()


def test_brackets_write_labels_and_words():
    d = ConstituencyCRF(forced(TREE))
    words = ["the dog saw a cat".split()]
    assert d.brackets(words=words, labels=["S", "NP", "D", "N"]) == [
        "(S (NP (D the) (N dog)) (S (N saw) (NP (D a) (N cat))))"]
    assert d.brackets() == ["(0 (1 (2 0) (3 1)) (0 (3 2) (1 (2 3) (3 4))))"]


def test_to_parts_inverts_spans_and_log_prob_takes_spans():
    g = torch.Generator().manual_seed(8)
    d = ConstituencyCRF(random_potentials((5, 5, 3), 2, g), torch.tensor([5, 3]))
    samples = d.sample((4,))
    spans = d.spans(samples)
    assert spans.shape == (4, 2, 9, 3)
    assert torch.equal(d.to_parts(spans), samples)
    assert_close(d.log_prob(spans), d.log_prob(samples))
    assert_close(d.log_prob(d.decode()), d.max - d.log_partition)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("shape", [(2, 4, 4), (2, 4, 5, 3), (2, 4, 4, 3, 1)], ids=str)
def test_bad_shapes_raise_value_error_naming_the_expected_shape(shape):
    with pytest.raises(ValueError, match=r"log_potentials: expected shape \[B, N, N, L\]"):
        ConstituencyCRF(torch.zeros(shape))


@pytest.mark.parametrize("spans, message", [
    (torch.zeros(2, 9, 2, dtype=torch.long), r"\[\.\.\., 2, S, 3\]"),
    (torch.zeros(2, 9, 3), r"\[\.\.\., 2, S, 3\]"),
    (torch.tensor([[[0, 5, 0]], [[0, 0, 0]]]), "0 <= start <= end < 5"),
    (torch.tensor([[[2, 1, 0]], [[0, 0, 0]]]), "0 <= start <= end < 5"),
    (torch.tensor([[[0, 0, 3]], [[0, 0, 0]]]), "labels in 0..2"),
], ids=["not triples", "float", "end too far", "end before start", "label"])
def test_bad_spans_raise_value_error(spans, message):
    d = ConstituencyCRF(torch.zeros(2, 5, 5, 3))
    with pytest.raises(ValueError, match=message):
        d.to_parts(spans)
