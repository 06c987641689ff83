"""A tour of the library: ``python -m structures.tour``.

Part 1 declares a structure the library does not ship -- binary bracketings of a sentence
(CKY without a grammar: every span has a score, a tree's score is the sum of its spans) -- as three
rules, and runs that one program in every built-in semiring. Part 2 wraps it as a distribution.
Part 3 shows the shipped structures. Everything here uses only the public API and takes seconds.
"""

from __future__ import annotations

import argparse
import math

import torch

import semiring as sr
from structures import HopChainCRF, LinearChainCRF, SemiMarkovCRF, StructuredDistribution
from structures.projective import ProjectiveDependencyCRF

# S[s, t] is the sum over binary trees whose leaves are the words s..t (inclusive).
BRACKETS = sr.program("""
    S[s, s]  = span[s, s]                                          # one word is a tree
    S[s, t] += S[s, u] * S[u+1, t] * span[s, t]    for u in s..t-1  # split s..t after word u
    goal     = S[0, n-1]                                           # the whole sentence of n words
""")

SENTENCES = ["the dog saw a man with binoculars".split(), "time flies fast".split()]


def heading(title: str) -> None:
    print(f"\n{'=' * 78}\n{title}\n{'=' * 78}")


def show(label: str, value, note: str = "") -> None:
    print(f"  {label:<34} {value}{('   ' + note) if note else ''}")


def fmt(t: torch.Tensor, digits: int = 3) -> str:
    return "[" + ", ".join(f"{v:.{digits}f}" for v in t.tolist()) + "]"


def catalan(m: int) -> int:
    return math.comb(2 * m, m) // (m + 1)


def tree(spans: torch.Tensor, words: list[str]) -> str:
    """Bracket string of a binary tree given as one-hot spans ``[N, N]`` over ``words``."""

    def build(s: int, t: int) -> str:
        if s == t:
            return words[s]
        for u in range(s, t):
            if spans[s, u] > 0.5 and spans[u + 1, t] > 0.5:
                return f"({build(s, u)} {build(u + 1, t)})"
        return "?"

    return build(0, len(words) - 1)


