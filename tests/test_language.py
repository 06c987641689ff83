"""The rule language: checked programs, errors with line and column, and programs the library does
not ship running in every semiring and agreeing with brute force."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import semiring as sr
from brute import Enumeration, binary_trees, projective_trees, random_lengths, random_potentials
from structures import AlignmentCRF, LinearChainCRF, ProjectiveDependencyCRF, SemiMarkovCRF

EISNER = """
C[s, s, d]  = 1
I[s, t, R] += C[s, u, R] * C[u+1, t, L] * arc[s, t]    for u in s..t-1
I[s, t, L] += C[s, u, R] * C[u+1, t, L] * arc[t, s]    for u in s..t-1   if s > 0
C[s, t, R] += I[s, u, R] * C[u, t, R]                  for u in s+1..t
C[s, t, L] += C[s, u, L] * I[u, t, L]                  for u in s..t-1
goal        = C[0, n, R]
"""

CKY = """
span[i, i+1] = word[i]
span[i, k]  += span[i, j] * span[j, k] * rule[i, k]    for j in i+1..k-1
goal         = span[0, n]
"""


@pytest.fixture(scope="module")
def eisner():
    return sr.program(EISNER)


@pytest.fixture(scope="module")
def cky():
    return sr.program(CKY)


# ---------------------------------------------------------------- errors name line and column


def a(*shape):
    return torch.zeros(1, *shape)


ERRORS = [
    # (what, program lines, inputs, (line, column) or a list of them where any is right, phrase)
    ("missing input", ["x[i] = a[i] * b[i]", "goal += x[n-1]"], dict(a=a(3)), (1, 15), "input 'b' is not given"),
    ("misspelt chart is an input nobody gives",
     ["alpha[i] = a[i]", "goal += alhpa[n-1]"], dict(a=a(3)), (2, 9), "input 'alhpa' is not given"),
    ("item depends on itself under a condition", ["x[i] = a[i]", "x[i] += x[i] * a[i] if i > 0", "goal += x[n-1]"], dict(a=a(3)),
     (2, 9), "an item depends on itself (a cycle among the rules): x[i] reads x[i]; see Cycles. It has 'for' or 'if'."),
    ("cycle through two charts with two weights", ["x[i] = a[i]", "x[i] += y[i] * a[i] * a[i]", "  y[i] += x[i]", "goal += x[n-1]"],
     dict(a=a(3)), (2, 9), "Its weights must be one input, not a[i] * a[i]"),
    ("cycle without labels that diverges", ["goal += x[n-1]", "x[i] = a[i]", "x[i] += y[i]", "y[i] += x[i]"], dict(a=a(3)),
     (3, 9), "the spectral radius of the block matrix of ones over the charts 'x', 'y' is 1 >= 1"),
    ("item defined only from itself", ["x[i] += x[i] * a[i]", "goal += x[n-1]"], dict(a=a(3)), (1, 1), "no base case for chart 'x'"),
    ("chart grows without limit", ["x[0] = 1", "x[i+1] += x[i]", "goal += x[n]"], dict(), (2, 1), "chart 'x' grows without limit"),
    ("no base case", ["alpha[i, c] += alpha[i-1, y] * edge[i-1, y, c]", "goal += alpha[n-1, c]"], dict(edge=a(3, 2, 2)), (1, 1),
     "no base case for chart 'alpha'"),
    ("no base case through another chart", ["x[0] = a[0]", "y[i] += z[i-1]", "z[i] += y[i] * a[i]", "goal += x[n-1] * y[n-1]"],
     dict(a=a(3)), (2, 1), "no base case for chart 'y'"),
    ("a digit that is not ASCII", ["x[i] = a[i]", "y[i] += x[i-\u0661] * a[i]", "goal += y[n-1]"], dict(a=a(3)), (2, 13),
     "'\u0661' is not an ASCII digit"),
    ("a fullwidth digit", ["x[\uff10] = a[0]", "goal += x[n-1]"], dict(a=a(3)), (1, 3), "is not an ASCII digit"),
    ("no program", ["  # a comment", ""], dict(), (1, 1), "a program needs at least one rule"),
    ("for without a variable", ["x[i] = a[i] for 1 in 0..2", "goal += x[n-1]"], dict(a=a(3)), (1, 17), "expected a variable, found '1'"),
    ("variable nothing bounds", ["x[i] = a[i] if j > i", "goal += x[n-1]"], dict(a=a(3)), (1, 16), "cannot bound the index variable 'j' of this rule for chart 'x'"),
    ("head index nothing bounds", ["x[i] = a[j]", "goal = x[n-1]"], dict(a=a(3)), (1, 3), "cannot bound the index variable 'i'"),
    ("head index bounded only by its own chart", ["x[i] = a[i]", "y[i] += x[j]", "goal += y[n-1]"], dict(a=a(3)), (2, 3),
     "cannot bound the index variable 'i'"),
    ("summed variable nothing bounds", ["x[i] += a[i] for j in 0..k", "goal += x[n-1]"], dict(a=a(3)), (1, 18), "cannot bound the index variable"),
    ("input of the wrong rank", ["x[i] = a[i]", "goal += x[n-1]"], dict(a=a(3, 3)), (1, 8), "needs shape [B, ?]"),
    ("input used with two ranks", ["x[i] = a[i]", "y[i] = a[i, i]", "goal += y[n-1]"], dict(a=a(3)), (2, 8), "input 'a'"),
    ("chart defined with two ranks", ["x[i] = a[i]", "x[i, j] += a[j]", "goal += x[n-1]"], dict(a=a(3)), (2, 1), "chart 'x'"),
    ("chart read with another rank", ["x[i] = a[i]", "y[i] = x[i, i]", "goal += y[n-1]"], dict(a=a(3)), (2, 8), "chart 'x'"),
    ("n outside goal", ["x[i] = a[n]", "goal += x[n-1]"], dict(a=a(3)), (1, 1), "'n' may only appear"),
    ("goal read by a rule", ["x[i] = a[i]", "y[i] = goal", "goal += x[n-1]"], dict(a=a(3)), (2, 8), "'goal' cannot be read"),
    ("no goal", ["x[i] = a[i]"], dict(a=a(3)), (1, 1), "no rule defines 'goal'"),
    ("unclosed bracket", ["x[i] = a[i", "goal += x[n-1]"], dict(a=a(3)), (1, 11), "expected ]"),
    ("stray operator", ["x[i] = a[i] +* a[i]", "goal += x[n-1]"], dict(a=a(3)), (1, 13), "unexpected '+'"),
    ("unknown character", ["x[i] = a[i]", "goal += x[n-1] ; 1"], dict(a=a(3)), (2, 16), "unexpected character ';'"),
    ("number other than 1", ["x[i] = 2 * a[i]", "goal += x[n-1]"], dict(a=a(3)), (1, 8), "the only number"),
    ("missing =", ["x[i] a[i]", "goal += x[n-1]"], dict(a=a(3)), (1, 6), "expected '=' or '+='"),
    ("a new unary rule closes a cycle", ["x[i] = a[i]", "y[i] += x[i]", "z[i] += y[i]", "x[i] += z[i] if i > 0", "goal += x[n-1]"],
     dict(a=a(3)), (4, 9), "depends on itself"),
    ("a summed variable without its range", ["S[s, s] = w[s]", "S[s, t] += S[s, u] * S[u+1, t]", "goal = S[0, n-1]"],
     dict(w=a(4)), (2, 1), "has no 'for' range"),
    ("inputs disagree on a shared index", ["x[i] = a[i] * b[i]", "goal += x[n-1]"], dict(a=a(3), b=a(4)), (1, 15),
     "share the index 'i' but have 3 and 4 entries"),
    ("a label dimension too small", ["x[i, R] = a[i, R]", "x[i, L] = a[i, L]", "goal += x[n-1, L]"], dict(a=a(3, 1)),
     (2, 11), "the constant L needs 2"),
    ("integer potentials", ["x[i] = a[i]", "goal += x[n-1]"], dict(a=torch.zeros(1, 3, dtype=torch.long)), (1, 8),
     "must be floating point"),
    ("an index constant beyond int64", ["x[i] = a[i+99999999999999999999]", "goal += x[n-1]"], dict(a=a(3)), (1, 12),
     "beyond what an index can be"),
]


def test_a_program_is_text():
    with pytest.raises(sr.ProgramError, match="a program is text"):
        sr.program(["x[i] = a[i]"])


@pytest.mark.parametrize("what, lines, inputs, at, phrase", ERRORS, ids=[e[0] for e in ERRORS])
def test_program_errors_name_line_and_column(what, lines, inputs, at, phrase):
    with pytest.raises(sr.ProgramError) as error:
        sr.program("\n".join(lines))(sr.Log, **inputs)
    message = str(error.value)
    assert isinstance(error.value, ValueError)
    assert phrase in message
    assert any(f"line {line}, column {column}:" in message for line, column in (at if isinstance(at, list) else [at])), message


def test_inputs_the_program_does_not_read_are_named():
    with pytest.raises(ValueError, match=r"unknown input\(s\) \['b'\].*\['a'\]"):
        sr.program("x[i] = a[i]\ngoal += x[n-1]")(sr.Log, a=a(3), b=a(3))


def test_lengths_for_a_program_without_n_are_refused():
    with pytest.raises(ValueError, match="lengths"):
        sr.program("goal += a[i]")(sr.Log, lengths=torch.tensor([1]), a=a(3))


def test_a_sum_with_no_head_index_reads_every_instance():
    """``goal += a[i] * b[j]`` has rank-0 head and two summed variables: Σ_ij a_i b_j."""
    x, y = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)
    got = sr.program("goal += a[i] * b[j]")(sr.Log, a=x, b=y)
    assert_close(got, torch.logsumexp(x, -1) + torch.logsumexp(y, -1))


# ---------------------------------------------------------------- the compiler's own work


def test_the_two_eisner_incomplete_rules_share_one_sub_sum(eisner):
    shared = [r for r in eisner.rules if r.head.name.startswith("_sum")]
    assert len(shared) == 1
    readers = [r for r in eisner.rules if any(t.name == shared[0].head.name for t in r.terms)]
    assert sorted(r.head.name for r in readers) == ["I", "I"]


def test_chain_wavefront_is_one_level_per_position():
    chain = sr.program("""
        alpha[0, c]  = 1
        alpha[i, c] += alpha[i-1, y] * edge[i-1, y, c]
        goal        += alpha[n-1, c]
    """)
    levels = [len(chain.plan({"edge": (N - 1, 2, 2)}).levels) for N in range(2, 7)]
    assert [b - a for a, b in zip(levels, levels[1:])] == [1, 1, 1, 1]



def test_a_chart_of_another_phase_does_not_starve_the_search_for_levels():
    """``Y`` reads no chart, a phase of its own; levels are searched per phase, so its candidates no
    longer multiply those tried for CKY's charts (they did, past the search's budget, where ``Y``
    comes before CKY's sub-sum chart)."""
    cky = sr.program("""
        X[s, s, a]  = word[s, a] * Y[s, s, a]
        Y[s, s, a]  = tag[s, a]
        X[s, t, a] += X[s, u, b] * X[u+1, t, c] * rule[a, b, c]    for u in s..t-1
        goal        = X[0, n-1, 0]
    """)
    word, tag, rule = torch.zeros(1, 3, 2), torch.zeros(1, 3, 2), torch.zeros(1, 2, 2, 2)
    assert cky(sr.Count, word=word, tag=tag, rule=rule).item() == 2 * 2 ** 4  # 2 trees of 3 words, the root's label 0

