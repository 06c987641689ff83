"""PCFG and TDPCFG against every tree (and every derivation) listed by hand, torch-struct's SentCFG,
and each other."""

from __future__ import annotations

import itertools
import warnings
from typing import Iterator

import pytest
import torch
from torch.testing import assert_close

from structures.pcfg import PCFG, TDPCFG

# A derivation of words i..j: (chart parts (i, j, label), binary nodes (i, j, a, x, y), its symbol).
Derivation = tuple[list[tuple[int, int, int]], list[tuple[int, int, int, int, int]], int]


def derivations(i: int, j: int, NT: int, T: int) -> Iterator[Derivation]:
    """Every labelled binary tree over words i..j (inclusive): preterminals over single words, a
    nonterminal over each longer span, every split, every label."""
    if i == j:
        for p in range(T):
            yield [(i, i, p)], [], NT + p
        return
    for k in range(i, j):
        for left, right in itertools.product(list(derivations(i, k, NT, T)), list(derivations(k + 1, j, NT, T))):
            for a in range(NT):
                yield [(i, j, a), *left[0], *right[0]], [(i, j, a, left[2], right[2]), *left[1], *right[1]], a


class Trees:
    """The trees of one example of ``d`` (a PCFG, or a TDPCFG with ``ranks`` listing every rank per
    node: its derivations), as one-hot charts ``[S, N, N, K]`` and scores ``[S]`` from the inputs."""

    def __init__(self, d, b: int, terms, roots, rule_score, ranks: int = 0):
        n, N, K = int(d.lengths[b]), d.log_potentials.shape[1], d.log_potentials.shape[-1]
        charts, scores = [], []
        for parts, nodes, top in derivations(0, n - 1, d.NT, d.T):
            for rs in itertools.product(range(ranks), repeat=len(nodes)) if ranks else [None]:
                chart = torch.zeros(N, N, K, dtype=terms.dtype)
                for i, j, x in parts:
                    chart[i, j, x] = 1
                score = roots[b, top] + sum(terms[b, i, x] for i, j, x in parts if i == j)
                for m, (i, j, a, x, y) in enumerate(nodes):
                    if rs is None:
                        score = score + rule_score(a, x, y)
                    else:
                        chart[j, i, rs[m]] = 1
                        score = score + rule_score(a, x, y, rs[m])
                charts.append(chart)
                scores.append(score)
        self.charts, self.scores = torch.stack(charts), torch.stack(scores)

    @property
    def log_probs(self):
        return torch.where(self.scores.isfinite(), self.scores - torch.logsumexp(self.scores, 0), float("-inf"))

    @property
    def marginals(self):
        return torch.einsum("s,s...->...", self.log_probs.exp(), self.charts)


def grammar(B=2, N=4, NT=2, T=3, seed=0, dtype=torch.float64, forbid=True):
    """Random inputs; with ``forbid``, some -inf: a tag, a rule, a root."""
    g = torch.Generator().manual_seed(seed)
    terms = torch.randn(B, N, T, generator=g, dtype=dtype)
    rules = torch.randn(B, NT, NT + T, NT + T, generator=g, dtype=dtype)
    roots = torch.randn(B, NT, generator=g, dtype=dtype)
    if forbid:
        terms[0, 1, 0] = rules[0, 1, 0, NT] = roots[1, 0] = float("-inf")
    return terms, rules, roots


def factors(B=2, NT=2, T=2, R=2, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, size, R, generator=g, dtype=dtype) for size in (NT, NT + T, NT + T)]


@pytest.mark.parametrize("lengths", [None, [3, 2], [4, 2]])
def test_pcfg_equals_enumeration_of_every_tree(lengths):
    terms, rules, roots = grammar()
    lengths = None if lengths is None else torch.tensor(lengths)
    if lengths is not None and lengths.max() < 4:
        terms = terms[:, :3]
    d = PCFG(terms, rules, roots, lengths)
    for b in range(2):
        e = Trees(d, b, terms, roots, lambda a, x, y: rules[b, a, x, y])
        finite = torch.isfinite(e.scores)
        assert d.count[b] == finite.sum()
        assert_close(d.log_partition[b], torch.logsumexp(e.scores, 0))
        assert_close(d.marginals[b], e.marginals)
        assert_close(d.max[b], e.scores.max())
        assert_close(d.topk_scores(3)[:, b], e.scores.topk(3).values)
        assert_close(d.entropy()[b], -(e.log_probs.exp() * e.log_probs.masked_fill(~finite, 0)).sum())
        assert_close(d.log_prob(e.charts.unsqueeze(1).expand(-1, 2, -1, -1, -1))[:, b], e.log_probs)
        best = e.charts[e.scores.argmax()]
        assert_close(d.argmax[b], best)
        assert d.decode()[b] == sorted(((i, j, x + (d.NT if i == j else 0)) for i, j, x in best.nonzero().tolist()),
                                       key=lambda s: (s[0], -s[1]))


