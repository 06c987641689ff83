"""Classic dynamic programs as a new user writes them from docs/language.md, each against an
independent oracle (brute-force enumeration, or a plain recursion written out in Python). The PCFG,
the span CRF (CKY), the alignment and CTC forms are in tests/test_language.py."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.testing import assert_close

import semiring as sr
from brute import compositions, projective_trees

# ---------------------------------------------------------------- semi-Markov CRF, read by segment length

# seg[j-1, k, c]: the segment of length k+1 that ends at position j-1, labelled c.
SEMIMARKOV = """
alpha[k+1, c]  = seg[k, k, c]                                       # the first segment: 0..k
alpha[j, c]   += alpha[j-k-1, y] * trans[y, c] * seg[j-1, k, c]     # a segment j-k-1..j-1 after one labelled y
goal          += alpha[n, c]
"""


def semimarkov_brute(seg: torch.Tensor, trans: torch.Tensor, n: int) -> torch.Tensor:
    """log Z of one example by listing every labelled segmentation of n positions."""
    D, C = seg.shape[1], seg.shape[2]
    scores = []
    for lengths in compositions(n, D):
        ends = [e - 1 for e in itertools.accumulate(lengths)]
        for labels in itertools.product(range(C), repeat=len(lengths)):
            s = sum(seg[e, k - 1, c] for e, k, c in zip(ends, lengths, labels))
            scores.append(s + sum(trans[y, c] for y, c in zip(labels, labels[1:])))
    return torch.logsumexp(torch.stack(scores), 0)


def semimarkov_recursion(seg: torch.Tensor, trans: torch.Tensor, n: int) -> torch.Tensor:
    """log Z of one example by the textbook forward recursion, position by position."""
    D = seg.shape[1]
    alpha = {}
    for j in range(1, n + 1):
        terms = [seg[j - 1, j - 1]] if j <= D else []  # a first segment 0..j-1
        for k in range(min(D, j - 1)):  # a segment of length k+1 after position j-k-2
            terms.append(torch.logsumexp(alpha[j - k - 1][:, None] + trans, 0) + seg[j - 1, k])
        alpha[j] = torch.logsumexp(torch.stack(terms), 0)
    return torch.logsumexp(alpha[n], 0)


def test_semimarkov_by_segment_length_equals_brute_force():
    g = torch.Generator().manual_seed(0)
    N, D, C = 6, 3, 2
    seg = torch.randn(3, N, D, C, generator=g, dtype=torch.float64)
    trans = torch.randn(1, C, C, generator=g, dtype=torch.float64)
    lengths = torch.tensor([6, 4, 1])
    got = sr.program(SEMIMARKOV)(sr.Log, lengths=lengths, seg=seg, trans=trans)
    assert_close(got, torch.stack([semimarkov_brute(seg[b], trans[0], int(n)) for b, n in enumerate(lengths)]))


@pytest.mark.parametrize("N", [56, 57, 60])
def test_semimarkov_by_segment_length_compiles_at_any_length(N):
    """The shape of seg bounds j and k: from N = 7D+1 on (57 at D = 8) this was refused as a chart
    that grows without limit."""
    g = torch.Generator().manual_seed(N)
    D, C = 8, 3
    seg = torch.randn(2, N, D, C, generator=g, dtype=torch.float64)
    trans = torch.randn(1, C, C, generator=g, dtype=torch.float64)
    lengths = torch.tensor([N, N // 2])
    got = sr.program(SEMIMARKOV)(sr.Log, lengths=lengths, seg=seg, trans=trans)
    assert_close(got, torch.stack([semimarkov_recursion(seg[b], trans[0], int(n)) for b, n in enumerate(lengths)]))


# ---------------------------------------------------------------- bracketing ITG

# X[s, t, u, v]: source words s..t aligned with target words u..v; no width condition, and the
# one-word base case is bounded by nothing but the spans the rules read.
ITG = """
X[s, s, u, u]  = 1
X[s, t, u, v] += X[s, k, u, w] * X[k+1, t, w+1, v] * straight[s, t, u, v]    for k in s..t-1 for w in u..v-1
X[s, t, u, v] += X[s, k, w+1, v] * X[k+1, t, u, w] * inverted[s, t, u, v]    for k in s..t-1 for w in u..v-1
goal           = X[0, n-1, 0, m-1]
"""


def itg_derivations(s: int, t: int, u: int, v: int):
    """Every derivation of source s..t with target u..v, as the list of its (rule, s, t, u, v) nodes."""
    if s == t and u == v:
        yield []
    for k, w in itertools.product(range(s, t), range(u, v)):
        for left, right in itertools.product(itg_derivations(s, k, u, w), itg_derivations(k + 1, t, w + 1, v)):
            yield [*left, *right, (0, s, t, u, v)]
        for left, right in itertools.product(itg_derivations(s, k, w + 1, v), itg_derivations(k + 1, t, u, w)):
            yield [*left, *right, (1, s, t, u, v)]


def test_itg_without_a_width_condition_equals_brute_force():
    g = torch.Generator().manual_seed(1)
    N = M = 4
    straight = torch.randn(3, N, N, M, M, generator=g, dtype=torch.float64)
    inverted = torch.randn(3, N, N, M, M, generator=g, dtype=torch.float64)
    lengths = {"n": torch.tensor([4, 3, 2]), "m": torch.tensor([4, 3, 3])}
    itg = sr.program(ITG)
    expected, counts = [], []
    for b in range(3):
        n, m = int(lengths["n"][b]), int(lengths["m"][b])
        scores = [sum(((straight, inverted)[r][b, s, t, u, v] for r, s, t, u, v in d), torch.zeros((), dtype=torch.float64))
                  for d in itg_derivations(0, n - 1, 0, m - 1)]
        counts.append(len(scores))
        expected.append(torch.logsumexp(torch.stack(scores), 0) if scores else torch.tensor(-math.inf, dtype=torch.float64))
    assert counts == [40, 8, 0]  # n = m: (Catalan(n-1) binary trees) x 2^(n-1) orientations; n != m: none
    assert itg(sr.Count, lengths=lengths, straight=straight, inverted=inverted).tolist() == counts
    assert_close(itg(sr.Log, lengths=lengths, straight=straight, inverted=inverted), torch.stack(expected))


# ---------------------------------------------------------------- edit distance

EDIT = """
E[0, 0]  = 1
E[i, j] += E[i-1, j] * delete[i-1]
E[i, j] += E[i, j-1] * insert[j-1]
E[i, j] += E[i-1, j-1] * substitute[i-1, j-1]
goal     = E[n, m]
"""


def levenshtein(a: str, b: str) -> int:
    """The fewest insertions, deletions and substitutions turning a into b (Wagner-Fischer)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def test_edit_distance_in_max_is_minus_levenshtein():
    pairs = [("kitten", "sitting"), ("flaw", "lawn"), ("", "abc"), ("abc", "abc"), ("intention", "execution")]
    N, M = max(len(a) for a, _ in pairs), max(len(b) for _, b in pairs)
    substitute = torch.zeros(len(pairs), N, M)
    for p, (a, b) in enumerate(pairs):
        for i, j in itertools.product(range(len(a)), range(len(b))):
            substitute[p, i, j] = -float(a[i] != b[j])
    lengths = {"n": torch.tensor([len(a) for a, _ in pairs]), "m": torch.tensor([len(b) for _, b in pairs])}
    got = sr.program(EDIT)(sr.Max, lengths=lengths, delete=-torch.ones(1, N), insert=-torch.ones(1, M), substitute=substitute)
    assert (-got).tolist() == [levenshtein(a, b) for a, b in pairs]