def part1() -> None:
    heading("1. A structure declared in the rule language: binary bracketings (CKY)")
    print(BRACKETS.text.strip("\n"))
    print("\n  span[b, s, t] scores the constituent covering words s..t. The compiler finds the")
    print("  wavefront (the span width), factors span[s, t] out of the sum over u, and runs each")
    print("  rule as one batched reduction per width. The same program runs in every semiring.")

    torch.manual_seed(0)
    B, N = len(SENTENCES), max(map(len, SENTENCES))
    lengths = torch.tensor([len(w) for w in SENTENCES])
    span = torch.randn(B, N, N)
    print(f"\n  batch of {B} sentences padded to N = {N}: span scores [B, N, N] = {list(span.shape)},"
          f" lengths = {lengths.tolist()}")
    print("  (random scores, so the trees below mean nothing linguistically)")

    print("\n-- Log (logsumexp, +): the log-partition; its gradient is the span marginals")
    x = span.clone().requires_grad_()
    log_z = BRACKETS(sr.Log, lengths=lengths, span=x)
    (mu,) = torch.autograd.grad(log_z.sum(), x)
    show("log Z", fmt(log_z))
    show("sum of span marginals", fmt(mu.sum((1, 2)), 2), "= 2n-1 (every tree has 2n-1 spans)")
    show("p(whole sentence is a span)", fmt(torch.stack([mu[b, 0, n - 1] for b, n in enumerate(lengths.tolist())]), 2))

    print("\n-- Max (max, +): the best score; its gradient is the best tree (one-hot spans)")
    x = span.clone().requires_grad_()
    best = BRACKETS(sr.Max, lengths=lengths, span=x)
    (arg,) = torch.autograd.grad(best.sum(), x)
    show("best score", fmt(best))
    for b, words in enumerate(SENTENCES):
        show(f"best tree #{b}", tree(arg[b], words))
    show("score of that tree", fmt((arg * span).sum((1, 2))), "(= best score)")

    print("\n-- Real (+, x): the partition function in linear space")
    z = BRACKETS(sr.Real, lengths=lengths, span=span)
    show("Z", fmt(z, 2), f"(exp(log Z) = {fmt(log_z.exp(), 2)})")

    print("\n-- Count (+, x on 0/1): how many trees exist (a -inf potential removes a part)")
    count = BRACKETS(sr.Count, lengths=lengths, span=span)
    show("number of trees", count.long().tolist(),
         f"closed form Catalan(n-1) = {[catalan(n - 1) for n in lengths.tolist()]}")
    forbid = span.clone()
    forbid[:, 0, 1] = float("-inf")  # a -inf potential forbids a part: no tree may bracket words 0..1
    show("... with span (0, 1) forbidden", BRACKETS(sr.Count, lengths=lengths, span=forbid).long().tolist())

    print("\n-- SignedLog ((log|a|, sign a)): sums of signed reals in log space, without underflow")
    print("  Give each span a signed real weight w and sum over trees the product of the weights.")
    batch, shapes = BRACKETS.shapes({"span": span})
    lens = BRACKETS.check_lengths(lengths, batch, shapes)
    w = torch.randn(B, N, N, dtype=torch.float64)
    real = BRACKETS.run(sr.Real, {"span": w}, lens, batch, shapes)
    signed = BRACKETS.run(sr.SignedLog, {"span": sr.SignedLog.from_real(w)}, lens, batch, shapes)
    show("Real (float64)", fmt(real, 5))
    show("SignedLog -> real", fmt(sr.SignedLog.to_real(signed), 5))
    tiny = (w * 1e-30).float()  # every weight ~1e-30: the sums underflow in float32
    real = BRACKETS.run(sr.Real, {"span": tiny}, lens, batch, shapes)
    signed = BRACKETS.run(sr.SignedLog, {"span": sr.SignedLog.from_real(tiny)}, lens, batch, shapes)
    show("weights * 1e-30, Real (float32)", fmt(real), "(underflows to 0)")
    show("  SignedLog: log|sum|, sign", f"{fmt(signed[0], 1)}, {signed[1].long().tolist()}")

    print("\n-- Expectation(SignedLog) ((p, r) pairs): expectations of additive functions")
    e = sr.Expectation(sr.SignedLog)
    two = torch.zeros(B, N, N)
    idx = torch.arange(N - 1)
    two[:, idx, idx + 1] = 1.0  # the value of a part: 1 for a two-word span
    out = BRACKETS.run(e, {"span": e.pair(span, two)}, lens, batch, shapes)  # [(p, r), (log|.|, sign), B]
    expected = out[1, 1] * (out[1, 0] - out[0, 0]).exp()  # r / p
    show("E[number of two-word spans]", fmt(expected), f"(from the marginals: {fmt((mu * two).sum((1, 2)))})")

    print("\n-- Sampled (logsumexp forward, a categorical draw backward): exact samples")
    draws = 2000
    x = span.unsqueeze(0).expand(draws, B, N, N).reshape(draws * B, N, N).clone().requires_grad_()
    value = BRACKETS(sr.Sampled, lengths=lengths.repeat(draws), span=x)
    (samples,) = torch.autograd.grad(value.sum(), x)  # one-hot spans of one sampled tree per row
    samples = samples.reshape(draws, B, N, N)
    for i in range(3):
        show(f"sample {i} of sentence #0", tree(samples[i, 0], SENTENCES[0]))
    err = (samples.mean(0) - mu).abs().max().item()
    show(f"mean of {draws} samples vs marginals", f"max |difference| = {err:.3f}", "(sampling noise)")

    print("\n-- KMax(3) (top-3, +): the 3 best scores; their gradients are the 3 best trees")
    x = span.clone().requires_grad_()
    top = BRACKETS(sr.KMax(3), lengths=lengths, span=x)  # [3, B]: component dimension first
    show("3 best scores of sentence #0", fmt(top[:, 0]), f"(the first is Max: {best[0].item():.3f})")
    show("3 best scores of sentence #1", fmt(top[:, 1]), "(it has only 2 trees: -inf fills the rest)")
    for j in range(3):
        (g,) = torch.autograd.grad(top[j, 0], x, retain_graph=True)
        show(f"tree {j + 1} of sentence #0", tree(g[0], SENTENCES[0]))

    print("\n-- Derivations(capacity) (union, pairing): every tree explicitly, for tiny sizes")
    words = SENTENCES[0][:4]
    small = span[:1, :4, :4]
    el = BRACKETS(sr.Derivations(8), span=small)  # [capacity, 1 + parts, B]; column 0: slot used
    print(f"  every tree of '{' '.join(words)}' (parts = the 16 entries of span[0], row-major):")
    for slot in range(el.shape[0]):
        if el[slot, 0, 0] > 0:
            parts = el[slot, 1:, 0].reshape(4, 4)
            show(f"  slot {slot}", f"{tree(parts, words):<28} score {(parts * small[0]).sum().item():+.3f}")
    show("number of trees", f"{int((el[:, 0, 0] > 0).sum())}", f"(Catalan(3) = {catalan(3)})")


