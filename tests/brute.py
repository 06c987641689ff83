"""Independent oracles: every structure of one example listed with itertools and scored straight
from the potentials by the conventions the docstrings state. No dynamic programming here.

A structure is the list of the indices of its parts in one example's potentials (one-hot parts).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor
from torch.testing import assert_close

from structures import (ConstituencyCRF, EmissionCRF, HopChainCRF, LinearChainCRF, NonProjectiveDependencyCRF, ProjectiveDependencyCRF,
                        SemiMarkovCRF)

Part = tuple[int, ...]


def chain_structures(n: int, C: int) -> Iterator[list[Part]]:
    """LinearChainCRF: tags t_0..t_{n-1}; part (i, t_i, t_{i+1}) for every i < n-1."""
    for tags in itertools.product(range(C), repeat=n):
        yield [(i, tags[i], tags[i + 1]) for i in range(n - 1)]


def tag_sequences(n: int, C: int) -> Iterator[list[Part]]:
    """EmissionCRF: tags t_0..t_{n-1}; part (i, t_i) for every i < n."""
    for tags in itertools.product(range(C), repeat=n):
        yield list(enumerate(tags))


def compositions(n: int, K: int) -> Iterator[list[int]]:
    """The segment lengths, left to right, of every way to cut n positions into segments of length 1..K."""
    for cuts in itertools.chain.from_iterable(itertools.combinations(range(1, n), m) for m in range(n)):
        bounds = (0, *cuts, n)
        lengths = [b - a for a, b in zip(bounds, bounds[1:])]
        if max(lengths) <= K:
            yield lengths


def semimarkov_structures(n: int, K: int, C: int) -> Iterator[list[Part]]:
    """SemiMarkovCRF: labelled segmentations; part (last position, length - 1, previous label or 0, label)."""
    for lengths in compositions(n, K):
        ends = [e - 1 for e in itertools.accumulate(lengths)]
        for labels in itertools.product(range(C), repeat=len(lengths)):
            previous = (0, *labels[:-1])
            yield [(j, k - 1, y, c) for j, k, y, c in zip(ends, lengths, previous, labels)]


def hop_structures(n: int, F: int) -> Iterator[list[Part]]:
    """HopChainCRF: facts f_0..f_{n-1}; part (k, f_{k-1} or 0 at hop 0, f_k)."""
    for facts in itertools.product(range(F), repeat=n):
        yield [(k, facts[k - 1] if k else 0, facts[k]) for k in range(n)]


def binary_trees(i: int, k: int) -> Iterator[list[tuple[int, int]]]:
    """Every binary bracketing of the leaves i..k-1: the list of its spans (i, k) of width 2 or more."""
    if k - i == 1:
        yield []
        return
    for j in range(i + 1, k):
        for left in binary_trees(i, j):
            for right in binary_trees(j, k):
                yield [(i, k), *left, *right]


def constituency_trees(n: int, L: int) -> Iterator[list[Part]]:
    """ConstituencyCRF: every binary tree of n words with a label on each of its 2n - 1 spans; part
    (first word, last word, label), the words and the whole sentence included."""
    for tree in binary_trees(0, n):
        spans = [(i, k - 1) for i, k in tree] + [(i, i) for i in range(n)]
        for labels in itertools.product(range(L), repeat=len(spans)):
            yield [(i, j, label) for (i, j), label in zip(spans, labels)]


def dependency_trees(n: int) -> Iterator[list[tuple[int, int]]]:
    """Every dependency tree over words 1..n with the root at position 0 (which may have several
    children), projective or not: the list of its arcs (head, dependent)."""
    for heads in itertools.product(range(n + 1), repeat=n):
        if is_tree(heads):
            yield [(h, d) for d, h in enumerate(heads, start=1)]


def projective_trees(n: int) -> Iterator[list[tuple[int, int]]]:
    """The trees of :func:`dependency_trees` whose arcs do not cross."""
    for arcs in dependency_trees(n):
        if not crosses([h for h, _ in arcs]):
            yield arcs


def is_tree(heads: Sequence[int]) -> bool:
    """Whether ``heads`` (word d's head at d-1, in 0..n, 0 the root) form a tree: no word heads
    itself and every word reaches the root without a cycle."""
    return all(_climbs_to_root(d, heads) for d in range(1, len(heads) + 1))


def crosses(heads: Sequence[int]) -> bool:
    """Whether two arcs of ``heads`` (as in :func:`is_tree`) cross: the tree is not projective."""
    spans = [tuple(sorted((h, d))) for d, h in enumerate(heads, start=1)]
    return any(a < c < b < e for a, b in spans for c, e in spans)


def _climbs_to_root(d: int, heads: Sequence[int]) -> bool:
    seen = set()
    while d != 0:
        if d in seen:
            return False
        seen.add(d)
        d = heads[d - 1]
    return True


class Enumeration:
    """Every structure of one example, as one-hot parts ``[S, *parts]`` and scores ``[S]``."""

    def __init__(self, theta: Tensor, structures: Iterable[list[Part]]):
        structures = list(structures)
        self.parts = torch.zeros(len(structures), *theta.shape, dtype=theta.dtype)
        scores = []
        for s, parts in enumerate(structures):
            for p in parts:
                self.parts[(s, *p)] = 1.0
            scores.append(sum((theta[p] for p in parts), torch.zeros((), dtype=theta.dtype)))
        self.scores = torch.stack(scores)

    @property
    def finite(self) -> Tensor:
        return torch.isfinite(self.scores)

    @property
    def log_partition(self) -> Tensor:
        return torch.logsumexp(self.scores, 0)

    @property
    def log_probs(self) -> Tensor:
        """log p(z) of every structure (-inf where the score is)."""
        return torch.where(self.finite, self.scores - self.log_partition, float("-inf"))

    @property
    def probs(self) -> Tensor:
        return self.log_probs.exp()

    @property
    def marginals(self) -> Tensor:
        return torch.einsum("s,s...->...", self.probs, self.parts)

    @property
    def max(self) -> Tensor:
        return self.scores.max()

    @property
    def count(self) -> int:
        return int(self.finite.sum())

    def topk_scores(self, k: int) -> Tensor:
        padded = torch.cat([self.scores, torch.full((k,), float("-inf"), dtype=self.scores.dtype)])
        return padded.sort(descending=True).values[:k]

    @property
    def entropy(self) -> Tensor:
        p = self.probs
        return -(p * self.log_probs).where(p > 0, 0.0).sum()

    def cross_entropy(self, q: "Enumeration") -> Tensor:
        """−Σ p log q, with q's structures listed in the same order."""
        p = self.probs
        return -(p * q.log_probs).where(p > 0, 0.0).sum()

    def kl(self, q: "Enumeration") -> Tensor:
        return self.cross_entropy(q) - self.entropy

    def expected_score(self, v: Tensor) -> Tensor:
        """E_p[⟨v, z⟩]."""
        return (self.probs * self._scores_of(v)).sum()

    def covariance_times(self, v: Tensor) -> Tensor:
        """Cov_p(z) v = E_p[z ⟨v, z⟩] − μ E_p[⟨v, z⟩]: the derivative of ⟨v, μ⟩ by the potentials."""
        f = self.probs * self._scores_of(v)
        return torch.einsum("s,s...->...", f, self.parts) - self.marginals * f.sum()

    def _scores_of(self, v: Tensor) -> Tensor:
        return (self.parts * v).flatten(1).sum(1)

    def support(self) -> Counter:
        """The multiset of the structures of finite score."""
        return as_multiset(self.parts[self.finite])

    def index(self, structure: Tensor) -> int:
        """The position of a one-hot structure in the enumeration."""
        hits = (self.parts == structure).flatten(1).all(1).nonzero()
        assert hits.numel() >= 1, "not a structure of this example"
        return int(hits[0])


def assert_queries_match(d, q, enums: list[Enumeration], q_enums: list[Enumeration]) -> None:
    """The queries every structure answers — log Z, marginals, count, max, the 3 best scores,
    entropy, KL to ``q``, the support, log_prob of every structure — against the enumerations of
    each example of ``d`` (and of ``q``, a distribution over the same structures)."""
    def stack(f):
        return torch.stack([f(e) for e in enums])

    assert_close(d.log_partition, stack(lambda e: e.log_partition))
    assert_close(d.marginals, stack(lambda e: e.marginals))
    assert d.count.tolist() == [e.count for e in enums]
    assert_close(d.max, stack(lambda e: e.max))
    assert_close(d.topk_scores(3), torch.stack([e.topk_scores(3) for e in enums], 1))
    assert_close(d.entropy(), stack(lambda e: e.entropy))
    assert_close(d.kl(q), torch.stack([e.kl(f) for e, f in zip(enums, q_enums)]))
    values, valid = d.enumerate_structures()
    for b, e in enumerate(enums):
        assert as_multiset(values[valid[:, b], b]) == e.support()
        if e.count:
            every = e.parts.unsqueeze(1).expand(-1, len(enums), *e.parts.shape[1:])
            assert_close(d.log_prob(every)[:, b], e.log_probs)


def as_multiset(structures: Tensor) -> Counter:
    """Counter of one-hot structures ``[S, *parts]`` (rounded, so any float dtype compares)."""
    return Counter(tuple(s.flatten().round().int().tolist()) for s in structures)


@dataclass(frozen=True)
class Family:
    """A structure class, its independent enumerator and the small sizes its tests run at.

    ``shapes`` are per-example shapes of the potentials; ``offset`` is the longest length minus the
    first dimension (1 for the chain's ``N-1`` positions, -1 for the root row of a tree), so a
    length-``n`` example lives in ``theta[: n - offset]`` along each of its first ``length_dims``.
    """

    name: str
    cls: Callable
    shapes: tuple[tuple[int, ...], ...]
    offset: int
    structures: Callable[[tuple[int, ...], int], Iterable[list[Part]]]
    length_dims: int = 1
    argument: str = "log_potentials"  # what the constructor calls the potentials

    def max_length(self, shape: tuple[int, ...]) -> int:
        return shape[0] + self.offset

    def enumerate(self, theta: Tensor, lengths: Tensor | None = None) -> list[Enumeration]:
        """One enumeration per example of a batch ``theta [B, *shape]``."""
        shape = tuple(theta.shape[1:])
        ns = [self.max_length(shape)] * theta.shape[0] if lengths is None else lengths.tolist()
        return [Enumeration(t, self.structures(shape, n)) for t, n in zip(theta, ns)]

    def truncate(self, theta: Tensor, n: int) -> Tensor:
        """The potentials of a length-``n`` example cut to its own size."""
        return theta[(slice(None), *[slice(0, n - self.offset)] * self.length_dims)]

    def __str__(self) -> str:
        return self.name


CHAIN = Family(
    "chain", LinearChainCRF,
    tuple((N - 1, C, C) for N in range(1, 5) for C in range(1, 4)), 1,
    lambda shape, n: chain_structures(n, shape[-1]),
)
SEMIMARKOV = Family(
    "semimarkov", SemiMarkovCRF,
    tuple((N, K, C, C) for N in range(1, 5) for K in range(1, 4) for C in range(1, 3)), 0,
    lambda shape, n: semimarkov_structures(n, shape[1], shape[-1]),
)
HOPS = Family(
    "hops", HopChainCRF,
    tuple((K, F, F) for K in range(1, 4) for F in range(1, 4)), 0,
    lambda shape, n: hop_structures(n, shape[-1]),
)
CONSTITUENCY = Family(
    "constituency", ConstituencyCRF,
    ((1, 1, 1), (1, 1, 3), (2, 2, 3), (4, 4, 1), (2, 2, 1), (3, 3, 3)), 0,
    lambda shape, n: constituency_trees(n, shape[-1]), length_dims=2,
)


def tree_families(name: str, cls: type, trees: Callable[[int], Iterable[list[Part]]]) -> tuple[Family, Family]:
    """A dependency CRF's two families, multi-root and single-root (the root has one child), over
    ``trees(n)``: the trees over words 1..n as lists of arcs (head, dependent)."""

    class SingleRoot(cls):
        def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None, *, mask: Tensor | None = None):
            super().__init__(log_potentials, lengths, single_root=True, mask=mask)

    SingleRoot.__name__ = SingleRoot.__qualname__ = f"SingleRoot{cls.__name__}"
    shapes = tuple((n + 1, n + 1) for n in range(1, 5))
    return (Family(name, cls, shapes, -1, lambda shape, n: trees(n), length_dims=2),
            Family(f"{name}-single-root", SingleRoot, shapes, -1,
                   lambda shape, n: (t for t in trees(n) if sum(h == 0 for h, _ in t) == 1), length_dims=2))


