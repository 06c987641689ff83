"""Independent oracles: every structure of one example listed with itertools and scored straight
from the potentials (and the fixed shared scores of an adapter, :func:`fixed`) by the conventions
the docstrings state. No dynamic programming here.

A structure is the list of the indices of its parts in one example's potentials (one-hot parts).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor
from torch.testing import assert_close

from structures import (CTC, HMM, PCFG, TDPCFG, AlignmentCRF, ConstituencyCRF, EmissionCRF, HopChainCRF, LinearChainCRF,
                        NonProjectiveDependencyCRF, ProjectiveDependencyCRF, SecondOrderDependencyCRF, SemiMarkovCRF)

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


def sibling_triples(tree: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(head, sibling, modifier) of a tree given as arcs (head, modifier): on each side of each head,
    its modifiers ordered from the head outwards, every consecutive pair (closer one, farther one)."""
    out = []
    for h in {h for h, _ in tree}:
        right = sorted(m for g, m in tree if g == h and m > h)
        left = sorted((m for g, m in tree if g == h and m < h), reverse=True)
        for side in (right, left):
            out += [(h, s, m) for s, m in zip(side, side[1:])]
    return out


ALIGNMENT_STEPS = {"many_to_many": ((0, 1), (1, 1), (1, 0)), "one_to_many": ((0, 1), (1, 1))}


def monotone_paths(n: int, m: int, kind: str) -> Iterator[list[tuple[int, int]]]:
    """AlignmentCRF: every path of cells from (0, 0) to (n-1, m-1) by the kind's steps."""
    def extend(path):
        i, j = path[-1]
        if (i, j) == (n - 1, m - 1):
            yield path
        for di, dj in ALIGNMENT_STEPS[kind]:
            if i + di < n and j + dj < m:
                yield from extend(path + [(i + di, j + dj)])
    yield from extend([(0, 0)])


def collapse(symbols: Sequence[int], blank: int) -> list[int]:
    """Graves' many-to-one map: merge repeated symbols, then drop blanks."""
    return [s for k, s in enumerate(symbols) if s != blank and (k == 0 or s != symbols[k - 1])]


def ctc_alignments(T: int, V: int, target: list[int], blank: int = 0) -> Iterator[list[tuple[int, int]]]:
    """CTC: every frame labelling of T frames over V symbols that collapses to ``target``: parts (t, v)."""
    for symbols in itertools.product(range(V), repeat=T):
        if collapse(symbols, blank) == target:
            yield [(t, v) for t, v in enumerate(symbols)]


def fixed(*index: int) -> float:
    """A shared score the adapters fix (HMM's transitions and start, the second-order CRF's
    siblings): a function of its indices alone (a table cut smaller agrees with a larger one), a
    multiple of 1/8 in -1..1 (exact in every float dtype)."""
    return round(8 * math.sin(0.5 + sum((2.3 * k + 1.1) * i for k, i in enumerate(index)))) / 8