class Brackets(StructuredDistribution):
    """Part 2: the same program as a distribution; ``span`` scores are ``[B, N, N]``."""

    program = BRACKETS
    shape = "B, N, N"


def part2() -> None:
    heading("2. The same program as a distribution: a 3-line subclass gets every query")
    print("  class Brackets(StructuredDistribution):")
    print("      program = BRACKETS")
    print('      shape = "B, N, N"')
    torch.manual_seed(1)
    d = Brackets(torch.randn(2, 5, 5), lengths=torch.tensor([5, 3]))
    show("log_partition", fmt(d.log_partition))
    show("marginals", f"shape {list(d.marginals.shape)}")
    show("argmax / max", f"shape {list(d.argmax.shape)} / {fmt(d.max)}")
    show("sample((4,))", f"shape {list(d.sample((4,)).shape)}")
    show("topk(3)", f"shape {list(d.topk(3).shape)}; scores {fmt(d.topk_scores(3)[:, 0])}")
    show("entropy", fmt(d.entropy()))
    show("count", d.count.long().tolist())
    values, valid = d.enumerate_structures()
    show("enumerate_structures()", f"values {list(values.shape)}, valid per example {valid.sum(0).tolist()}")
    show("sum of p over the support", fmt((d.log_prob(values).exp() * valid).sum(0)))


def part3() -> None:
    heading("3. The shipped structures")
    torch.manual_seed(2)

    print("-- LinearChainCRF.from_emissions: tags with emission + transition scores")
    emissions, transitions = torch.randn(2, 5, 3), torch.randn(3, 3)
    crf = LinearChainCRF.from_emissions(emissions, transitions, lengths=torch.tensor([5, 3]))
    gold = torch.tensor([[0, 1, 2, 1, 0], [2, 2, 1, 0, 0]])
    show("log Z", fmt(crf.log_partition))
    show("nll of gold tags", fmt(-crf.log_prob(gold)))
    show("marginals (edge) / tag_marginals", f"{list(crf.marginals.shape)} / {list(crf.tag_marginals.shape)}")
    show("decode()", crf.decode().tolist(), "(0 past each length)")
    show("a sample, as tags", crf.tags(crf.sample()).tolist())
    show("entropy", fmt(crf.entropy()))
    show("count", crf.count.long().tolist(), "(3^5, 3^3)")

    print("\n-- HopChainCRF.unary: K = 3 hops over F = 4 facts, the last fact masked, no repeats")
    scores = torch.randn(1, 3, 4)
    hops = HopChainCRF.unary(scores, fact_mask=torch.tensor([[True, True, True, False]]), no_repeat=True)
    show("log Z", fmt(hops.log_partition))
    show("decode() (fact per hop)", hops.decode().tolist())
    show("hop_marginals", f"shape {list(hops.hop_marginals.shape)}")
    show("count", hops.count.long().tolist(), "(3 * 2 * 2)")

    print("\n-- SemiMarkovCRF: labelled segments of length 1..K = 3 over N = 6 positions, C = 2")
    semi = SemiMarkovCRF(torch.randn(1, 6, 3, 2, 2))
    show("log Z", fmt(semi.log_partition))
    show("decode() (label per position)", semi.decode().tolist())
    show("count", semi.count.long().tolist())
    show("entropy", fmt(semi.entropy()))

    print("\n-- ProjectiveDependencyCRF: projective dependency trees (Eisner's chart in the language)")
    arcs = torch.randn(2, 6, 6)  # [B, N+1, N+1]: arc[h, m], index 0 is the root symbol
    dep = ProjectiveDependencyCRF(arcs, lengths=torch.tensor([5, 4]))
    show("log Z", fmt(dep.log_partition))
    show("decode() (head of words 1..N)", dep.decode().tolist(), "(0 = the root; 0 past each length)")
    show("count", dep.count.long().tolist(),
         f"closed form C(3n, n)/(2n+1) = {[math.comb(3 * n, n) // (2 * n + 1) for n in (5, 4)]}")
    single = ProjectiveDependencyCRF(arcs, lengths=torch.tensor([5, 4]), single_root=True)
    show("single_root=True: count", single.count.long().tolist(), "(the root has exactly one child)")


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(prog="python -m structures.tour", description=__doc__.split("\n\n")[1].replace("\n", " ")).parse_args(argv)
    torch.set_printoptions(precision=3)
    part1()
    part2()
    part3()
    print("\nMore: README.md, docs/language.md (the rules and a tutorial), docs/semirings.md, docs/shapes.md")


if __name__ == "__main__":
    main()
