"""Cycles inside a level are closures: a CFG with unary rules inside spans, an automaton with
epsilon moves, and systems of several rules, several charts and constant labels, checked against
derivations enumerated one by one and against closures written out here with an explicit matrix
inverse or Floyd-Warshall (docs/language.md, "Cycles")."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import math
import os
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

import semiring as sr
from semiring.language import kernel, triton_levels
from semiring.language.execute import native

UNARY_CFG = """
    X[s, s, a]  = word[s, a]
    X[s, t, a] += X[s, u, b] * X[u+1, t, c] * rule[a, b, c]    for u in s..t-1
    X[s, t, a] += X[s, t, b] * unary[a, b]
    goal        = X[0, n-1, 0]
"""

EPSILON = """
    alpha[0, q]  = init[q]
    alpha[i, q] += alpha[i-1, p] * step[i-1, p, q]
    alpha[i, q] += alpha[i, p] * eps[i, p, q]
    goal        += alpha[n, q] * final[q]
"""


@pytest.fixture(scope="module")
def cfg():
    return sr.program(UNARY_CFG)


def grammar(B=2, N=3, NT=3, unary_shift=-2.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    word = torch.randn(B, N, NT, generator=g, dtype=torch.float64)
    rule = torch.randn(B, NT, NT, NT, generator=g, dtype=torch.float64) - 1
    unary = torch.randn(B, NT, NT, generator=g, dtype=torch.float64) + unary_shift
    return word, rule, unary


# ---------------------------------------------------------------- oracles written out here


class RealOps:
    """The oracles' arithmetic on real weights (probabilities, counts): closures by explicit inverses."""

    zero = 0.0

    @staticmethod
    def star(m):
        return torch.linalg.inv(torch.eye(m.shape[-1], dtype=m.dtype) - m)

    @staticmethod
    def apply(m, x):
        return m @ x

    @staticmethod
    def binary(rule, left, right):
        return torch.einsum("abc,b,c->a", rule, left, right)

    plus = staticmethod(torch.add)


class MaxOps:
    """The oracles' arithmetic in max-plus: closures by Floyd-Warshall."""

    zero = -math.inf

    @staticmethod
    def star(m):
        d = m.clone()
        for k in range(d.shape[-1]):
            d = torch.maximum(d, d[:, k:k + 1] + d[k:k + 1, :])
        return torch.maximum(d, torch.full_like(d, -math.inf).fill_diagonal_(0.0))

    @staticmethod
    def apply(m, x):
        return (m + x).amax(-1)

    @staticmethod
    def binary(rule, left, right):
        return (rule + left[:, None] + right[None, :]).amax((-2, -1))

    plus = staticmethod(torch.maximum)


def cky_closed(base, rule, m, n, ops=RealOps):
    """One example's goal, label 0 of the first chart over words 0..n-1: CKY whose binary rules
    ``rule [NT, NT, NT]`` build the first NT labels, every span's labels of all charts (``base
    [N, L]`` at single words) closed under the block matrix ``m [L, L]`` by ``ops.star``."""
    NT, star = rule.shape[0], ops.star(m)
    chart = {(s, s): ops.apply(star, base[s]) for s in range(n)}
    for width in range(1, n):
        for s in range(n - width):
            t = s + width
            x0 = functools.reduce(ops.plus, (ops.binary(rule, chart[s, u][:NT], chart[u + 1, t][:NT]) for u in range(s, t)))
            z0 = torch.cat([x0, torch.full((m.shape[-1] - NT,), ops.zero, dtype=x0.dtype)])
            chart[s, t] = ops.apply(star, z0)
    return chart[0, n - 1][0]


def inside_by_inverse(word, rule, unary, n):
    """One example's log Z: CKY in probability space, every span's labels closed under the unary
    rules by the explicit inverse (I - exp(unary))^-1 (differentiable: a gradient oracle too)."""
    return cky_closed(word.exp(), rule.exp(), unary.exp(), n).log()


CHAIN = 3  # unary steps per span in the enumeration


def derivations(word, rule, unary, s, t, a, chain=CHAIN):
    """Every derivation of label a over words s..t whose unary chains have at most ``chain`` steps at
    each span: (score, Counter of its parts)."""
    if chain > 0:
        for b in range(unary.shape[-1]):
            w = float(unary[a, b])
            if w > -math.inf:
                for score, parts in derivations(word, rule, unary, s, t, b, chain - 1):
                    yield score + w, parts + Counter({("unary", a, b): 1})
    yield from _bases(word, rule, unary, s, t, a)


def _bases(word, rule, unary, s, t, a):
    """Derivations of X[s, t, a] that start with no unary step (their children's chains have the full budget)."""
    if s == t:
        yield float(word[s, a]), Counter({("word", s, a): 1})
        return
    NT = word.shape[-1]
    for u in range(s, t):
        for b in range(NT):
            for c in range(NT):
                for ls, lp in derivations(word, rule, unary, s, u, b):
                    for rs, rp in derivations(word, rule, unary, u + 1, t, c):
                        yield float(rule[a, b, c]) + ls + rs, lp + rp + Counter({("rule", a, b, c): 1})