PROJECTIVE, PROJECTIVE_SINGLE_ROOT = tree_families("projective", ProjectiveDependencyCRF, projective_trees)
NONPROJECTIVE, NONPROJECTIVE_SINGLE_ROOT = tree_families("nonprojective", NonProjectiveDependencyCRF, dependency_trees)


class EmissionsOnly(EmissionCRF):
    """Transitions, start and end 0: a structure's score is ⟨θ, z⟩ over its emissions alone."""

    def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None, *, mask: Tensor | None = None):
        C = log_potentials.shape[-1]
        super().__init__(log_potentials, log_potentials.new_zeros(C, C), lengths=lengths, mask=mask)


EMISSION = Family(
    "emission", EmissionsOnly,
    tuple((N, C) for N in range(1, 5) for C in range(1, 4)), 0,
    lambda shape, n: tag_sequences(n, shape[-1]), argument="emissions",
)
FAMILIES = (CHAIN, SEMIMARKOV, HOPS, PROJECTIVE, PROJECTIVE_SINGLE_ROOT, CONSTITUENCY, NONPROJECTIVE,
            NONPROJECTIVE_SINGLE_ROOT, EMISSION)


def random_lengths(batch: int, longest: int, generator: torch.Generator) -> Tensor:
    """Lengths in 1..longest that include both ends when the batch has room."""
    lengths = torch.randint(1, longest + 1, (batch,), generator=generator)
    lengths[0] = longest
    if batch > 1:
        lengths[1] = 1
    return lengths


def random_potentials(shape: tuple[int, ...], batch: int, generator: torch.Generator,
                      forbid: float = 0.0, dtype: torch.dtype = torch.float64) -> Tensor:
    """Standard normal log-potentials ``[batch, *shape]``, a fraction ``forbid`` of them -inf."""
    theta = torch.randn(batch, *shape, generator=generator, dtype=dtype)
    if forbid:
        theta = theta.masked_fill(torch.rand(theta.shape, generator=generator) < forbid, float("-inf"))
    return theta