def fixed_table(*sizes: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """``fixed(*index)`` at every index of a table of ``sizes``: tables cut to smaller sizes agree."""
    return torch.tensor([fixed(*i) for i in itertools.product(*map(range, sizes))], dtype=dtype).reshape(sizes)


class Enumeration:
    """Every structure of one example, as one-hot parts ``[S, *parts]`` and scores ``[S]``."""

    def __init__(self, theta: Tensor, structures: Iterable[list[Part]],
                 fixed_score: Callable[[list[Part]], float] = lambda parts: 0.0):
        """``fixed_score``: what a structure scores beyond its parts' potentials (shared scores)."""
        structures = list(structures)
        self.parts = torch.zeros(len(structures), *theta.shape, dtype=theta.dtype)
        scores = []
        for s, parts in enumerate(structures):
            for p in parts:
                self.parts[(s, *p)] = 1.0
            scores.append(sum((theta[p] for p in parts), torch.tensor(fixed_score(parts), dtype=theta.dtype)))
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
    min_length: int = 1  # the shortest length with a structure (a grammar's tree has 2 words or more)
    argument: str = "log_potentials"  # what the constructor calls the potentials
    fixed_score: Callable[[list[Part]], float] = lambda parts: 0.0  # a structure's shared scores (Enumeration)

    def max_length(self, shape: tuple[int, ...]) -> int:
        return shape[0] + self.offset

    def random_lengths(self, batch: int, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
        """:func:`random_lengths` in ``min_length..max_length(shape)``."""
        return random_lengths(batch, self.max_length(shape), generator, self.min_length)

    def enumerate(self, theta: Tensor, lengths: Tensor | None = None) -> list[Enumeration]:
        """One enumeration per example of a batch ``theta [B, *shape]``."""
        shape = tuple(theta.shape[1:])
        ns = [self.max_length(shape)] * theta.shape[0] if lengths is None else lengths.tolist()
        return [Enumeration(t, self.structures(shape, n), self.fixed_score) for t, n in zip(theta, ns)]

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


# Structures whose constructors take more than potentials and lengths, through an adapter that
# fixes the rest: shared scores by :func:`fixed` (which the enumerations add), one length of two.

def _float(theta: Tensor) -> torch.dtype:
    """The dtype for an adapter's fixed scores: the potentials' (integer ones are the class's to refuse)."""
    return theta.dtype if theta.dtype.is_floating_point else torch.float64


class HMMOfWords(HMM):
    """An HMM whose potentials are θ: word ``b N + i`` at position ``i`` of example ``b``, emitted
    with score ``θ[b, i, c]`` by state ``c``; transitions and start fixed (:func:`fixed`)."""

    def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None):
        if log_potentials.dim() == 3:
            B, N, C = log_potentials.shape
            emission, words = log_potentials.reshape(B * N, C).t(), torch.arange(B * N).reshape(B, N)
        else:  # potentials of a wrong rank: an emission table of a wrong rank, for HMM to refuse
            C = log_potentials.shape[-1]
            emission, words = log_potentials[0], torch.zeros(1, 1, dtype=torch.long)
        dtype = _float(log_potentials)
        super().__init__(words, emission, fixed_table(C, C, dtype=dtype), fixed_table(C, dtype=dtype), lengths)


def hmm_fixed_score(parts: list[Part]) -> float:
    """start[t_0] + Σ_i transitions[t_i, t_{i+1}] of tags given as parts (i, t_i)."""
    tags = [t for _, t in parts]
    return fixed(tags[0]) + sum(fixed(a, b) for a, b in zip(tags, tags[1:]))


HMM_FAMILY = Family(
    "hmm", HMMOfWords,
    ((1, 2), (2, 3), (3, 2)), 0,
    lambda shape, n: tag_sequences(n, shape[-1]), argument="emission", fixed_score=hmm_fixed_score,
)


def alignment_family(kind: str, shapes: tuple[tuple[int, int], ...]) -> Family:
    """AlignmentCRF of ``kind`` with ``lengths`` the first sequence's (``n``), the second's ``m = M``."""

    class Rows(AlignmentCRF):
        def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None):
            super().__init__(log_potentials, None if lengths is None else {"n": lengths}, kind=kind)

    Rows.__name__ = Rows.__qualname__ = f"AlignmentCRF_{kind}"
    return Family(f"alignment-{kind}", Rows, shapes, 0, lambda shape, n: monotone_paths(n, shape[1], kind))


ALIGNMENT = alignment_family("many_to_many", ((1, 3), (3, 1), (4, 3)))
ALIGNMENT_ONE_TO_MANY = alignment_family("one_to_many", ((1, 1), (2, 3), (3, 4)))  # no path if n > m


