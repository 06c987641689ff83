"""Cycles inside a level are closures: a CFG with unary rules inside spans and an automaton with
epsilon moves, checked against derivations enumerated one by one and against closures written
out here with an explicit matrix inverse (docs/language.md, "Cycles")."""

from __future__ import annotations

import contextlib
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


def inside_by_inverse(word, rule, unary, n):
    """One example's log Z: CKY in probability space, every span's labels closed under the unary
    rules by the explicit inverse (I - exp(unary))^-1 (differentiable: a gradient oracle too)."""
    NT = word.shape[-1]
    star = torch.linalg.inv(torch.eye(NT, dtype=word.dtype) - unary.exp())
    chart = {}
    for s in range(n):
        chart[s, s] = star @ word[s].exp()
    for width in range(1, n):
        for s in range(n - width):
            t = s + width
            x0 = sum(torch.einsum("abc,b,c->a", rule.exp(), chart[s, u], chart[u + 1, t]) for u in range(s, t))
            chart[s, t] = star @ x0
    return chart[0, n - 1][0].log()


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

    def closed(e):
        d = e.clone()
        for k in range(d.shape[-1]):
            d = torch.maximum(d, d[:, k:k + 1] + d[k:k + 1, :])
        return torch.maximum(d, torch.full_like(d, -math.inf).fill_diagonal_(0.0))

    v = times(init, closed(eps[0]))
    for i in range(1, n + 1):
        v = times(times(v, step[i - 1]), closed(eps[i]))
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


# ---------------------------------------------------------------- the docs


def test_the_docs_cycles_section_runs():
    """Every ```python block of docs/language.md's "Cycles" section, in order, and what it prints."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "language.md").read_text()
    section = text.split("\n## Cycles\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 3
    out = io.StringIO()
    scope: dict = {}
    with contextlib.redirect_stdout(out):
        for block in blocks:
            exec(block, scope)
    printed = out.getvalue().splitlines()
    assert printed[:4] == ["X[s, t, a] += X'[s, t, a]", "X[s, t, a] += X'[s, t, b] * unary+[a, b]", "goal[n] += X[0, n-1, 0]", "True"]


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