def enumerate_goal(word, rule, unary, n):
    return list(derivations(word, rule, unary, 0, n - 1, 0))


def one_hot(parts: Counter, word, rule, unary):
    out = [torch.zeros_like(word), torch.zeros_like(rule), torch.zeros_like(unary)]
    for key, k in parts.items():
        which = {"word": 0, "rule": 1, "unary": 2}[key[0]]
        out[which][key[1:]] += k
    return out


# ---------------------------------------------------------------- the CFG with unary rules


def test_the_unary_rule_is_rewritten_through_the_open_chart(cfg):
    assert [str(r) for r in cfg.rules if r.head.name in ("X", "X'")][-2:] == [
        "X[s, t, a] += X'[s, t, a]", "X[s, t, a] += X'[s, t, b] * unary+[a, b]"]
    assert cfg.inputs == ["word", "rule", "unary"]


def test_log_partition_equals_the_explicit_inverse_at_each_length(cfg):
    word, rule, unary = grammar(B=3, N=3, NT=3)
    lengths = [3, 1, 2]
    got = cfg(sr.Log, lengths=torch.tensor(lengths), word=word, rule=rule, unary=unary)
    want = torch.stack([inside_by_inverse(word[b], rule[b], unary[b], n) for b, n in enumerate(lengths)])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_real_equals_the_explicit_inverse(cfg):
    word, rule, unary = grammar(B=2, N=3, NT=3)
    got = cfg(sr.Real, word=word, rule=rule, unary=unary)
    want = torch.stack([inside_by_inverse(word[b], rule[b], unary[b], 3) for b in range(2)]).exp()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_log_partition_is_the_limit_of_derivations_with_bounded_chains(cfg):
    word, rule, unary = grammar(B=1, N=2, NT=2, unary_shift=-5)  # contracting: chains past 3 steps weigh < 1e-6
    scores = torch.tensor([s for s, _ in enumerate_goal(word[0], rule[0], unary[0], 2)], dtype=torch.float64)
    got = cfg(sr.Log, word=word, rule=rule, unary=unary)[0]
    assert got >= torch.logsumexp(scores, 0)  # the enumeration is a part of the sum
    torch.testing.assert_close(got, torch.logsumexp(scores, 0), rtol=1e-6, atol=1e-6)


def test_marginals_equal_the_gradient_of_the_explicit_inverse(cfg):
    word, rule, unary = grammar(B=2, N=3, NT=3)
    xs = [x.clone().requires_grad_() for x in (word, rule, unary)]
    got = torch.autograd.grad(cfg(sr.Log, word=xs[0], rule=xs[1], unary=xs[2]).sum(), xs)
    ys = [x.clone().requires_grad_() for x in (word, rule, unary)]
    want = torch.autograd.grad(sum(inside_by_inverse(ys[0][b], ys[1][b], ys[2][b], 3) for b in range(2)), ys)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


def test_a_grammar_shared_by_the_batch_equals_one_per_example(cfg):
    word, rule, unary = grammar(B=3, N=3, NT=3)
    rule, unary = rule[:1].clone().requires_grad_(), unary[:1].clone().requires_grad_()
    shared = cfg(sr.Log, word=word, rule=rule, unary=unary)
    (g,) = torch.autograd.grad(shared.sum(), unary)
    want = torch.stack([inside_by_inverse(word[b], rule[0], unary[0], 3) for b in range(3)])
    (h,) = torch.autograd.grad(want.sum(), unary)
    torch.testing.assert_close(shared, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, h, rtol=1e-10, atol=1e-10)


def test_gradcheck_and_gradgradcheck_in_float64(cfg):
    word, rule, unary = (x.requires_grad_() for x in grammar(B=1, N=2, NT=2))
    f = lambda w, r, u: cfg(sr.Log, word=w, rule=r, unary=u)  # noqa: E731
    assert torch.autograd.gradcheck(f, (word, rule, unary))
    assert torch.autograd.gradgradcheck(f, (word, rule, unary))


def test_max_value_and_decode_are_the_best_enumerated_derivation(cfg):
    word, rule, unary = grammar(B=1, N=2, NT=2, unary_shift=0.0, seed=3)
    unary = unary.clamp(max=-0.1)  # every cycle negative: best chains have at most NT-1 steps
    score, parts = max(enumerate_goal(word[0], rule[0], unary[0], 2), key=lambda d: d[0])
    assert any(k[0] == "unary" for k in parts)  # the best derivation takes a unary rule
    xs = [x.clone().requires_grad_() for x in (word, rule, unary)]
    best = cfg(sr.Max, word=xs[0], rule=xs[1], unary=xs[2])
    assert best.item() == pytest.approx(score, abs=1e-12)
    for g, w in zip(torch.autograd.grad(best.sum(), xs), one_hot(parts, word[0], rule[0], unary[0])):
        assert torch.equal(g[0], w)