def ctc_target(T: int, V: int) -> list[int]:
    """The CTC family's target for T frames and V symbols (0 the blank): T // 2 labels (so that
    T frames admit them, whatever their repeats), 1 2 2 1 1 2 ... with V = 3, 1 1 1 ... with V = 2."""
    return [1 + (s + 1) // 2 % max(V - 1, 1) for s in range(T // 2)]


class CTCOfTargets(CTC):
    """CTC with ``lengths`` the input lengths ``n`` and the targets ``ctc_target(n, V)``."""

    def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None):
        B, T, V = log_potentials.shape if log_potentials.dim() == 3 else (1, 1, 2)
        S = max(T // 2, 1)
        targets = torch.tensor(ctc_target(2 * S, V)).expand(B, S)
        n = torch.full((B,), T) if lengths is None else lengths
        super().__init__(log_potentials, targets, lengths, n // 2)


CTC_FAMILY = Family(
    "ctc", CTCOfTargets,
    ((1, 2), (3, 2), (4, 3), (4, 2)), 0,  # (the middle one, the gradchecks', has targets 1 2: a skip over a blank)
    lambda shape, n: ctc_alignments(n, shape[1], ctc_target(n, shape[1])), argument="log_probs",
)


def second_order_family(single_root: bool, shapes: tuple[tuple[int, int], ...]) -> Family:
    """SecondOrderDependencyCRF with fixed sibling scores (:func:`fixed`)."""

    class FixedSiblings(SecondOrderDependencyCRF):
        def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None):
            B, n1 = log_potentials.shape[:2] if log_potentials.dim() > 1 else (1, 1)
            siblings = fixed_table(n1, n1, n1, dtype=_float(log_potentials)).expand(B, -1, -1, -1)
            super().__init__(log_potentials, siblings, lengths, single_root)

    FixedSiblings.__name__ = FixedSiblings.__qualname__ = f"{'SingleRoot' * single_root}SecondOrderDependencyCRF"
    name = "second-order" + "-single-root" * single_root
    return Family(name, FixedSiblings, shapes, -1,
                  lambda shape, n: (t for t in projective_trees(n) if not single_root or sum(h == 0 for h, _ in t) == 1),
                  length_dims=2, fixed_score=lambda arcs: sum(fixed(*t) for t in sibling_triples(arcs)))


SECOND_ORDER = second_order_family(False, ((2, 2), (3, 3), (4, 4)))
SECOND_ORDER_SINGLE_ROOT = second_order_family(True, ((2, 2), (3, 3)))  # (its own goal on the same chart)


def grammar_trees(n: int, NT: int, T: int, R: int = 0) -> Iterator[list[Part]]:
    """PCFG (TD-PCFG with ``R`` ranks): every binary tree of words 0..n-1 with a nonterminal on each
    span of 2 words or more, a preterminal on each word (and a rank at each nonterminal); parts
    (i, j, a) for nonterminal a over words i..j (i < j), (i, i, p) for preterminal p over word i,
    (j, i, r) for rank r at the node over i..j."""
    for tree in binary_trees(0, n):
        spans = [(i, k - 1) for i, k in tree]
        for labels in itertools.product(range(NT), repeat=len(spans)):
            for tags in itertools.product(range(T), repeat=n):
                for ranks in itertools.product(range(R), repeat=len(spans)) if R else [()]:
                    yield ([(i, j, a) for (i, j), a in zip(spans, labels)] + [(i, i, p) for i, p in enumerate(tags)]
                           + [(j, i, r) for (i, j), r in zip(spans, ranks)])


def child(x: int, NT: int) -> int:
    """The code of a rule's child in the rules' numbering (nonterminal x < NT, preterminal NT + p) for
    :func:`fixed`: 2x for a nonterminal, 2p + 1 for a preterminal, so that a grammar's fixed scores
    do not depend on NT."""
    return 2 * x if x < NT else 2 * (x - NT) + 1


def grammar_nodes(parts: list[Part]) -> Iterator[tuple[int, int, int, int | None]]:
    """(parent, left child code, right child code, rank or None) of every nonterminal node of a
    tree given as :func:`grammar_trees` parts, the root's first; the codes as :func:`child`'s."""
    spans = {(i, j): a for i, j, a in parts if i < j}
    tags = {i: p for i, j, p in parts if i == j}
    ranks = {(i, j): r for j, i, r in parts if j > i}

    def code(i: int, j: int) -> int:
        return 2 * spans[i, j] if i < j else 2 * tags[i] + 1

    for (i, j), a in sorted(spans.items(), key=lambda s: s[0][0] - s[0][1]):
        k = max(k for k in range(i, j) if k == i or (i, k) in spans)  # the left child's last word
        yield a, code(i, k), code(k + 1, j), ranks.get((i, j))


def grammar_fixed_score(parts: list[Part]) -> float:
    """A tree's root and rule scores under the PCFG adapter's fixed grammar: roots ``fixed(a)``,
    rules ``fixed(a, code x, code y)``; under the TD-PCFG's, a node of rank r scores
    ``fixed(1, a, r) + fixed(2, code x, r) + fixed(3, code y, r)`` (U, V, W)."""
    nodes = list(grammar_nodes(parts))
    score = fixed(nodes[0][0])
    for a, x, y, r in nodes:
        score += fixed(a, x, y) if r is None else fixed(1, a, r) + fixed(2, x, r) + fixed(3, y, r)
    return score


def grammar_sizes(K: int, ranks: bool) -> tuple[int, int, int]:
    """(NT, T, R) of the grammar adapters' chart label size K = max(NT, T, R): the PCFG's NT = K,
    T = K - 1 (so that some labels are never tags); the TD-PCFG's R = K, NT = T = K - 1."""
    small = max(1, K - 1)
    return (small, small, K) if ranks else (K, small, 0)


def _grammar_inputs(log_potentials: Tensor, ranks: bool) -> tuple[Tensor, int, int, int, torch.dtype]:
    """Zero terms ``[B, N, T]`` beside the chart θ (all of θ goes in as ``chart``), and NT, T, R and
    the dtype of the fixed scores; for θ of a wrong rank, terms that let the class refuse θ."""
    shape = (*log_potentials.shape, 1, 1)[:4]
    NT, T, R = grammar_sizes(shape[-1], ranks)
    dtype = _float(log_potentials)
    return torch.zeros(shape[0], shape[1], T, dtype=dtype), NT, T, R, dtype


def _codes(NT: int, T: int) -> list[int]:
    return [child(x, NT) for x in range(NT + T)]


class PCFGOfChart(PCFG):
    """A PCFG whose potentials are θ ``[B, N, N, K]``, the whole chart (as ``chart``: tags and
    labelled spans), rules and roots fixed (:func:`grammar_fixed_score`)."""

    def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None):
        terms, NT, T, _, dtype = _grammar_inputs(log_potentials, ranks=False)
        codes = _codes(NT, T)
        rules = torch.tensor([[[fixed(a, x, y) for y in codes] for x in codes] for a in range(NT)], dtype=dtype)
        roots = torch.tensor([fixed(a) for a in range(NT)], dtype=dtype)
        super().__init__(terms, rules[None], roots[None], lengths, chart=log_potentials)


