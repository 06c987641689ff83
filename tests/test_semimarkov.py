"""SemiMarkovCRF: closed-form counts and per-position labels."""

from __future__ import annotations

import math

import pytest
import torch

from brute import SEMIMARKOV, random_lengths, random_potentials
from structures import SemiMarkovCRF


def compositions(n: int, parts: int, K: int) -> int:
    """Compositions of n into ``parts`` parts of size 1..K, by inclusion-exclusion over the parts above K."""
    return sum((-1) ** j * math.comb(parts, j) * math.comb(n - j * K - 1, parts - 1)
               for j in range(parts + 1) if n - j * K - 1 >= parts - 1)


@pytest.mark.parametrize("N", range(1, 11))
@pytest.mark.parametrize("K", range(1, 5))
@pytest.mark.parametrize("C", range(1, 4))
def test_count_is_compositions_into_parts_up_to_k_times_c_per_part(N, K, C):
    lengths = torch.arange(N, 0, -1)
    crf = SemiMarkovCRF(torch.zeros(N, N, K, C, C), lengths)
    expected = [sum(compositions(n, m, K) * C**m for m in range(1, n + 1)) for n in lengths.tolist()]
    assert crf.count.tolist() == expected


@pytest.mark.parametrize("N", range(1, 9))
@pytest.mark.parametrize("K", range(1, 4))
def test_forbidding_label_changes_leaves_only_label_0(N, K):
    """The first segment follows label 0, so with every change of label forbidden all segments are 0."""
    C = 3
    theta = torch.zeros(1, N, K, C, C).masked_fill(~torch.eye(C, dtype=torch.bool), -math.inf)
    assert SemiMarkovCRF(theta).count.item() == sum(compositions(N, m, K) for m in range(1, N + 1))


def test_forbidding_long_segments_leaves_one_label_per_position():
    theta = torch.zeros(1, 6, 3, 2, 2)
    theta[:, :, 1:] = -math.inf
    assert SemiMarkovCRF(theta).count.item() == 2**6


def test_decode_labels_every_position_of_the_best_segmentation():
    g = torch.Generator().manual_seed(30)
    N, K, C = 5, 3, 2
    theta = random_potentials((N, K, C, C), 4, g)
    lengths = random_lengths(4, N, g)
    crf = SemiMarkovCRF(theta, lengths)
    expected = torch.zeros(4, N, dtype=torch.long)  # 0 past each length, as every structure pads
    for b, e in enumerate(SEMIMARKOV.enumerate(theta, lengths)):
        best = e.parts[e.scores.argmax()]
        for j, k, _, c in best.nonzero().tolist():  # segment ending at j, of length k+1, labelled c
            expected[b, j - k : j + 1] = c
    assert torch.equal(crf.decode(), expected)


def test_segments_tile_each_example_and_agree_with_the_labels():
    g = torch.Generator().manual_seed(32)
    crf = SemiMarkovCRF(torch.randn(3, 6, 3, 2, 2, generator=g, dtype=torch.float64), torch.tensor([6, 4, 1]))
    labels = crf.decode()
    for b, (segments, n) in enumerate(zip(crf.segments(), crf.lengths.tolist())):
        assert [first for first, _, _ in segments] == [0] + [last + 1 for _, last, _ in segments[:-1]]
        assert segments[-1][1] == n - 1
        for first, last, label in segments:
            assert labels[b, first : last + 1].eq(label).all()


@pytest.mark.parametrize("lengths, message", [
    ([6, 0], r"^lengths: expected values in 2\.\.6, got \[6, 0\]"),
    ([7, 2], r"^lengths: expected values in 2\.\.6, got \[7, 2\]"),
    ([True, True], r"^lengths: expected an integer tensor of shape \[B\] = \[2\], got torch\.bool"),
])
def test_from_torch_struct_checks_its_fencepost_lengths_in_its_own_terms(lengths, message):
    """torch-struct's lengths count fenceposts (2..N for potentials [B, N-1, K, C, C]): a bad one is
    a value error that names the values given, not the positions (one fewer) they become."""
    with pytest.raises(ValueError, match=message):
        SemiMarkovCRF.from_torch_struct(torch.zeros(2, 5, 3, 2, 2), torch.tensor(lengths))
