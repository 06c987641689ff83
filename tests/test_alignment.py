"""AlignmentCRF against every monotone path listed by hand, at small sizes, with both lengths
varying per example and forbidden (-inf) cells. (The checks every structure shares, with the first
length varying, are in test_distribution_api.py: families alignment-many_to_many and -one_to_many.)"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from brute import Enumeration, as_multiset, assert_queries_match, monotone_paths, random_potentials
from structures import AlignmentCRF

KINDS = ("many_to_many", "one_to_many")


def delannoy(n: int, m: int) -> int:
    return sum(math.comb(n, k) * math.comb(m, k) * 2**k for k in range(min(n, m) + 1))


def enumerate_batch(theta, lengths, kind) -> list[Enumeration]:
    """One enumeration per example; where no path exists (one-to-many with n > m), a lone
    structure of score -inf stands for the empty set."""
    out = []
    for t, n, m in zip(theta, lengths["n"].tolist(), lengths["m"].tolist()):
        found = list(monotone_paths(n, m, kind))
        out.append(Enumeration(t, found) if found else Enumeration(torch.full_like(t, -math.inf), [[(0, 0)]]))
    return out


SIZES = [(1, 1), (1, 3), (3, 1), (2, 3), (3, 3), (3, 4), (4, 3)]


def problem(N: int, M: int, kind: str, forbid: float, seed: int = 0):
    """Potentials [4, N, M], lengths that take both ends of both ranges (n > m among them), and the enumerations."""
    g = torch.Generator().manual_seed(seed + 97 * N + 13 * M)
    theta = random_potentials((N, M), 4, g, forbid)
    top = 1 if kind == "one_to_many" and M == 1 else N  # one-to-many: a single column admits one row only
    lengths = {"n": torch.tensor([top, 1, top, torch.randint(1, top + 1, (1,), generator=g).item()]),
               "m": torch.tensor([M, M, 1, torch.randint(1, M + 1, (1,), generator=g).item()])}
    return theta, lengths, enumerate_batch(theta, lengths, kind)


cases = pytest.mark.parametrize("N, M", SIZES)
kinds = pytest.mark.parametrize("kind", KINDS)
forbids = pytest.mark.parametrize("forbid", [0.0, 0.3], ids=["finite", "forbid"])


@cases
@kinds
@forbids
def test_every_query_equals_enumeration_of_the_paths(N, M, kind, forbid):
    theta, lengths, enums = problem(N, M, kind, forbid)
    d = AlignmentCRF(theta, lengths, kind=kind)
    q_theta = random_potentials((N, M), 4, torch.Generator().manual_seed(1), forbid)
    q = AlignmentCRF(q_theta, lengths, kind=kind)
    q_enums = enumerate_batch(q_theta, lengths, kind)
    assert_queries_match(d, q, enums, q_enums)
    some = torch.isfinite(d.max)
    assert_close(d.score(d.argmax)[some], d.max[some])
    assert (d.argmax[~some] == 0).all()


@cases
@kinds
def test_decode_is_the_best_path_in_order(N, M, kind):
    theta, lengths, enums = problem(N, M, kind, 0.2, seed=1)
    d = AlignmentCRF(theta, lengths, kind=kind)
    cells = d.decode()
    assert cells.shape == (4, N + M - 1, 2)
    for b, e in enumerate(enums):
        if e.count == 0:
            assert (cells[b] == -1).all()
            continue
        best = e.parts[e.scores.argmax()]
        visited = [tuple(c) for c in cells[b].tolist() if c != [-1, -1]]
        assert visited == sorted(map(tuple, best.nonzero().tolist()))  # the path's cells, in path order
        assert visited[0] == (0, 0) and visited[-1] == (int(lengths["n"][b]) - 1, int(lengths["m"][b]) - 1)
    some = torch.isfinite(d.max)
    assert_close(d.log_prob(cells)[some], (d.max - d.log_partition)[some])  # decoded paths convert back to parts


@kinds
def test_samples_are_paths_at_the_frequencies_of_the_marginals(kind):
    torch.manual_seed(0)
    theta, lengths, enums = problem(3, 4, kind, 0.2, seed=2)
    d = AlignmentCRF(theta, lengths, kind=kind)
    n = 20000
    samples = d.sample((n,))
    assert samples.shape == (n, 4, 3, 4)
    mu = d.marginals.clamp(0, 1)  # (a certain cell's marginal may round to an ulp above 1)
    assert ((samples.mean(0) - mu).abs() <= 5 * (mu * (1 - mu) / n).sqrt() + 1e-9).all()
    for b, e in enumerate(enums):  # each sample is a path (all 0 where no path is left)
        assert not as_multiset(samples[:, b].unique(dim=0)) - e.support() if e.count else (samples[:, b] == 0).all()


def test_counts_are_delannoy_and_binomial_numbers():
    theta = torch.zeros(3, 6, 8)
    lengths = {"n": torch.tensor([6, 3, 5]), "m": torch.tensor([8, 8, 2])}
    many = AlignmentCRF(theta, lengths).count.tolist()
    assert many == [delannoy(n - 1, m - 1) for n, m in [(6, 8), (3, 8), (5, 2)]]
    one = AlignmentCRF(theta, lengths, kind="one_to_many").count.tolist()
    assert one == [math.comb(7, 5), math.comb(7, 2), 0]  # C(m-1, n-1); none when n > m


def test_lengths_as_a_tuple_a_partial_dict_and_the_defaults():
    theta = torch.randn(2, 3, 5, dtype=torch.float64)
    n, m = torch.tensor([3, 2]), torch.tensor([4, 5])
    as_dict = AlignmentCRF(theta, {"n": n, "m": m})
    assert_close(AlignmentCRF(theta, (n, m)).log_partition, as_dict.log_partition)
    only_n = AlignmentCRF(theta, {"n": n})
    assert only_n.lengths["m"].tolist() == [5, 5]
    assert_close(only_n.log_partition, AlignmentCRF(theta, {"n": n, "m": torch.tensor([5, 5])}).log_partition)
    assert {k: v.tolist() for k, v in AlignmentCRF(theta).lengths.items()} == {"n": [3, 3], "m": [5, 5]}


@kinds
def test_padded_batch_equals_examples_one_by_one(kind):
    theta, lengths, _ = problem(4, 3, kind, 0.2, seed=3)
    d = AlignmentCRF(theta, lengths, kind=kind)
    for b in range(4):
        n, m = int(lengths["n"][b]), int(lengths["m"][b])
        if n > m and kind == "one_to_many":  # no path, and no n x m shape of its own admits n (see the errors)
            assert d.log_partition[b] == -math.inf
            continue
        alone = AlignmentCRF(theta[b:b + 1, :n, :m], kind=kind)
        assert_close(d.log_partition[b:b + 1], alone.log_partition)
        assert_close(d.marginals[b:b + 1, :n, :m], alone.marginals)
        assert (d.marginals[b, n:] == 0).all() and (d.marginals[b, :, m:] == 0).all()


@kinds
def test_gradcheck_and_gradgradcheck(kind):
    theta, _, _ = problem(3, 4, kind, 0.0, seed=4)
    lengths = {"n": torch.tensor([3, 2, 1, 3]), "m": torch.tensor([4, 3, 4, 3])}  # every example has paths
    x = theta.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: AlignmentCRF(t, lengths, kind=kind).log_partition, (x,))
    assert torch.autograd.gradgradcheck(lambda t: AlignmentCRF(t, lengths, kind=kind).log_partition, (x,))


@pytest.mark.parametrize("what, call, message", [
    ("m too long", lambda: AlignmentCRF(torch.zeros(2, 3, 4), {"n": torch.tensor([1, 3]), "m": torch.tensor([5, 1])}),
     r"lengths\['m'\]: \[5\] out of range; these shapes allow 1..4"),
    ("one column", lambda: AlignmentCRF(torch.zeros(1, 3, 1), {"n": torch.tensor([3])}, kind="one_to_many"),
     r"lengths\['n'\]: \[3\] out of range; these shapes allow 1..1"),
    ("a bare tensor", lambda: AlignmentCRF(torch.zeros(2, 3, 4), torch.tensor([1, 2])), r"lengths \['n', 'm'\]: give a dict"),
    ("a name", lambda: AlignmentCRF(torch.zeros(2, 3, 4), {"k": torch.tensor([1, 2])}), r"lengths: \['k'\] are not lengths"),
    ("a tuple of one", lambda: AlignmentCRF(torch.zeros(2, 3, 4), (torch.tensor([1, 2]),)), r"lengths: expected 2 tensors"),
    ("kind", lambda: AlignmentCRF(torch.zeros(2, 3, 4), kind="one_to_one"), r"kind: expected one of"),
    ("cells", lambda: AlignmentCRF(torch.zeros(2, 3, 4)).log_prob(torch.zeros(2, 3, dtype=torch.long)), r"value: expected cells"),
], ids=lambda x: x if isinstance(x, str) and not x.startswith(("log", "lengths", "kind", "value")) else "")
def test_bad_input_raises_value_error_naming_the_argument(what, call, message):
    with pytest.raises(ValueError, match=message):
        call()