class TDPCFGOfChart(TDPCFG):
    """A TD-PCFG whose potentials are θ ``[B, N, N, K]``, the whole chart (tags, labelled spans and
    ranks), factors U, V, W and roots fixed (:func:`grammar_fixed_score`)."""

    def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None):
        terms, NT, T, R, dtype = _grammar_inputs(log_potentials, ranks=True)
        codes = _codes(NT, T)
        U, V, W = (torch.tensor([[fixed(k, x, r) for r in range(R)] for x in xs], dtype=dtype)[None]
                   for k, xs in ((1, range(NT)), (2, codes), (3, codes)))
        roots = torch.tensor([fixed(a) for a in range(NT)], dtype=dtype)
        super().__init__(terms, U, V, W, roots[None], lengths, chart=log_potentials)


PCFG_FAMILY = Family(
    "pcfg", PCFGOfChart,
    ((2, 2, 1), (2, 2, 2), (3, 3, 2), (2, 2, 3), (3, 3, 3), (4, 4, 2)), 0,
    lambda shape, n: grammar_trees(n, *grammar_sizes(shape[-1], ranks=False)[:2]),
    length_dims=2, min_length=2, argument="chart", fixed_score=grammar_fixed_score,
)
TDPCFG_FAMILY = Family(
    "tdpcfg", TDPCFGOfChart,
    ((2, 2, 1), (2, 2, 2), (3, 3, 2), (2, 2, 3), (4, 4, 2), (3, 3, 3)), 0,
    lambda shape, n: grammar_trees(n, *grammar_sizes(shape[-1], ranks=True)),
    length_dims=2, min_length=2, argument="chart", fixed_score=grammar_fixed_score,
)
ADAPTED = (HMM_FAMILY, ALIGNMENT, ALIGNMENT_ONE_TO_MANY, CTC_FAMILY, SECOND_ORDER, SECOND_ORDER_SINGLE_ROOT,
           PCFG_FAMILY, TDPCFG_FAMILY)


def random_lengths(batch: int, longest: int, generator: torch.Generator, shortest: int = 1) -> Tensor:
    """Lengths in shortest..longest that include both ends when the batch has room."""
    lengths = torch.randint(shortest, longest + 1, (batch,), generator=generator)
    lengths[0] = longest
    if batch > 1:
        lengths[1] = shortest
    return lengths


def random_potentials(shape: tuple[int, ...], batch: int, generator: torch.Generator,
                      forbid: float = 0.0, dtype: torch.dtype = torch.float64) -> Tensor:
    """Standard normal log-potentials ``[batch, *shape]``, a fraction ``forbid`` of them -inf."""
    theta = torch.randn(batch, *shape, generator=generator, dtype=dtype)
    if forbid:
        theta = theta.masked_fill(torch.rand(theta.shape, generator=generator) < forbid, float("-inf"))
    return theta
