"""Where the time of ``LinearChainCRF.marginals`` / ``argmax`` goes, and two prototypes that size
the suggestions in docs/benchmarks.md ("Where the time goes"):

    python -m benchmarks.chain_profile [--threads 1]

* ``FusedLogScan``: the whole Log recurrence as ONE autograd node (forward without a graph keeping
  the ``[N+1, B, C]`` chart, backward a reverse loop writing each level's gradient in place);
* ``viterbi_backpointers``: Max with backpointers and a backtrack instead of an autograd backward.

Prototypes only (first order, full lengths): not used by the library.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import semiring as sr
from benchmarks.chain import B, N, loop_argmax, loop_marginals, _loop_log_partition, _loop_max
from benchmarks.common import setup
from semiring.semirings import _LogDot
from structures import LinearChainCRF
from structures.validation import check_shape


class FusedLogScan(torch.autograd.Function):
    """log Z of ``x [B, M, C(from), C(to)]`` (alpha_0 = 0), one node for all M levels."""

    @staticmethod
    def forward(ctx, x):
        Bx, M, C, _ = x.shape
        alphas = x.new_empty(M + 1, Bx, C)
        alphas[0] = 0
        for i in range(M):
            torch.logsumexp(alphas[i].unsqueeze(-1) + x[:, i], 1, out=alphas[i + 1])
        z = torch.logsumexp(alphas[M], -1)
        ctx.save_for_backward(x, alphas, z)
        return z

    @staticmethod
    def backward(ctx, g):
        x, alphas, z = ctx.saved_tensors
        M = x.shape[1]
        gx = torch.empty_like(x)
        beta = (alphas[M] - z[:, None]).exp() * g[:, None]  # ∂z/∂alpha_M
        for i in range(M - 1, -1, -1):
            w = gx[:, i]
            torch.add(alphas[i].unsqueeze(-1), x[:, i], out=w)
            w.sub_(alphas[i + 1].unsqueeze(1)).exp_().mul_(beta.unsqueeze(1))
            beta = w.sum(-1)
        return gx


def fused_marginals(lp):
    x = lp.detach().requires_grad_()
    (g,) = torch.autograd.grad(FusedLogScan.apply(x).sum(), x)
    return g


def viterbi_backpointers(x):
    """(best score [B], tags [B, M+1]) of ``x [B, M, C, C]`` by backpointers."""
    Bx, M, C, _ = x.shape
    a = x.new_zeros(Bx, C)
    bp = torch.empty(M, Bx, C, dtype=torch.long)
    for i in range(M):
        a, bp[i] = (a.unsqueeze(-1) + x[:, i]).max(1)
    best, last = a.max(-1)
    tags = torch.empty(Bx, M + 1, dtype=torch.long)
    tags[:, M] = last
    for i in range(M - 1, -1, -1):
        last = bp[i].gather(1, last[:, None]).squeeze(1)
        tags[:, i] = last
    return best, tags


def fastest(f, r=31):
    f()
    f()
    best = float("inf")
    for _ in range(r):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    setup(a.threads)
    for C in (8, 32):
        lp = torch.randn(B, N - 1, C, C)
        d = LinearChainCRF(lp)
        x = lp.clone().requires_grad_()
        torch.testing.assert_close(fused_marginals(lp), d.marginals, rtol=0, atol=1e-5)
        best, tags = viterbi_backpointers(lp)
        torch.testing.assert_close(best, d.max, rtol=1e-5, atol=1e-3)

        def loop_logdot(x=lp):
            al = x.new_zeros(B, C)
            for e in x.transpose(-1, -2).unbind(1):
                al = _LogDot.apply(al.unsqueeze(-2), e, -1)
            return torch.logsumexp(al, -1)

        rows = [
            ("ours: LinearChainCRF(lp).marginals", lambda: LinearChainCRF(lp).marginals),
            ("  constructor (check_shape)", lambda: LinearChainCRF(lp)),
            ("  check_shape alone", lambda: check_shape("lp", lp, "B, N-1, C, C")),
            ("  one amax() instead (proposed check)", lambda: lp.amax()),
            ("  run(Log) forward", lambda: d.run(sr.Log)),
            ("  run(Log) forward + backward", lambda: torch.autograd.grad(d.run(sr.Log, x).sum(), x)),
            ("loop forward", lambda: _loop_log_partition(lp)),
            ("loop forward + backward", lambda: loop_marginals(lp)),
            ("loop with _LogDot per step, fwd + bwd", lambda: torch.autograd.grad(loop_logdot(x).sum(), x)),
            ("prototype: fused scan, fwd + bwd", lambda: fused_marginals(lp)),
            ("ours: LinearChainCRF(lp).argmax", lambda: LinearChainCRF(lp).argmax),
            ("  run(Max) forward", lambda: d.run(sr.Max)),
            ("  run(Max) forward + backward", lambda: torch.autograd.grad(d.run(sr.Max, x).sum(), x)),
            ("loop max forward", lambda: _loop_max(lp)),
            ("loop argmax (max + autograd)", lambda: loop_argmax(lp)),
            ("prototype: Viterbi with backpointers", lambda: viterbi_backpointers(lp)),
        ]
        print(f"\nB={B} N={N} C={C}, {torch.get_num_threads()} thread(s), fastest of 31 calls (ms)")
        for name, f in rows:
            print(f"  {name:42s} {fastest(f):8.2f}")


if __name__ == "__main__":
    main()