# ---------------------------------------------------------------- HMM with observations looked up

HMM = """
alpha[0, c]  = start[c] * emit[c, x[0]]
alpha[t, c] += alpha[t-1, y] * trans[y, c] * emit[c, x[t]]
goal        += alpha[n-1, c]
"""


def test_hmm_with_looked_up_observations_equals_brute_force():
    g = torch.Generator().manual_seed(2)
    T, C, V = 5, 3, 4
    start = torch.randn(1, C, generator=g, dtype=torch.float64).log_softmax(-1)
    trans = torch.randn(1, C, C, generator=g, dtype=torch.float64).log_softmax(-1)
    emit = torch.randn(1, C, V, generator=g, dtype=torch.float64).log_softmax(-1)
    x = torch.randint(V, (3, T), generator=g)
    lengths = torch.tensor([5, 3, 1])
    got = sr.program(HMM)(sr.Log, lengths=lengths, start=start, trans=trans, emit=emit, x=x)
    expected = []
    for b, n in enumerate(lengths.tolist()):
        joint = [start[0, z[0]] + sum(trans[0, p, q] for p, q in zip(z, z[1:])) + sum(emit[0, q, x[b, i]] for i, q in enumerate(z))
                 for z in itertools.product(range(C), repeat=n)]
        expected.append(torch.logsumexp(torch.stack(joint), 0))  # log p(x_0..x_{n-1})
    assert_close(got, torch.stack(expected))


