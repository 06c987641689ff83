"""Spanning-tree decoding: ours against a networkx loop and SuPar's MST decoding (B=16, n=128).

    python -m benchmarks.mst [--repeat 11] [--threads 2] [--quick] [--only normal]

Inputs (``scores[b, h, m]``, head first, position 0 the root; B = 16, n = 128, float32):

* ``normal``: standard normal scores. The per-word best heads almost surely have a cycle, so
  every example goes through the contraction algorithm.
* ``planted``: a random tree's arcs get +6 over standard normal noise, as a trained parser's
  scores would; the per-word best heads form that tree (the shortcut answers).
* ``hard``: nested cycles (each contraction creates the next cycle: n - 1 nested contractions
  per tree) under a random relabelling of the words, plus small noise; no shortcut.

Each in both root modes. Peers:

* ``networkx``: a Python loop building a ``DiGraph`` per example and calling
  ``maximum_spanning_arborescence`` (graph building is part of the cost). For the single root it
  is given the root arcs lowered by ``c = 1 + n (max - min)`` (Stanojevic & Cohen 2021), which
  makes its answer single-rooted and exact.
* ``supar``: ``supar.structs.fn.mst`` (SuPar 1.1.4; it takes ``[b, dependent, head]``, so it gets
  the transpose, made contiguous outside the timed region). Its single-root mode re-runs
  Chu-Liu-Edmonds once per root child of the multi-root tree, which is not exact: the table
  counts the examples where its tree scores below ours.

* ``SynJax``: its numba ``vectorized_mst`` (Tarjan after Stanojevic & Cohen's reweighting for the
  single root), in a worker process with SynJax's venv on the same core (``benchmarks.synjax_peer``;
  skipped without the venv); its first call (numba compile) is reported apart, while our first
  call (``ours first call``, the first in this process) is reported beside our median.

Ours, SuPar and SynJax are timed round-robin (``benchmarks.common``); the networkx loop, a thousand
times slower, is timed alone: the median of ``--nx-repeat`` calls, the first of which is also
the check. Every tree is checked: ours against networkx's tree score (equal within 1e-6), SuPar's
never above ours. Prints the table and the ratios (peer time / our time).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import warnings

import torch

if __package__ in (None, ""):  # run as a script: python benchmarks/mst.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import DEFAULT_THREADS, Timing, fmt_ms, machine_info, markdown_table, pin_one_core, seed_all, setup, time_round_robin  # noqa: E402
from benchmarks.synjax_peer import SynJax  # noqa: E402
from structures.spanning.decode import is_tree, max_arborescence, tree_score  # noqa: E402

B, N = 16, 128


# ---------------------------------------------------------------------------- inputs


def make_scores(kind: str, b: int = B, n: int = N, seed: int = 0) -> torch.Tensor:
    seed_all(seed)
    if kind == "normal":
        return torch.randn(b, n + 1, n + 1)
    if kind == "planted":
        s = torch.randn(b, n + 1, n + 1)
        for i in range(b):
            order = (torch.randperm(n) + 1).tolist()
            for j, m in enumerate(order):
                h = 0 if j == 0 else order[int(torch.randint(0, j, ()))]
                s[i, h, m] += 6.0
        return s
    if kind == "hard":
        # the best arcs: m-1 -> m (10) and 2 -> 1 (5): one 2-cycle; then every contracted group
        # {1..j} is best entered by j+1 -> j (5 - 10), which closes the next cycle. Every other arc
        # (the root's included) is so low that it never wins: n - 1 nested contractions.
        s = torch.full((b, n + 1, n + 1), -10.0 * n)
        for m in range(2, n + 1):
            s[:, m - 1, m] = 10.0
            s[:, m, m - 1] = 5.0
        s += 1e-3 * torch.randn(b, n + 1, n + 1)
        for i in range(b):  # relabel the words
            perm = torch.cat([torch.zeros(1, dtype=torch.long), torch.randperm(n) + 1])
            s[i] = s[i][perm][:, perm]
        return s
    raise ValueError(kind)


# ---------------------------------------------------------------------------- peers


def networkx_loop(scores: torch.Tensor, single_root: bool) -> torch.Tensor:
    import networkx as nx

    b, n1, _ = scores.shape
    out = torch.zeros(b, n1 - 1, dtype=torch.long)
    s = scores.double()
    for i in range(b):
        w = s[i].clone()
        if single_root:
            w[0, 1:] -= 1.0 + (n1 - 1) * float(w.max() - w.min())
        w = w.tolist()
        G = nx.DiGraph()
        G.add_weighted_edges_from((h, m, w[h][m]) for h in range(n1) for m in range(1, n1) if h != m)
        A = nx.maximum_spanning_arborescence(G)
        for h, m in A.edges():
            out[i, m - 1] = h
    return out


def load_supar():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from supar.structs.fn import mst
        return mst
    except Exception as e:  # noqa: BLE001 - an optional peer
        print(f"supar: not available ({type(e).__name__}: {e}); skipped", file=sys.stderr)
        return None


# ---------------------------------------------------------------------------- main


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=11, help="timed rounds (slow peers stop after ~40 s, at least 3)")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    p.add_argument("--quick", action="store_true", help="3 rounds, n = 64 (a smoke run)")
    p.add_argument("--only", help="run the rows whose name contains this (e.g. 'normal', 'single')")
    p.add_argument("--nx-repeat", type=int, default=3, help="networkx calls per row (10-90 s each at n = 128)")
    p.add_argument("--no-networkx", action="store_true", help="skip the networkx loop")
    p.add_argument("--no-synjax", action="store_true", help="skip SynJax (skipped anyway without its venv)")
    args = p.parse_args(argv)
    setup(args.threads)
    n = 64 if args.quick else N
    repeat = 3 if args.quick else args.repeat
    mst = load_supar()
    info = machine_info()
    info["pinned to core"] = str(pin_one_core())
    with SynJax.running(not args.no_synjax) as synjax:
        print("\n".join(f"- {k}: {v}" for k, v in info.items()))
        print(f"- B = {B}, n = {n}, float32 scores; times are medians (round-robin), ratios = peer / ours\n")
        headers = ["input", "root", "ours ms", "ours first call ms", "networkx ms", "supar ms", "SynJax ms",
                   "networkx / ours", "supar / ours", "SynJax / ours", "SynJax first call (numba compile) s",
                   "shortcut", "supar worse", "SynJax worse"]
        rows = []
        for kind in ("normal", "planted", "hard"):
            for single in (False, True):
                name = f"{kind} {'single' if single else 'multi'}"
                if args.only and args.only not in name:
                    continue
                s = make_scores(kind, n=n)
                s_supar = s.transpose(1, 2).contiguous()
                mask = torch.ones(B, n + 1, dtype=torch.bool)
                mask[:, 0] = False
                fns = {"ours": lambda s=s, single=single: max_arborescence(s, single_root=single)}
                start = time.perf_counter()
                ours = fns["ours"]()
                ours_first = time.perf_counter() - start
                assert is_tree(ours, single_root=single).all()
                ours_score = tree_score(s.double(), ours)
                nx_laps = []
                if not args.no_networkx:
                    for r in range(1 if args.quick else args.nx_repeat):
                        start = time.perf_counter()
                        ref = networkx_loop(s, single)
                        nx_laps.append(time.perf_counter() - start)
                        if r == 0:
                            ref_score = tree_score(s.double(), ref)
                            assert torch.allclose(ours_score, ref_score, atol=1e-6, rtol=0), (name, ours_score, ref_score)
                worse = "-"
                if mst is not None:
                    fns["supar"] = lambda s=s_supar, single=single: mst(s, mask, multiroot=not single)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        theirs = fns["supar"]()[:, 1:]
                        theirs_score = tree_score(s.double(), theirs)
                    assert (theirs_score <= ours_score + 1e-6).all()
                    worse = f"{int((theirs_score < ours_score - 1e-6).sum())}/{B}"
                sj_worse, sj_first = "-", None
                if synjax is not None:
                    call, value, sj_first = synjax.load("mst", s.numpy(), single)
                    theirs = torch.from_numpy(value[:, 1:])
                    assert is_tree(theirs, single_root=single).all()
                    theirs_score = tree_score(s.double(), theirs)
                    assert (theirs_score <= ours_score + 1e-6).all()
                    sj_worse = f"{int((theirs_score < ours_score - 1e-6).sum())}/{B}"
                    fns["SynJax"] = lambda c=call: synjax.lap(c)
                # the shortcut: examples whose per-word best heads already form a valid tree
                best = s.masked_fill(torch.eye(n + 1, dtype=torch.bool), -math.inf)[:, :, 1:].argmax(1)
                ok = is_tree(best, single_root=single)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    t = time_round_robin(fns, repeat=repeat, warmup=1, min_repeat=3, budget_s=60.0)
                if nx_laps:
                    t["networkx"] = Timing(statistics.median(nx_laps), min(nx_laps), max(nx_laps), len(nx_laps), min(nx_laps))
                get = lambda k: t[k].median if k in t else None  # noqa: E731
                ratio = lambda k: f"{get(k) / get('ours'):.0f}x" if k in t else "-"  # noqa: E731
                rows.append([kind, "single" if single else "multi", fmt_ms(get("ours")), fmt_ms(ours_first),
                             fmt_ms(get("networkx")) if "networkx" in t else "-",
                             fmt_ms(get("supar")) if "supar" in t else "-",
                             fmt_ms(get("SynJax")) if "SynJax" in t else "-",
                             ratio("networkx"), ratio("supar"),
                             f"{get('SynJax') / get('ours'):.2f}x" if "SynJax" in t else "-",
                             "-" if sj_first is None else f"{sj_first:.2f}", f"{int(ok.sum())}/{B}", worse, sj_worse])
                print(f"{name}: " + ", ".join(f"{k} {fmt_ms(v.median)} ms ({v.runs} runs)" for k, v in t.items()), flush=True)
    print()
    print(markdown_table(headers, rows, "llrrrrrrrrrrrr"))


if __name__ == "__main__":
    main()