def test_pcfg_support_samples_and_expected_rules():
    terms, rules, roots = grammar(N=3, T=2)
    d = PCFG(terms, rules, roots)
    values, valid = d.enumerate_structures()
    assert valid.sum(0).tolist() == d.count.tolist()
    assert_close((d.log_prob(values).exp() * valid).sum(0), torch.ones(2, dtype=torch.float64))
    samples = d.sample((4000,))
    assert torch.isfinite(d.log_prob(samples)).all()
    assert (samples.mean(0) - d.marginals).abs().max() < 0.05
    e = Trees(d, 0, terms, roots, lambda a, x, y: rules[0, a, x, y])
    counts = torch.zeros_like(rules[0])
    for (parts, nodes, _), p in zip(derivations(0, 2, 2, 2), e.log_probs.exp()):
        for _, _, a, x, y in nodes:
            counts[a, x, y] += p
    assert_close(d.expected_rules[0], counts)


def test_nothing_left_gives_minus_inf_and_zero_marginals():
    terms, rules, roots = grammar(forbid=False)
    roots = roots.clone()
    roots[1] = float("-inf")
    d = PCFG(terms, rules, roots)
    assert torch.isneginf(d.log_partition[1]) and torch.isfinite(d.log_partition[0])
    assert (d.marginals[1] == 0).all() and not d.marginals.isnan().any()


def test_a_padded_batch_equals_its_examples_alone_and_a_shared_grammar_its_copies():
    terms, rules, roots = grammar(B=3, N=6, forbid=False)
    lengths = torch.tensor([6, 2, 4])
    d = PCFG(terms, rules[:1], roots[:1], lengths)
    for b in range(3):
        n = int(lengths[b])
        alone = PCFG(terms[b:b + 1, :n], rules[:1], roots[:1])
        assert_close(d.log_partition[b:b + 1], alone.log_partition)
        assert_close(d.marginals[b:b + 1, :n, :n], alone.marginals)
        assert (d.marginals[b, n:] == 0).all() and (d.marginals[b, :, n:] == 0).all()
    copies = PCFG(terms, rules[:1].expand(3, -1, -1, -1), roots[:1].expand(3, -1), lengths)
    assert_close(d.log_partition, copies.log_partition)


def test_pcfg_equals_torch_struct_sentcfg():
    torch_struct = pytest.importorskip("torch_struct")
    warnings.filterwarnings("ignore", message=".*arg_constraints.*")
    B, N, NT, T = 3, 7, 3, 4
    terms, rules, roots = grammar(B, N, NT, T, forbid=False)
    lengths = torch.tensor([7, 5, 2])
    d = PCFG(terms, rules, roots, lengths)
    theirs = torch_struct.SentCFG((terms, rules, roots), lengths=lengths)
    assert_close(d.log_partition, theirs.partition)
    term_m, rule_m, root_m, _ = theirs.marginals
    assert_close(d.marginals.diagonal(0, 1, 2)[:, :T].transpose(1, 2), term_m)
    assert_close(d.expected_rules, rule_m)
    assert_close(d.marginals[torch.arange(B), 0, lengths - 1, :NT], root_m)


def test_tdpcfg_equals_the_pcfg_of_the_rules_its_factors_define():
    B, N, NT, T, R = 2, 6, 3, 4, 5
    terms, _, roots = grammar(B, N, NT, T, forbid=False)
    U, V, W = factors(B, NT, T, R)
    lengths = torch.tensor([6, 3])
    td = TDPCFG(terms, U, V, W, roots, lengths)
    d = PCFG(terms, td.rules(), roots, lengths)
    assert_close(td.log_partition, d.log_partition)
    upper = torch.ones(N, N, dtype=torch.bool).triu()[..., None]  # labelled spans and tags, not ranks
    assert_close(td.marginals[..., : d.log_potentials.shape[-1]] * upper, d.marginals)
    assert_close(td.rules(), torch.logsumexp(U[:, :, None, None] + V[:, None, :, None] + W[:, None, None], -1))