# ---------------------------------------------------------------- second-order (sibling) Eisner

# McDonald & Pereira (2006): sib[h, p, m] scores m as the next child of h after p, on the same side,
# going outwards (p = h for the child closest to h). Position 0 is the root; it may have several children.
SIBLING_EISNER = """
C[s, s, d]  = 1
S[r, t]    += C[r, u, R] * C[u+1, t, L]                                  for u in r..t-1
I[s, t, R] += C[s+1, t, L] * arc[s, t] * sib[s, s, t]
I[s, t, R] += I[s, r, R] * S[r, t] * arc[s, t] * sib[s, r, t]            for r in s+1..t-1
I[s, t, L] += C[s, t-1, R] * arc[t, s] * sib[t, t, s]                                          if s > 0
I[s, t, L] += S[s, r] * I[r, t, L] * arc[t, s] * sib[t, r, s]            for r in s+1..t-1    if s > 0
C[s, t, R] += I[s, u, R] * C[u, t, R]                                    for u in s+1..t
C[s, t, L] += C[s, u, L] * I[u, t, L]                                    for u in s..t-1
goal        = C[0, n, R]
"""


def sibling_score(arcs: list[tuple[int, int]], arc: torch.Tensor, sib: torch.Tensor) -> torch.Tensor:
    score = sum(arc[h, m] for h, m in arcs)
    for h in {h for h, _ in arcs}:
        for side in (-1, 1):
            children = sorted((m for g, m in arcs if g == h and (m - h) * side > 0), key=lambda m: abs(m - h))
            score = score + sum(sib[h, p, m] for p, m in zip([h, *children], children))
    return score


def test_sibling_eisner_equals_brute_force():
    g = torch.Generator().manual_seed(3)
    N = 4
    arc = torch.randn(3, N + 1, N + 1, generator=g, dtype=torch.float64)
    sib = torch.randn(3, N + 1, N + 1, N + 1, generator=g, dtype=torch.float64)
    lengths = torch.tensor([4, 3, 1])
    program = sr.program(SIBLING_EISNER)
    expected, best = [], []
    for b, n in enumerate(lengths.tolist()):
        scores = torch.stack([sibling_score(arcs, arc[b], sib[b]) for arcs in projective_trees(n)])
        expected.append(torch.logsumexp(scores, 0))
        best.append(scores.max())
    assert_close(program(sr.Log, lengths=lengths, arc=arc, sib=sib), torch.stack(expected))
    assert_close(program(sr.Max, lengths=lengths, arc=arc, sib=sib), torch.stack(best))
