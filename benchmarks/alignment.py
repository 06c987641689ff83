"""Monotone alignment CRF: ours (``structures.AlignmentCRF``, three rules) against SynJax's
``AlignmentCRF`` and a hand-written anti-diagonal loop, in the same process, on the same scores.

    python -m benchmarks.alignment [--repeat 15] [--threads 1] [--quick] [--no-synjax]

Log-partition and marginals (forward + backward) of ``[B, n, m]`` cell scores, B = 16, full
lengths, both kinds of steps (``many_to_many``: right, diagonal, down; ``one_to_many``: right,
diagonal), round-robin medians (``benchmarks.common``), the process pinned to one core.

* SynJax (``AlignmentCRF(lp, alignment_type="monotone_" + kind)``, jitted, float32, default
  settings: a ``lax.scan`` over the columns with a nested scan over the rows for the down steps)
  runs in a worker process with its own venv on the same core (``benchmarks.synjax_peer``; its
  column is skipped without the venv), its first call (jit compile) reported apart. Its layout is
  ours: ``[..., rows, cols]``, a score per visited cell, except that it leaves out the score of
  the first cell ``(0, 0)`` (its ``_masked_params`` sets it to 0), which every alignment visits:
  its log-partition is ours minus ``score[:, 0, 0]``, its marginals are ours.
* The loop is the textbook dynamic program along anti-diagonals (``n + m - 2`` steps of a
  ``logsumexp`` over the two or three predecessors), marginals by ``torch.autograd.grad``.
* torch-struct 0.5's ``Alignment`` is not a column: it scores moves (``[B, n, m, 3]``, ours is the
  case where the three moves into a cell score the same) but cannot run here: its merge step needs
  ``genbmm`` (a CUDA extension of banded matrix products, not on the package index), and its own
  test of it is disabled (``ignore_alignment`` in ``torch_struct/test_algorithms.py``).

Every implementation's log-partition and marginals are checked against ours before timing (1e-3).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

if __package__ in (None, ""):  # run as a script: python benchmarks/alignment.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import fmt_ms, machine_info, markdown_table, pin_one_core, seed_all, setup, time_round_robin, write_csv
from benchmarks.synjax_peer import SynJax
from structures import AlignmentCRF

B = 16
SIZES = (("many_to_many", 32, 32), ("many_to_many", 64, 64), ("many_to_many", 128, 128),
         ("one_to_many", 32, 64), ("one_to_many", 64, 128))
QUICK = SIZES[:1] + SIZES[3:4]
QUERIES = ("log_partition", "marginals")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NEG = -1e30  # finite: a logsumexp of only impossible cells keeps a finite gradient


def loop_log_partition(score: torch.Tensor, kind: str) -> torch.Tensor:
    """``[B]`` log Z of full-length alignments by the textbook DP, one anti-diagonal at a time:
    ``A[i, j] = score[i, j] + logsumexp(A[i, j-1], A[i-1, j-1] [, A[i-1, j]])``."""
    _, N, M = score.shape
    i = torch.arange(N)
    j = torch.arange(N + M - 1)[:, None] - i  # the cells (i, d - i) of diagonal d
    diag = score[:, i, j.clamp(0, M - 1)].masked_fill((j < 0) | (j >= M), _NEG)  # [B, N+M-1, N]
    pad = score.new_full((score.shape[0], 1), _NEG)
    prev2, prev = None, diag[:, 0]
    for d in range(1, N + M - 1):
        terms = [prev]  # (i, j-1)
        if prev2 is not None:
            terms.append(torch.cat([pad, prev2[:, :-1]], 1))  # (i-1, j-1)
        if kind == "many_to_many":
            terms.append(torch.cat([pad, prev[:, :-1]], 1))  # (i-1, j)
        prev2, prev = prev, torch.stack(terms).logsumexp(0) + diag[:, d]
    return prev[:, N - 1]


def implementations(theta: torch.Tensor, kind: str) -> dict:
    """``{query: {name: call}}`` for ours and the loop on ``theta [B, n, m]``."""
    def loop_marginals():
        x = theta.detach().requires_grad_()
        return torch.autograd.grad(loop_log_partition(x, kind).sum(), x)[0]

    return {"log_partition": {"ours": lambda: AlignmentCRF(theta, kind=kind).log_partition,
                              "loop": lambda: loop_log_partition(theta, kind)},
            "marginals": {"ours": lambda: AlignmentCRF(theta, kind=kind).marginals,
                          "loop": loop_marginals}}


def speed(sizes, repeat: int, synjax: SynJax | None) -> list:
    rows = []
    for kind, n, m in sizes:
        seed_all(n + m)
        theta = torch.randn(B, n, m)
        impls = implementations(theta, kind)
        for query in QUERIES:
            fns = dict(impls[query])
            want = fns["ours"]()
            err = (fns["loop"]() - want).abs().max().item()
            assert err < 1e-3, f"the loop's {query} differs from ours by {err} ({kind} n={n} m={m})"
            first = None
            if synjax is not None:
                call, value, first = synjax.load(f"alignment_{query}", theta.numpy(), kind="monotone_" + kind)
                if query == "log_partition":  # SynJax leaves out the first cell, which every path visits
                    value = value + theta[:, 0, 0].numpy()
                err = (torch.from_numpy(value) - want).abs().max().item()
                assert err < 1e-3, f"SynJax's {query} differs from ours by {err} ({kind} n={n} m={m})"
                fns["SynJax"] = lambda c=call: synjax.lap(c)
            t = time_round_robin(fns, repeat=repeat, budget_s=60)
            rows.append((kind, f"B={B} n={n} m={m}", query.replace("_", "-"), t["ours"], t["loop"], t.get("SynJax"), first))
    return rows


def render(info: dict, rows: list) -> str:
    def ratio(peer, ours):
        return "" if peer is None else f"**{peer.median / ours.median:.2f}×** ({peer.min / ours.min:.2f}×)"

    table = [[kind, size, query, fmt_ms(o.median), fmt_ms(lp.median), "" if s is None else fmt_ms(s.median),
              ratio(lp, o), ratio(s, o), "" if first is None else f"{first:.2f}"]
             for kind, size, query, o, lp, s, first in rows]
    return "\n".join([
        markdown_table(["", ""], [[k, v] for k, v in info.items()]), "",
        "Times in ms (medians; peer / ours > 1: ours is faster; in brackets the ratio of the minimums)", "",
        markdown_table(["kind", "size", "query", "ours", "loop", "SynJax", "loop / ours", "SynJax / ours",
                        "SynJax first call (jit), s"], table, "lllrrrrrr")])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=15, help="round-robin rounds")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as benchmarks.chain)")
    p.add_argument("--quick", action="store_true", help="3 rounds, two small sizes")
    p.add_argument("--no-synjax", action="store_true", help="skip the SynJax column (skipped anyway without its venv)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    a = p.parse_args(argv)
    setup(a.threads)
    info = machine_info()
    info["pinned to core"] = str(pin_one_core())
    with SynJax.running(not a.no_synjax) as synjax:
        rows = speed(QUICK if a.quick else SIZES, 3 if a.quick else a.repeat, synjax)
    info["load average after"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    report = render(info, rows)
    print(report)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "alignment.md"), "w") as f:
        f.write(report + "\n")
    write_csv(os.path.join(a.out, "alignment.csv"),
              ["kind", "size", "query", "ours_ms", "loop_ms", "synjax_ms", "synjax_first_s"],
              [(k, s, q, f"{o.ms:.3f}", f"{lp.ms:.3f}", "" if j is None else f"{j.ms:.3f}", "" if c is None else f"{c:.3f}")
               for k, s, q, o, lp, j, c in rows])


if __name__ == "__main__":
    main()