def test_tdpcfg_equals_enumeration_of_every_derivation():
    B, N, NT, T, R = 2, 3, 2, 2, 2
    terms, _, roots = grammar(B, N, NT, T)
    U, V, W = factors(B, NT, T, R, seed=1)
    U[0, 1, 0] = float("-inf")
    td = TDPCFG(terms, U, V, W, roots, torch.tensor([3, 2]))
    for b in range(B):
        e = Trees(td, b, terms, roots, lambda a, x, y, r: U[b, a, r] + V[b, x, r] + W[b, y, r], ranks=R)
        assert td.count[b] == torch.isfinite(e.scores).sum()
        assert_close(td.log_partition[b], torch.logsumexp(e.scores, 0))
        assert_close(td.marginals[b], e.marginals)
        assert_close(td.max[b], e.scores.max())
        assert_close(td.log_prob(e.charts.unsqueeze(1).expand(-1, B, -1, -1, -1))[:, b], e.log_probs)
    values, valid = td.enumerate_structures()
    assert_close((td.log_prob(values).exp() * valid).sum(0), torch.ones(B, dtype=torch.float64))


def test_tdpcfg_with_lengths_equals_enumeration_of_each_example_at_its_own_length():
    """A padded batch (lengths 3, 2, 2 in N = 4; TDPCFG takes lengths 2..N): each example's log Z, max and marginals are those
    of the derivations over its own words, enumerated from its inputs; padding carries nothing."""
    B, N, NT, T, R = 3, 4, 2, 2, 2
    terms, _, roots = grammar(B, N, NT, T, forbid=False)
    terms[:, 3:] = 50.0  # padding holds large values: it must carry no mass
    U, V, W = factors(B, NT, T, R, seed=2)
    V[2, 0, 1] = float("-inf")
    lengths = torch.tensor([3, 2, 2])
    td = TDPCFG(terms, U, V, W, roots, lengths)
    for b, n in enumerate(lengths.tolist()):
        alone = TDPCFG(terms[b:b + 1, :n], U[b:b + 1], V[b:b + 1], W[b:b + 1], roots[b:b + 1])  # only for its shape
        e = Trees(alone, 0, terms[b:b + 1, :n], roots[b:b + 1],
                  lambda a, x, y, r: U[b, a, r] + V[b, x, r] + W[b, y, r], ranks=R)
        assert_close(td.log_partition[b], torch.logsumexp(e.scores, 0))
        assert_close(td.max[b], e.scores.max())
        assert_close(td.marginals[b, :n, :n], e.marginals)
        assert (td.marginals[b, n:] == 0).all() and (td.marginals[b, :, n:] == 0).all()


def test_gradcheck_float64():
    terms, rules, roots = grammar(B=2, N=4, forbid=False)
    lengths = torch.tensor([4, 3])
    x = [t.clone().requires_grad_() for t in (terms, rules, roots)]
    assert torch.autograd.gradcheck(lambda *x: PCFG(*x, lengths).log_partition, x)
    assert torch.autograd.gradcheck(lambda t: PCFG(t, rules, roots, lengths).marginals, (x[0],))
    y = [t.clone().requires_grad_() for t in (terms[:, :, :2], *factors(2, 2, 2, 3), roots)]
    assert torch.autograd.gradcheck(lambda *y: TDPCFG(*y, lengths).log_partition, y)


@pytest.mark.parametrize("cls", ["PCFG", "TDPCFG"])
def test_gradgradcheck_float64(cls):
    """Second-order gradients of log Z (the path of the marginals' backward) are right in float64,
    with lengths, w.r.t. every input: PCFG's terms, rules and roots; TDPCFG's terms, factors and roots."""
    terms, rules, roots = grammar(B=2, N=3, NT=2, T=2, forbid=False)
    lengths = torch.tensor([3, 2])
    if cls == "PCFG":
        x = [t.clone().requires_grad_() for t in (terms, rules, roots)]
        assert torch.autograd.gradgradcheck(lambda *x: PCFG(*x, lengths).log_partition, x)
    else:
        y = [t.clone().requires_grad_() for t in (terms, *factors(2, 2, 2, 2), roots)]
        assert torch.autograd.gradgradcheck(lambda *y: TDPCFG(*y, lengths).log_partition, y)


def test_inputs_are_not_modified():
    terms, rules, roots = grammar()
    before = [t.clone() for t in (terms, rules, roots)]
    d = PCFG(terms, rules, roots)
    d.marginals, d.sample((2,)), d.entropy()
    for t, b in zip((terms, rules, roots), before):
        assert torch.equal(t, b)