def test_count_is_the_number_of_derivations_where_the_unary_rules_have_no_cycle(cfg):
    word, rule, unary = grammar(B=1, N=2, NT=3)
    unary = torch.full_like(unary, -math.inf)
    unary[0, 0, 1] = unary[0, 1, 2] = unary[0, 0, 2] = 0.0  # 2 -> 1 -> 0 and 2 -> 0: no cycle
    count = cfg(sr.Count, word=word, rule=rule, unary=unary)
    assert count.item() == len(enumerate_goal(word[0], rule[0], unary[0], 2))


def test_labels_the_unary_rules_do_not_reach_keep_their_items(cfg):
    word, rule, unary = grammar(B=2, N=3, NT=4)
    small = unary[:, :2, :2]  # unary rules among labels 0 and 1 only
    padded = torch.full_like(unary, -math.inf)
    padded[:, :2, :2] = small
    got = cfg(sr.Log, word=word, rule=rule, unary=small)
    want = torch.stack([inside_by_inverse(word[b], rule[b], padded[b], 3) for b in range(2)])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_the_kernel_and_the_torch_calls_agree(cfg):
    word, rule, unary = grammar(B=2, N=4, NT=3)
    for semiring in (sr.Log, sr.Max):
        xs = [x.clone().requires_grad_() for x in (word, rule, unary)]
        value = cfg(semiring, word=xs[0], rule=xs[1], unary=xs[2])
        grads = torch.autograd.grad(value.sum(), xs)
        with kernel.disabled():
            ys = [x.clone().requires_grad_() for x in (word, rule, unary)]
            value2 = cfg(semiring, word=ys[0], rule=ys[1], unary=ys[2])
            grads2 = torch.autograd.grad(value2.sum(), ys)
        torch.testing.assert_close(value, value2, rtol=1e-12, atol=1e-12)
        for g, h in zip(grads, grads2):
            torch.testing.assert_close(g, h, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype, weight", [(torch.float32, -200.0), (torch.float64, -800.0)])
def test_weights_too_light_for_probabilities_keep_their_derivations(cfg, dtype, weight):
    word, rule, unary = grammar(B=1, N=1, NT=2)
    unary = torch.full_like(unary, -math.inf)
    unary[0, 0, 1] = weight  # exp(weight) is 0 in this dtype
    word[0, 0] = torch.tensor([-math.inf, 0.0])  # label 0 only through the unary rule
    got = cfg(sr.Log, word=word.to(dtype), rule=rule.to(dtype), unary=unary.to(dtype))
    assert got.item() == pytest.approx(weight)


# ---------------------------------------------------------------- refused: divergent, positive cycles, no closure


def test_a_divergent_sum_is_refused_naming_the_rule(cfg):
    word, rule, unary = grammar(B=2, N=2, NT=2)
    unary[1] = 0.0  # exp(0) = 1 everywhere: spectral radius 2
    with pytest.raises(ValueError, match=r"line 4, column 19: X\[s, t, a\] reads X\[s, t, b\] at the same level: a cycle; "
                                         r"see Cycles\. The sum over derivations of any length diverges: the spectral "
                                         r"radius of exp\(unary\) over the labels is 2 >= 1 \(example 1\)"):
        cfg(sr.Log, word=word, rule=rule, unary=unary)
    with pytest.raises(ValueError, match="spectral radius of unary over the labels is"):
        cfg(sr.Real, word=word, rule=rule, unary=unary)


def test_a_positive_cycle_in_max_is_refused_naming_it(cfg):
    word, rule, unary = grammar(B=1, N=2, NT=3)
    unary[:] = -math.inf
    unary[0, 1, 2], unary[0, 2, 1] = 1.0, -0.5  # 2 derives 1 (+1), 1 derives 2 (-0.5): the cycle gains 0.5
    with pytest.raises(ValueError, match=r"line 4.*: a cycle; see Cycles\. The labels (1 -> 2 -> 1|2 -> 1 -> 2) form a cycle whose weights sum to "
                                         r"more than 0 in Max"):
        cfg(sr.Max, word=word, rule=rule, unary=unary)
    unary[0, 2, 1] = -1.5  # now the cycle loses 0.5: allowed
    assert torch.isfinite(cfg(sr.Max, word=word, rule=rule, unary=unary)).all()
    unary[:] = -math.inf
    unary[0, 1, 2], unary[0, 2, 0], unary[0, 0, 1] = 0.1, 0.2, -0.3  # 0 -> 2 -> 1 -> 0 weighs 0, but for rounding: allowed
    assert torch.isfinite(cfg(sr.Max, word=word, rule=rule, unary=unary)).all()


def test_count_with_a_cycle_is_refused_naming_it(cfg):
    word, rule, unary = grammar(B=1, N=2, NT=3)
    unary[:] = -math.inf
    unary[0, 0, 1] = unary[0, 1, 0] = -3.0
    with pytest.raises(ValueError, match=r"The labels (0 -> 1 -> 0|1 -> 0 -> 1) form a cycle of finite weights, so the "
                                         r"count of derivations is infinite"):
        cfg(sr.Count, word=word, rule=rule, unary=unary)


@pytest.mark.parametrize("semiring", [sr.Sampled, sr.KMax(2), sr.SignedLog], ids=str)
def test_semirings_without_a_closure_refuse(cfg, semiring):
    word, rule, unary = grammar(B=1, N=2, NT=2)
    with pytest.raises(ValueError, match=r"a cycle; see Cycles. The " + re.escape(semiring.name) + " semiring has no closure"):
        cfg(semiring, word=word, rule=rule, unary=unary)


def test_weights_that_are_not_square_are_refused(cfg):
    word, rule, unary = grammar(B=1, N=2, NT=3)
    with pytest.raises(ValueError, match="need as many entries in dimension 1 as in dimension 2"):
        cfg(sr.Log, word=word, rule=rule, unary=unary[:, :, :2])


@pytest.mark.parametrize("line, column, phrase", [
    ("X[s, t, a] += X[s, t, b] * unary[a, b] * span[s, t]", 19, "one read of its own chart, times one input"),
    ("X[s, t, a] += X[s, t, b] * unary[a, b] if a != b", 19, "without 'for' or 'if'"),
])
def test_a_cycle_the_compiler_does_not_solve_names_the_rule(line, column, phrase):
    text = UNARY_CFG.replace("X[s, t, a] += X[s, t, b] * unary[a, b]", line)
    with pytest.raises(sr.ProgramError, match=rf"line 4, column {column}: X\[s, t, a\] reads X\[s, t, b\] at the same "
                                              rf"level: a cycle; see Cycles\. (.|\n)*{phrase}"):
        sr.program(text)


# ---------------------------------------------------------------- epsilon moves


def automaton_by_matrices(init, step, eps, final, n):
    """One example: the sum over paths reading n symbols, epsilon moves closed by explicit inverses."""
    Q = init.shape[-1]
    close = [torch.linalg.inv(torch.eye(Q, dtype=init.dtype) - eps[i].exp()) for i in range(eps.shape[0])]
    v = init.exp() @ close[0]  # a row vector; close[i][p, q]: from p to q by moves at position i
    for i in range(1, n + 1):
        v = (v @ step[i - 1].exp()) @ close[i]
    return (v @ final.exp()).log()


def automaton_best_by_floyd_warshall(init, step, eps, final, n):
    """One example's best path, its epsilon moves closed by Floyd-Warshall in max-plus."""
    def times(v, m):
        return (v.unsqueeze(-1) + m).amax(-2)

    v = times(init, MaxOps.star(eps[0]))
    for i in range(1, n + 1):
        v = times(times(v, step[i - 1]), MaxOps.star(eps[i]))
    return (v + final).max()


def test_epsilon_moves_equal_the_explicit_closure():
    prog = sr.program(EPSILON)
    g = torch.Generator().manual_seed(1)
    B, N, Q = 3, 4, 3
    init = torch.randn(B, Q, generator=g, dtype=torch.float64)
    step = torch.randn(B, N, Q, Q, generator=g, dtype=torch.float64)
    eps = torch.randn(B, N + 1, Q, Q, generator=g, dtype=torch.float64) - 2.5
    final = torch.randn(B, Q, generator=g, dtype=torch.float64)
    lengths = torch.tensor([4, 2, 0])
    got = prog(sr.Log, lengths=lengths, init=init, step=step, eps=eps, final=final)
    want = torch.stack([automaton_by_matrices(init[b], step[b], eps[b], final[b], int(lengths[b])) for b in range(B)])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    best = prog(sr.Max, lengths=lengths, init=init, step=step, eps=eps, final=final)
    want = torch.stack([automaton_best_by_floyd_warshall(init[b], step[b], eps[b], final[b], int(lengths[b])) for b in range(B)])
    torch.testing.assert_close(best, want, rtol=1e-12, atol=1e-12)
    eps[2, 0] = 0.0  # example 2's moves at position 0 diverge
    with pytest.raises(ValueError, match=r"line 4, column 20: alpha\[i, q\] reads alpha\[i, p\] .* \(example 2 at the "
                                         r"other indices \(0,\) of 'eps'\)"):
        prog(sr.Log, lengths=lengths, init=init, step=step, eps=eps, final=final)


# ---------------------------------------------------------------- systems: several rules, several charts, constant labels

TWO_UNARY = UNARY_CFG.replace("X[s, t, a] += X[s, t, b] * unary[a, b]",
                              "X[s, t, a] += X[s, t, b] * u1[a, b]\n    X[s, t, a] += X[s, t, b] * u2[a, b]")

TWO_CHARTS = """
    X[s, s, a]  = word[s, a]
    Y[s, s, a]  = tag[s, a]
    X[s, t, a] += X[s, u, b] * X[u+1, t, c] * rule[a, b, c]    for u in s..t-1
    X[s, t, a] += Y[s, t, b] * up[a, b]
    Y[s, t, a] += X[s, t, b] * down[a, b]
    goal        = X[0, n-1, 0]
"""

ROOT_CFG = """
    X[s, s, a]  = word[s, a]
    X[s, t, a] += X[s, u, b] * X[u+1, t, c] * rule[a, b, c]    for u in s..t-1
    X[s, t, 0] += X[s, t, b] * close[b]                        # any label closes into the root, 0
    X[s, t, a] += X[s, t, 0] * open[a]                         # which opens into any label
    goal        = X[0, n-1, 0]
"""

TWO_LABELS = """
    C[i, R]  = x[i, R]
    C[i, L]  = x[i, L]
    C[i, R] += C[i, L] * w[i]
    C[i, L] += C[i, R] * v[i]
    goal     = C[n-1, R]
"""

# per semiring: the oracle's arithmetic, its weights from log-potentials, the program's value from the oracle's
SEMIRINGS = {
    "Log": (sr.Log, RealOps, torch.exp, torch.log),
    "Real": (sr.Real, RealOps, torch.exp, lambda x: x),
    "Max": (sr.Max, MaxOps, lambda x: x, lambda x: x),
    "Count": (sr.Count, RealOps, lambda x: torch.isfinite(x).double(), lambda x: x),
}


def random(*shape, shift=0.0, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + shift


def agrees(prog, oracle, inputs, lengths, names=SEMIRINGS):
    """The program equals ``oracle(weights of one example, n, ops)`` in each semiring of ``names``."""
    for name in names:
        semiring, ops, weights, value = SEMIRINGS[name]
        got = prog(semiring, lengths=torch.tensor(lengths), **inputs)
        want = torch.stack([value(oracle({k: weights(x[b % x.shape[0]]) for k, x in inputs.items()}, n, ops))
                            for b, n in enumerate(lengths)])
        torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-12, atol=1e-12, msg=name)


def two_unary_oracle(x, n, ops):
    return cky_closed(x["word"], x["rule"], ops.plus(x["u1"], x["u2"]), n, ops)


def two_charts_oracle(x, n, ops):
    NT, K = x["up"].shape
    m = torch.full((NT + K, NT + K), ops.zero, dtype=torch.float64)
    m[:NT, NT:], m[NT:, :NT] = x["up"], x["down"]  # X from Y, Y from X
    return cky_closed(torch.cat([x["word"], x["tag"]], -1), x["rule"], m, n, ops)


def root_oracle(x, n, ops):
    NT = x["word"].shape[-1]
    first = torch.full((NT, NT), ops.zero, dtype=torch.float64)
    column = first.clone()
    first[0], column[:, 0] = x["close"], x["open"]
    return cky_closed(x["word"], x["rule"], ops.plus(first, column), n, ops)


def two_labels_oracle(x, n, ops):
    z = torch.tensor(ops.zero, dtype=torch.float64)
    m = torch.stack([torch.stack([z, x["w"][n - 1]]), torch.stack([x["v"][n - 1], z])])
    return ops.apply(ops.star(m), x["x"][n - 1])[0]


def test_two_cycle_rules_on_one_chart_are_one_closure():
    prog = sr.program(TWO_UNARY)
    assert [str(r) for r in prog.rules if r.head.name == "X"] == [
        "X[s, t, a] += X'[s, t, a]", "X[s, t, a] += X'[s, t, b] * X+X[a, b]"]
    word, rule, _ = grammar(B=2, N=3, NT=3)
    u1, u2 = random(2, 3, 3, shift=-3, seed=1), random(1, 3, 3, shift=-3, seed=2)
    agrees(prog, two_unary_oracle, dict(word=word, rule=rule, u1=u1, u2=u2), [3, 2], ["Log", "Real", "Max"])
    u1, u2 = torch.full_like(u1, -math.inf), torch.full_like(u2, -math.inf)
    u1[:, 0, 1] = u2[:, 0, 1] = u2[:, 1, 2] = 0.0  # 2 -> 1 -> 0, two ways from 1 to 0: no cycle
    agrees(prog, two_unary_oracle, dict(word=word, rule=rule, u1=u1, u2=u2), [3, 2], ["Count"])


def test_two_charts_that_derive_each_other_are_one_block_closure():
    prog = sr.program(TWO_CHARTS)
    assert [str(r) for r in prog.rules if r.head.name in ("X", "Y")] == [
        "X[s, t, a] += X'[s, t, a]", "X[s, t, a] += X'[s, t, b] * X+X[a, b]", "X[s, t, a] += Y'[s, t, b] * X+Y[a, b]",
        "Y[s, t, a] += Y'[s, t, a]", "Y[s, t, a] += X'[s, t, b] * Y+X[a, b]", "Y[s, t, a] += Y'[s, t, b] * Y+Y[a, b]"]
    word, rule, _ = grammar(B=2, N=3, NT=3)
    inputs = dict(word=word, rule=rule, tag=random(2, 3, 2, seed=1), up=random(2, 3, 2, shift=-2, seed=2),
                  down=random(1, 2, 3, shift=-2, seed=3))
    agrees(prog, two_charts_oracle, inputs, [3, 1], ["Log", "Real", "Max"])
    inputs["down"] = torch.full_like(inputs["down"], -math.inf)  # Y from X never: no cycle
    agrees(prog, two_charts_oracle, inputs, [3, 1], ["Count"])


def test_a_read_of_the_same_label_of_another_chart_is_a_diagonal_block():
    prog = sr.program(TWO_CHARTS.replace("Y[s, t, a] += X[s, t, b] * down[a, b]", "Y[s, t, a] += X[s, t, a] * down[a]"))
    word, rule, _ = grammar(B=2, N=3, NT=3)
    inputs = dict(word=word, rule=rule, tag=random(2, 3, 3, seed=1), up=random(2, 3, 3, shift=-2, seed=2),
                  down=random(2, 3, shift=-2, seed=3))

    def oracle(x, n, ops):
        diagonal = torch.full((3, 3), ops.zero, dtype=torch.float64).diagonal_scatter(x["down"])
        return two_charts_oracle({**x, "down": diagonal}, n, ops)

    agrees(prog, oracle, inputs, [3, 2], ["Log", "Real", "Max"])


def test_two_charts_marginals_decodes_and_gradcheck():
    """Log: marginals, the gradient of the explicit inverse; Max: the best derivation's parts, the
    gradient of Floyd-Warshall's best path."""
    prog = sr.program(TWO_CHARTS)
    word, rule, _ = grammar(B=2, N=3, NT=3)
    up, down = random(2, 3, 2, shift=-3, seed=2), random(2, 2, 3, shift=-3, seed=3)
    up[:, 0, 1], down[:, 1, 2] = 0.0, 0.5  # X 2 -> Y 1 -> X 0 gains: the best derivations go from X to Y and back
    xs = [x.requires_grad_() for x in (word, rule, random(2, 3, 2, seed=1), up, down)]
    names = ["word", "rule", "tag", "up", "down"]
    for semiring, ops, weights, value in (SEMIRINGS["Log"], SEMIRINGS["Max"]):
        got = torch.autograd.grad(prog(semiring, **dict(zip(names, xs))).sum(), xs)
        want = torch.autograd.grad(sum(value(two_charts_oracle({k: weights(x[b]) for k, x in zip(names, xs)}, 3, ops))
                                       for b in range(2)), xs)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
    assert got[3].sum() > 0 and got[4].sum() > 0
    small = [(x[:1, :2, :2, :2] if x.dim() == 4 else x[:1, :2, :2]).detach().clone().requires_grad_() for x in xs]
    assert torch.autograd.gradcheck(lambda *ys: prog(sr.Log, **dict(zip(names, ys))), small)


def test_a_constant_label_in_a_cycle():
    prog = sr.program(ROOT_CFG)
    word, rule, _ = grammar(B=2, N=3, NT=3)
    inputs = dict(word=word, rule=rule, close=random(2, 3, shift=-2, seed=1), open=random(2, 3, shift=-2, seed=2))
    agrees(prog, root_oracle, inputs, [3, 2], ["Log", "Real", "Max"])
    inputs["open"] = torch.full_like(inputs["open"], -math.inf)
    inputs["close"][:, 0] = -math.inf  # into the root from the other labels only: no cycle
    agrees(prog, root_oracle, inputs, [3, 2], ["Count"])
    with pytest.raises(ValueError, match=r"line 4, .*Its constant label \(entry 5\) of 'X' is beyond the 3 labels its weights give"):
        sr.program(ROOT_CFG.replace("X[s, t, 0] +=", "X[s, t, 5] +="))(sr.Log, **inputs)


def test_constant_labels_at_both_ends_of_a_cycle():
    prog = sr.program(TWO_LABELS)
    assert [str(r) for r in prog.rules if r.head.name == "C"][-1] == "C[i, a] += C'[i, b] * C+C[i, a, b]"
    inputs = dict(x=random(3, 4, 2, seed=1), w=random(3, 4, shift=-1, seed=2), v=random(1, 4, shift=-1, seed=3))
    agrees(prog, two_labels_oracle, inputs, [4, 1, 2], ["Log", "Real", "Max"])
    inputs["v"] = torch.full_like(inputs["v"], -math.inf)
    agrees(prog, two_labels_oracle, inputs, [4, 1, 2], ["Count"])
    inputs["v"][0, 1] = 0.0
    with pytest.raises(ValueError, match=r"line 4, column 16: C\[i, R\] reads C\[i, L\] at the same level: a cycle with "
                                         r"the rule of line 5; see Cycles\. The labels (0 -> 1 -> 0|1 -> 0 -> 1) form a "
                                         r"cycle of finite weights, .* \(example 0 at the other indices \(1,\) of the weights\)"):
        prog(sr.Count, lengths=torch.tensor([4, 1, 2]), **inputs)


STUTTER = """
    x[0]  = a[0]
    x[i] += x[i-1] * a[i]
    y[i]  = b[i]
    x[i] += y[i] * u[i]        # y to x at one position,
    y[i] += x[i] * v[i]        # x to y,
    x[i] += x[i] * stay[i]     # and x to itself: a cycle that changes no label, only the chart
    goal  = x[n-1]
"""


def stutter_oracle(x, n, ops):
    """One example's x[n-1]: at each position the vector (x, y) of the other rules closed under the
    2 x 2 matrix of the cycle's weights by ``ops.star``."""
    z = torch.tensor(ops.zero, dtype=torch.float64)
    last = None
    for i in range(n):
        star = ops.star(torch.stack([torch.stack([x["stay"][i], x["u"][i]]), torch.stack([x["v"][i], z])]))
        first = x["a"][0] if i == 0 else ops.apply(x["a"][i].view(1, 1), last.view(1))[0]
        last = ops.apply(star, torch.stack([first, x["b"][i]]))[0]
    return last


def stutter_inputs():
    return dict(a=random(3, 4, seed=1), b=random(3, 4, seed=2), u=random(3, 4, shift=-1.5, seed=3),
                v=random(1, 4, shift=-1.5, seed=4), stay=random(3, 4, shift=-2, seed=5))


def test_a_cycle_that_changes_no_label_is_a_closure_over_its_charts():
    prog = sr.program(STUTTER)
    assert [str(r) for r in prog.rules if r.head.name == "x"] == [
        "x[i] += x'[i]", "x[i] += x'[i] * x+x[i]", "x[i] += y'[i] * x+y[i]"]
    inputs = stutter_inputs()
    agrees(prog, stutter_oracle, inputs, [4, 1, 2], ["Log", "Real", "Max"])
    inputs["v"], inputs["stay"] = torch.full_like(inputs["v"], -math.inf), torch.full_like(inputs["stay"], -math.inf)
    agrees(prog, stutter_oracle, inputs, [4, 1, 2], ["Count"])  # y to x only: no cycle


def test_a_cycle_that_changes_no_label_has_gradients_of_the_explicit_inverse():
    prog = sr.program(STUTTER)
    names, xs = list(stutter_inputs()), [x.requires_grad_() for x in stutter_inputs().values()]
    for semiring, ops, weights, value in (SEMIRINGS["Log"], SEMIRINGS["Max"]):
        got = torch.autograd.grad(prog(semiring, **dict(zip(names, xs))).sum(), xs)
        want = torch.autograd.grad(sum(value(stutter_oracle({k: weights(x[b % x.shape[0]]) for k, x in zip(names, xs)}, 4, ops))
                                       for b in range(3)), xs)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
    small = [x[:2, :3].detach().clone().requires_grad_() for x in xs]
    assert torch.autograd.gradcheck(lambda *ys: prog(sr.Log, **dict(zip(names, ys))), small)
    assert torch.autograd.gradgradcheck(lambda *ys: prog(sr.Log, **dict(zip(names, ys))), small)


def test_a_cycle_that_changes_no_label_is_refused_where_it_diverges_or_gains():
    prog = sr.program(STUTTER)
    inputs = stutter_inputs()
    inputs["stay"][1, 2] = 0.25
    with pytest.raises(ValueError, match=r"line 5, column 13: x\[i\] reads y\[i\] at the same level: a cycle with the rules "
                                         r"of lines 6, 7; see Cycles\. The sum over derivations of any length diverges: the "
                                         r"spectral radius of the block matrix of exp\(u\), exp\(v\), exp\(stay\) over the "
                                         r"charts 'x', 'y' is [\d.]+ >= 1 \(example 1 at the other indices \(2,\) of the weights\)"):
        prog(sr.Log, **inputs)
    with pytest.raises(ValueError, match=r"The charts x -> x form a cycle whose weights sum to more than 0 in Max"):
        prog(sr.Max, **inputs)
    alone = sr.program("x[i] = a[i]\nx[i] += x[i] * stay[i]\ngoal += x[n-1]")
    with pytest.raises(ValueError, match=r"line 2, column 9: x\[i\] reads x\[i\] at the same level: a cycle; see Cycles\. The "
                                         r"sum over derivations of any length diverges: the weight exp\(stay\) of the cycle is 1 >= 1"):
        alone(sr.Log, a=torch.zeros(1, 3), stay=torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"The charts x -> x form a cycle of finite weights, so the count of derivations is infinite"):
        alone(sr.Count, a=torch.zeros(1, 3), stay=torch.zeros(1, 3))


def test_a_system_that_diverges_or_has_a_positive_cycle_is_refused_naming_its_rules():
    prog = sr.program(TWO_CHARTS)
    word, rule, _ = grammar(B=1, N=2, NT=3)
    inputs = dict(word=word, rule=rule, tag=random(1, 2, 2, seed=1), up=torch.zeros(1, 3, 2, dtype=torch.float64),
                  down=torch.zeros(1, 2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"line 5, column 19: X\[s, t, a\] reads Y\[s, t, b\] at the same level: a cycle "
                                         r"with the rule of line 6; see Cycles\. The sum over derivations of any length "
                                         r"diverges: the spectral radius of the block matrix of exp\(up\), exp\(down\) over "
                                         r"the labels of 'X', 'Y' is"):
        prog(sr.Log, **inputs)
    inputs["up"], inputs["down"] = torch.full_like(inputs["up"], -math.inf), torch.full_like(inputs["down"], -math.inf)
    inputs["up"][0, 1, 0], inputs["down"][0, 0, 1] = 1.0, -0.5
    with pytest.raises(ValueError, match=r"The labels (X 1 -> Y 0 -> X 1|Y 0 -> X 1 -> Y 0) form a cycle whose weights sum "
                                         r"to more than 0 in Max"):
        prog(sr.Max, **inputs)


@pytest.mark.parametrize("text, where, phrase", [
    (TWO_CHARTS.replace("X[s, t, b] * down[a, b]", "X[s, t, b] * down[a, b] * span[s, t]"), "line 6, column 19",
     r"Y\[s, t, a\] reads X\[s, t, b\] at the same level: a cycle; see Cycles\. Its weights must be one input, not "
     r"down\[a, b\] \* span\[s, t\]"),
    (TWO_UNARY.replace("u2[a, b]", "u2[s, a, b]"), "line 4, column 19",
     r"a cycle with the rule of line 5; see Cycles\. The weights of a cycle's rules must have the same indices besides "
     r"the labels: 'u1\[a, b\]', 'u2\[s, a, b\]'"),
    (UNARY_CFG.replace("unary[a, b]", "unary[a, b, c]"), "line 4, column 19",
     r"Its weights 'unary\[a, b, c\]' may be indexed, besides the labels, only by the head's variables"),
    (UNARY_CFG.replace("X[s, t, a] += X[s, t, b]", "X[s, s+1, a] += X[s, s+1, b]"), "line 4, column 21",
     r"Its head's indices other than the label \(index 3\) must be distinct variables"),
    (TWO_CHARTS.replace("Y[s, t, b] * up[a, b]", "Y[s, b, a] * up[t, b]"), "line 5",
     r"make a cycle that changes indices 2 and 3: a closure changes one index, the label"),
])
def test_a_system_the_compiler_does_not_solve_names_its_rules(text, where, phrase):
    with pytest.raises(sr.ProgramError, match=rf"{where}(.|\n)*{phrase}"):
        sr.program(text)


# ---------------------------------------------------------------- the docs


def test_the_docs_cycles_section_runs():
    """Every ```python block of docs/language.md's "Cycles" section, in order, and what it prints."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "language.md").read_text()
    section = text.split("\n## Cycles\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 5
    out = io.StringIO()
    scope: dict = {}
    with contextlib.redirect_stdout(out):
        for block in blocks:
            exec(block, scope)
    printed = out.getvalue().splitlines()
    assert printed[:4] == ["X[s, t, a] += X'[s, t, a]", "X[s, t, a] += X'[s, t, b] * unary+[a, b]", "goal[n] += X[0, n-1, 0]", "True"]
    assert printed[-1] == "True"


@pytest.mark.triton
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the interpreter's numpy: log(0))
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1", reason="no CUDA and no interpreter")
def test_the_triton_kernels_and_the_torch_calls_agree(cfg):
    """On a GPU, or in Triton's interpreter on CPU tensors."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    inputs = [x.to(device) for x in grammar(B=2, N=3, NT=2)]
    for semiring in (sr.Log, sr.Max):
        results = []
        for context in (triton_levels.interpreted() if device.type == "cpu" else contextlib.nullcontext(),
                        triton_levels.disabled()):
            with context, kernel.disabled():
                xs = [x.clone().requires_grad_() for x in inputs]
                assert (native(semiring, xs) is triton_levels) == (not results)  # the first run takes the kernels
                value = cfg(semiring, word=xs[0], rule=xs[1], unary=xs[2])
                results.append((value, *torch.autograd.grad(value.sum(), xs)))
        for got, want in zip(*results):
            torch.testing.assert_close(got, want)