# ---------------------------------------------------------------- programs the library does not ship


def catalan(n: int) -> int:
    return math.comb(2 * n, n) // (n + 1)


@pytest.mark.parametrize("n", range(1, 8))
def test_eisner_counts_multi_root_projective_trees(eisner, n):
    count = eisner(sr.Count, arc=torch.zeros(1, n + 1, n + 1))
    assert count.item() == math.comb(3 * n, n) // (2 * n + 1)


@pytest.mark.parametrize("n", range(1, 8))
def test_forbidden_arcs_reduce_the_count(eisner, n):
    """With every left arc forbidden (heads precede their dependents) the projective trees are the
    ordered trees on n + 1 nodes in preorder: Catalan(n) of them."""
    left = torch.ones(n + 1, n + 1).tril(-1).bool()
    arc = torch.zeros(1, n + 1, n + 1).masked_fill(left, -math.inf)
    assert eisner(sr.Count, arc=arc).item() == catalan(n)


def test_eisner_count_with_lengths(eisner):
    lengths = torch.tensor([5, 1, 3, 2])
    count = eisner(sr.Count, lengths=lengths, arc=torch.zeros(4, 6, 6))
    assert count.tolist() == [math.comb(3 * n, n) // (2 * n + 1) for n in lengths.tolist()]


@pytest.mark.parametrize("n", range(1, 7))
def test_cky_counts_binary_bracketings(cky, n):
    assert cky(sr.Count, word=torch.zeros(1, n), rule=torch.zeros(1, n + 1, n + 1)).item() == catalan(n - 1)


def k_best(scores: torch.Tensor, k: int) -> torch.Tensor:
    return torch.cat([scores, torch.full((k,), -math.inf, dtype=scores.dtype)]).sort(descending=True).values[:k]


@pytest.mark.parametrize("forbid", [0.0, 0.3])
def test_cky_in_every_semiring_equals_brute_force(cky, forbid):
    g = torch.Generator().manual_seed(10)
    N, k = 5, 4
    word = random_potentials((N,), 4, g)
    rule = random_potentials((N + 1, N + 1), 4, g, forbid).requires_grad_()
    lengths = random_lengths(4, N, g)
    enums = [Enumeration(r.detach(), binary_trees(0, n)) for r, n in zip(rule, lengths.tolist())]
    leaves = torch.stack([w[:n].sum() for w, n in zip(word, lengths.tolist())])

    log_z = cky(sr.Log, lengths=lengths, word=word, rule=rule)
    assert_close(log_z, torch.stack([e.log_partition for e in enums]) + leaves)
    (marginals,) = torch.autograd.grad(log_z.sum(), rule)
    some = log_z.isfinite()  # marginals exist where some structure does (the distributions mask the rest)
    assert_close(marginals[some], torch.stack([e.marginals for e in enums])[some])
    assert_close(cky(sr.Max, lengths=lengths, word=word, rule=rule), torch.stack([e.max for e in enums]) + leaves)
    assert_close(cky(sr.KMax(k), lengths=lengths, word=word, rule=rule),
                 torch.stack([k_best(e.scores, k) for e in enums], 1) + leaves)
    assert cky(sr.Count, lengths=lengths, word=word, rule=rule).tolist() == [e.count for e in enums]


@pytest.mark.parametrize("forbid", [0.0, 0.3])
def test_eisner_in_every_semiring_equals_brute_force(eisner, forbid):
    g = torch.Generator().manual_seed(11)
    N, k = 4, 5
    arc = random_potentials((N + 1, N + 1), 3, g, forbid).requires_grad_()
    lengths = random_lengths(3, N, g)
    enums = [Enumeration(x.detach(), projective_trees(n)) for x, n in zip(arc, lengths.tolist())]

    log_z = eisner(sr.Log, lengths=lengths, arc=arc)
    assert_close(log_z, torch.stack([e.log_partition for e in enums]))
    (marginals,) = torch.autograd.grad(log_z.sum(), arc)
    some = log_z.isfinite()  # marginals exist where some structure does (the distributions mask the rest)
    assert_close(marginals[some], torch.stack([e.marginals for e in enums])[some])
    assert_close(eisner(sr.Max, lengths=lengths, arc=arc), torch.stack([e.max for e in enums]))
    assert_close(eisner(sr.KMax(k), lengths=lengths, arc=arc), torch.stack([k_best(e.scores, k) for e in enums], 1))
    assert eisner(sr.Count, lengths=lengths, arc=arc).tolist() == [e.count for e in enums]


# ---------------------------------------------------------------- the compiler's plan


PCFG = """
X[s, s, a] = term[s, a]
X[s, t, a] += X[s, u, b] * X[u+1, t, c] * rule[a, b, c]    for u in s..t-1
goal = X[0, n-1, 0]
"""

PCFG_BY_HAND = """
X[s, s, a] = term[s, a]
P[s, t, b, c] += X[s, u, b] * X[u+1, t, c]    for u in s..t-1
X[s, t, a] += P[s, t, b, c] * rule[a, b, c]
goal = X[0, n-1, 0]
"""


def test_the_pcfg_rule_sums_the_split_point_before_the_child_labels():
    rules = [str(r) for r in sr.program(PCFG).rules]
    assert rules[1] == "_part0[s, t, b, c] += X[s, u, b] * X[u+1, t, c] for u in s..t-1"
    assert rules[2] == "X[s, t, a] += _part0[s, t, b, c] * rule[a, b, c]"


@pytest.mark.parametrize("N", [3, 17, 40])
def test_the_eliminated_pcfg_equals_the_hand_factored_one_at_every_length(N):
    """Also a check of the plan's level ranges at sizes where a fixpoint needs several sweeps."""
    g = torch.Generator().manual_seed(N)
    term = torch.randn(2, N, 3, generator=g, dtype=torch.float64)
    rule = torch.randn(1, 3, 3, 3, generator=g, dtype=torch.float64)
    lengths = torch.tensor([N, max(1, N // 2)])
    got = sr.program(PCFG)(sr.Log, lengths=lengths, term=term, rule=rule)
    assert got.isfinite().all()
    assert_close(got, sr.program(PCFG_BY_HAND)(sr.Log, lengths=lengths, term=term, rule=rule))


# ---------------------------------------------------------------- a call validates like a structure does

CHAIN = """
alpha[0, c]  = 1
alpha[i, c] += alpha[i-1, y] * edge[i-1, y, c]
goal        += alpha[n-1, c]
"""


def test_nan_potentials_are_refused_naming_the_input():
    edge = torch.randn(2, 4, 3, 3)
    edge[1, 2, 0, 1] = math.nan
    for semiring in (sr.Log, sr.Max):
        with pytest.raises(ValueError, match="edge: contains NaN"):
            sr.program(CHAIN)(semiring, edge=edge)


@pytest.mark.parametrize("semiring", [sr.Log, sr.KMax(3)], ids=str)
def test_a_batch_of_no_examples_gives_no_values(semiring):
    edge = torch.zeros(0, 4, 3, 3, requires_grad=True)
    value = sr.program(CHAIN)(semiring, lengths=torch.zeros(0, dtype=torch.long), edge=edge)
    assert value.shape == (*semiring.zero((), edge).shape, 0)
    (grad,) = torch.autograd.grad(value.sum(), edge)
    assert grad.shape == edge.shape


@pytest.mark.parametrize("given", [[5, 2], torch.tensor([5, 2], dtype=torch.int8), torch.tensor([5, 2], dtype=torch.int16),
                                   torch.tensor([5, 2], dtype=torch.uint8), torch.tensor([5, 2], dtype=torch.int32)],
                         ids=["list", "int8", "int16", "uint8", "int32"])
def test_lengths_as_a_list_or_a_small_integer_dtype_read_as_int64(given):
    """Each example's log Z equals that of the example alone, cut to its length (uint8 is no mask)."""
    edge = torch.randn(2, 4, 3, 3, dtype=torch.float64)
    chain = sr.program(CHAIN)
    alone = [chain(sr.Log, edge=edge[b:b + 1, :n - 1]) for b, n in enumerate([5, 2])]
    assert_close(chain(sr.Log, lengths=given, edge=edge), torch.cat(alone))


@pytest.mark.parametrize("shape", [(5, 4), (4, 5)])
def test_a_non_square_input_where_the_rules_need_a_square_one_is_refused(eisner, shape):
    """Eisner reads arc[s, t] and arc[t, s] into the same items: a non-square arc would drop trees."""
    with pytest.raises(ValueError, match="input 'arc' .* chart 'I' .* square input\\): got"):
        eisner(sr.Count, arc=torch.zeros(1, *shape))
    assert eisner(sr.Count, arc=torch.zeros(1, 5, 5)).item() == 55  # the 4-word projective trees


# ---------------------------------------------------------------- several lengths

ALIGNMENT = """
A[0, 0] = 1
A[i, j] += A[i-1, j] * a[i, j]
A[i, j] += A[i, j-1] * b[i, j]
A[i, j] += A[i-1, j-1] * c[i, j]
goal = A[n, m]
"""


def delannoy(n: int, m: int) -> int:
    return sum(math.comb(n, k) * math.comb(m, k) * 2**k for k in range(min(n, m) + 1))


def alignment_log_z(a, b, c, n, m) -> float:
    """The forward recursion in plain Python, one example."""
    A = {(0, 0): 0.0}
    for i in range(n + 1):
        for j in range(m + 1):
            if (i, j) == (0, 0):
                continue
            paths = [A[i - 1, j] + a[i, j]] if i else []
            paths += [A[i, j - 1] + b[i, j]] if j else []
            paths += [A[i - 1, j - 1] + c[i, j]] if i and j else []
            A[i, j] = torch.logsumexp(torch.tensor(paths, dtype=torch.float64), 0).item()
    return A[n, m]


def test_a_program_with_two_lengths_reads_each_example_at_both():
    program = sr.program(ALIGNMENT)
    assert program.syntax.lengths == ["n", "m"]
    N, M = 4, 6
    zeros = torch.zeros(3, N + 1, M + 1)
    lengths = {"n": torch.tensor([4, 2, 0]), "m": torch.tensor([6, 3, 5])}
    assert program(sr.Count, lengths=lengths, a=zeros, b=zeros, c=zeros).tolist() == [delannoy(4, 6), delannoy(2, 3), 1]
    only_n = program(sr.Count, lengths={"n": torch.tensor([1, 2, 3])}, a=zeros, b=zeros, c=zeros)  # m: the largest
    assert only_n.tolist() == [delannoy(n, M) for n in (1, 2, 3)]
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(3, N + 1, M + 1, generator=g, dtype=torch.float64) for _ in range(3))
    got = program(sr.Log, lengths=lengths, a=a, b=b, c=c)
    expected = [alignment_log_z(a[k], b[k], c[k], int(lengths["n"][k]), int(lengths["m"][k])) for k in range(3)]
    assert_close(got, torch.tensor(expected, dtype=torch.float64))
    x = a.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x: program(sr.Log, lengths=lengths, a=x, b=b, c=c), (x,))


def test_a_second_length_is_never_summed_silently():
    program = sr.program(ALIGNMENT)
    zeros = torch.zeros(2, 3, 3)
    with pytest.raises(ValueError, match=r"lengths \['n', 'm'\]: give a dict"):
        program(sr.Log, lengths=torch.tensor([1, 2]), a=zeros, b=zeros, c=zeros)
    with pytest.raises(ValueError, match=r"lengths\['m'\]: \[3\] out of range; these shapes allow 0..2"):
        program(sr.Log, lengths={"n": torch.tensor([1, 2]), "m": torch.tensor([3, 1])}, a=zeros, b=zeros, c=zeros)
    with pytest.raises(ValueError, match=r"\['k'\] are not lengths"):
        program(sr.Log, lengths={"k": torch.tensor([1, 2])}, a=zeros, b=zeros, c=zeros)


# ---------------------------------------------------------------- lookups by data

CTC = """
alpha[0, s] = logp[0, ext[s]] * first[s]
alpha[t, s] += alpha[t-1, s] * logp[t, ext[s]]
alpha[t, s] += alpha[t-1, s-1] * logp[t, ext[s]]
alpha[t, s] += alpha[t-1, s-2] * skip[s] * logp[t, ext[s]]
goal += alpha[n-1, m-1]
goal += alpha[n-1, m-2]
"""

# The lookups gathered once into a chart that the recursion reads (the chart e bounds alpha's t and s).
CTC_GATHERED = """
e[t, s] = logp[t, ext[s]]
alpha[0, s] = e[0, s] * first[s]
alpha[t, s] += alpha[t-1, s] * e[t, s]
alpha[t, s] += alpha[t-1, s-1] * e[t, s]
alpha[t, s] += alpha[t-1, s-2] * skip[s] * e[t, s]
goal += alpha[n-1, m-1]
goal += alpha[n-1, m-2]
"""


def ctc_inputs(targets: torch.Tensor, blank: int = 0):
    """The extended label sequence (blanks between and around the labels), where a step may skip
    one position (not onto a blank, not between equal labels), and the two first positions."""
    B, L = targets.shape
    ext = torch.full((B, 2 * L + 1), blank, dtype=torch.long)
    ext[:, 1::2] = targets
    skip = torch.full(ext.shape, -math.inf, dtype=torch.float64)
    skip[:, 2:] = torch.where((ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2]), 0.0, -math.inf)
    first = torch.full((1, 2 * L + 1), -math.inf, dtype=torch.float64)
    first[:, :2] = 0
    return ext, skip, first


@pytest.mark.parametrize("text", [CTC, CTC_GATHERED], ids=["inline", "gathered"])
def test_ctc_written_with_a_lookup_equals_torch_ctc_loss(text):
    """``logp[t, ext[s]]`` reads each example's own labels: the CTC forward algorithm in four rules."""
    g = torch.Generator().manual_seed(3)
    B, T, V, L = 3, 12, 5, 4
    x = torch.randn(B, T, V, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(1, V, (B, L), generator=g)
    input_lengths, target_lengths = torch.tensor([12, 9, 7]), torch.tensor([4, 2, 3])
    ext, skip, first = ctc_inputs(targets)
    logp = x.log_softmax(-1)
    ours = sr.program(text)(sr.Log, lengths={"n": input_lengths, "m": 2 * target_lengths + 1},
                           logp=logp, first=first, skip=skip, ext=ext)
    theirs = -torch.nn.functional.ctc_loss(logp.transpose(0, 1), targets, input_lengths, target_lengths, reduction="none")
    assert_close(ours, theirs)
    (g_ours,) = torch.autograd.grad(ours.sum(), x, retain_graph=True)
    (g_theirs,) = torch.autograd.grad(theirs.sum(), x)
    assert_close(g_ours, g_theirs)


def test_a_recursion_bounded_by_a_chart_it_reads_compiles_at_any_length():
    """``alpha[t] += alpha[t-1] * e[t]``: alpha's t is bounded by e's extent, not grown one step per
    sweep of the extent fixpoint from alpha's own (which once gave up at about ten steps)."""
    g = torch.Generator().manual_seed(4)
    B, T, V, L = 2, 64, 5, 20
    targets = torch.randint(1, V, (B, L), generator=g)
    ext, skip, first = ctc_inputs(targets)
    logp = torch.randn(B, T, V, generator=g, dtype=torch.float64).log_softmax(-1)
    inputs = dict(lengths={"n": torch.tensor([T, 50]), "m": torch.tensor([2 * L + 1, 31])}, logp=logp, first=first, skip=skip, ext=ext)
    assert_close(sr.program(CTC_GATHERED)(sr.Log, **inputs), sr.program(CTC)(sr.Log, **inputs))


def test_looked_up_indices_are_checked():
    program = sr.program(CTC)
    ext, skip, first = ctc_inputs(torch.tensor([[1, 2]]))
    logp = torch.zeros(1, 4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"ext: holds indices, which must lie in 0..2"):
        program(sr.Log, logp=logp, first=first, skip=skip, ext=ext + 5)
    with pytest.raises(sr.ProgramError, match="must be an integer tensor"):
        program(sr.Log, logp=logp, first=first, skip=skip, ext=ext.double())
    with pytest.raises(sr.ProgramError, match="may only index an input"):
        sr.program("x[i, lab[i]] = a[i]\ngoal += x[n-1, 0]")


# ---------------------------------------------------------------- the device of the inputs


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("semiring", [sr.Log, sr.Max, sr.KMax(2)], ids=str)
def test_programs_run_on_the_device_of_their_inputs(semiring):
    g = torch.Generator().manual_seed(5)
    arc = torch.randn(3, 7, 7, generator=g, dtype=torch.float64)
    lengths = torch.tensor([6, 3, 1])
    eisner = sr.program(EISNER)
    on_cpu = eisner(semiring, lengths=lengths, arc=arc.clone().requires_grad_())
    x = arc.cuda().requires_grad_()
    on_gpu = eisner(semiring, lengths=lengths.cuda(), arc=x)
    assert on_gpu.device.type == "cuda"
    assert_close(on_gpu.cpu(), on_cpu)
    (grad,) = torch.autograd.grad(on_gpu.sum(), x)
    assert grad.device.type == "cuda"
    ext, skip, first = ctc_inputs(torch.tensor([[1, 2], [2, 2]]))
    logp = torch.randn(2, 6, 3, generator=g, dtype=torch.float64).log_softmax(-1)
    ctc = sr.program(CTC)
    assert_close(ctc(semiring, logp=logp.cuda(), first=first.cuda(), skip=skip.cuda(), ext=ext.cuda()).cpu(),
                 ctc(semiring, logp=logp, first=first, skip=skip, ext=ext))


@pytest.mark.parametrize("make, theta", [
    (AlignmentCRF, (3, 5, 4)), (LinearChainCRF, (3, 6, 3, 3)), (ProjectiveDependencyCRF, (3, 6, 6)), (SemiMarkovCRF, (3, 7, 3, 3, 3)),
], ids=["alignment (n and m)", "chain", "projective", "semi-Markov"])
@pytest.mark.parametrize("semiring", [sr.Log, sr.Max], ids=str)
def test_a_run_without_lengths_computes_its_goal_at_the_largest_lengths_only(make, theta, semiring):
    """The same values and gradients as with every length given at its largest (a plan whose goal is
    at every length), from a plan whose goal box is the largest lengths alone."""
    x = torch.randn(*theta, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x[0].view(-1)[::5] = -math.inf
    plain = make(x)
    full = make(x, plain.lengths)  # the same lengths, given
    assert plain._lengths is None and full._lengths is not None
    program = plain.program
    for d in (plain, full):
        d.run(semiring)
        assert (next(reversed(program._plans.values())).boxes["goal"].size == 1) is (d is plain)
    assert torch.equal(plain.run(semiring), full.run(semiring))
    xs = [x.clone().requires_grad_() for _ in range(2)]
    grads = [torch.autograd.grad(make(xi, *([] if d is plain else [plain.lengths])).run(semiring).sum(), xi)[0]
             for xi, d in zip(xs, (plain, full))]
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("make, theta, lengths", [
    (AlignmentCRF, (2, 5, 4), (torch.tensor([5, 3]), torch.tensor([4, 2]))), (LinearChainCRF, (2, 6, 3, 3), torch.tensor([7, 4])),
], ids=["alignment (n and m)", "chain"])
@pytest.mark.parametrize("given", [False, True], ids=["without lengths", "with lengths"])
def test_checking_and_running_a_structure_make_one_plan(make, theta, lengths, given, monkeypatch):
    """The checks read the lengths the shapes allow from the plan the runs take (its goal at every
    length where lengths are given, at the largest alone where not): one plan at a new shape."""
    program = make(torch.randn(*theta)).program
    monkeypatch.setattr(program, "_plans", type(program._plans)())
    d = make(torch.randn(*theta), lengths if given else None)
    d.marginals, d.log_partition, d.argmax
    (key,) = program._plans
    assert key[1] is not given