@pytest.mark.parametrize("change, message", [
    (lambda t, r, o: (t[0], r, o), r"terms: expected shape \[B, N, T\]"),
    (lambda t, r, o: (t, r[..., :-1], o), r"rules: expected shape \[B, NT, NT\+T, NT\+T\]"),
    (lambda t, r, o: (t[..., :-1], r, o), r"rules: expected shape \[B, NT, NT\+T, NT\+T\] = \[2 or 1, 2, 4, 4\]"),
    (lambda t, r, o: (t, r, o[:, :1]), r"roots: expected shape \[B, NT\] = \[2 or 1, 2\]"),
    (lambda t, r, o: (t, r.repeat(2, 1, 1, 1), o), r"rules: .*\[2 or 1"),
    (lambda t, r, o: (t.masked_fill(t > 1, float("nan")), r, o), "terms: contains NaN"),
    (lambda t, r, o: (t, r.masked_fill(r > 1, float("nan")), o), "rules: contains NaN"),
])
def test_bad_input_is_a_value_error_naming_it(change, message):
    terms, rules, roots = grammar(forbid=False)
    with pytest.raises(ValueError, match=message):
        PCFG(*change(terms, rules, roots))


def test_bad_lengths_and_factors_are_value_errors():
    terms, rules, roots = grammar(forbid=False)
    U, V, W = factors(2, 2, 3, 4)
    with pytest.raises(ValueError, match=r"W: expected shape \[B, NT\+T, R\] = \[2 or 1, 5, 4\]"):
        TDPCFG(terms, U, V, W[:, :, :3], roots)


@pytest.mark.parametrize("cls", ["PCFG", "TDPCFG"])
def test_chart_scores_add_to_the_parts_and_minus_inf_forbids_a_bracket(cls):
    """``chart`` adds to the potentials: its -inf at [0, 1, a] for every nonterminal a leaves exactly
    the trees without a bracket over words 0..1, and a score at a tag adds to that tag's ``terms``."""
    B, N, NT, T, R = 1, 3, 2, 2, 2
    terms, rules, roots = grammar(B, N, NT, T, forbid=False)
    U, V, W = factors(B, NT, T, R, seed=3)
    chart = torch.zeros(B, N, N, max(NT, T, R) if cls == "TDPCFG" else max(NT, T), dtype=torch.float64)
    chart[0, 0, 1, :NT] = float("-inf")
    chart[0, 2, 2, 1] = 0.75
    build = (lambda **k: PCFG(terms, rules, roots, **k)) if cls == "PCFG" else (lambda **k: TDPCFG(terms, U, V, W, roots, **k))
    d, plain = build(chart=chart), build()
    if cls == "PCFG":
        e = Trees(plain, 0, terms, roots, lambda a, x, y: rules[0, a, x, y])
    else:
        e = Trees(plain, 0, terms, roots, lambda a, x, y, r: U[0, a, r] + V[0, x, r] + W[0, y, r], ranks=R)
    kept = e.charts[:, 0, 1, :NT].sum(-1) == 0
    scores = e.scores[kept] + 0.75 * e.charts[kept, 2, 2, 1]
    assert_close(d.log_partition[0], torch.logsumexp(scores, 0))
    assert (d.marginals[0, 0, 1, :NT] == 0).all()
    with pytest.raises(ValueError, match=r"chart: expected shape \[B, N, N, K\] = \[1, 3, 3, "):
        build(chart=chart[..., :1])


@pytest.mark.parametrize("cls", ["PCFG", "TDPCFG"])
def test_a_one_word_sentence_is_refused_saying_why(cls):
    """A one-word sentence has no binary tree (the root is a nonterminal, with two children): a length
    of 1, a mask that implies one and terms of one word are value errors that say so, naming the
    argument; a length of 0 or past N gets the plain range."""
    terms, rules, roots = grammar(N=3, forbid=False)
    U, V, W = factors(2, 2, 3, 2)
    build = (lambda t, **k: PCFG(t, rules, roots, **k)) if cls == "PCFG" else (lambda t, **k: TDPCFG(t, U, V, W, roots, **k))
    why = "a one-word sentence has no tree"
    with pytest.raises(ValueError, match=rf"^lengths: .*2\.\.3.*{why}"):
        build(terms, lengths=torch.tensor([3, 1]))
    with pytest.raises(ValueError, match=rf"^mask .*{why}"):
        build(terms, mask=torch.tensor([[True, True, True], [True, False, False]]))
    with pytest.raises(ValueError, match=rf"^terms: expected N >= 2 words, got shape \[2, 1, 3\] .*{why}"):
        build(terms[:, :1])
    with pytest.raises(ValueError, match=r"^lengths: .*2\.\.3") as error:
        build(terms, lengths=torch.tensor([3, 4]))
    assert why not in str(error.value)
