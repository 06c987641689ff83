"""Non-projective dependency CRF: ours against torch-struct 0.5 and SynJax (speed) and against
peers' arithmetic (accuracy at large score scales).

    python -m benchmarks.nonprojective [--repeat 15] [--threads 1] [--quick] [--no-accuracy] [--no-synjax]

Speed: log-partition and marginals at B=16, n = 8, 16, 64 and 128 words, multi- and single-root,
round-robin medians (``benchmarks.common``), the process pinned to one core. Ours computes in
float64 from float32 inputs (the certified path where its a-posteriori bound allows, in C where
the optional extension is built, else torch and LAPACK; the subtraction-free path elsewhere); torch-struct in float32; SynJax (``SpanningTreeCRF``, jitted,
float32, default settings) in a worker process with its own venv on the same core
(``benchmarks.synjax_peer``; its column is skipped without the venv), its first call (jit
compile) reported apart. The last column times our exact path alone (``fast=False``, marginals),
in a round of its own.

Accuracy: scores of standard deviation 40 on 20 words (the issue's case), float32 inputs; the
largest error of any marginal against the matrix-tree theorem evaluated in mpmath at 700 digits,
for ours, torch-struct, and the plain float64 recipe (per-dependent max shift, LU / inverse,
Koo's formulas).

Conventions: ours takes ``[B, N+1, N+1]``, ``[b, h, m]`` = arc h -> m, row 0 the root;
torch-struct takes ``[B, N, N]`` (head, child) with the root scores on the diagonal. The inputs
are converted outside the timed region and the results compared before timing.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings

import torch

if __package__ in (None, ""):  # run as a script: python benchmarks/nonprojective.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import fmt_ms, machine_info, markdown_table, pin_one_core, seed_all, setup, time_round_robin, write_csv
from benchmarks.synjax_peer import SynJax
from structures import NonProjectiveDependencyCRF
from structures.spanning._tree_partition import log_partition_and_marginals
from tests.matrix_tree_reference import high_precision_reference

B = 16
SIZES = (8, 16, 64, 128)
TS_NAME = {"log_partition": "partition", "marginals": "marginals"}  # torch-struct's partition is log Z
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _torch_struct():
    import torch_struct

    warnings.filterwarnings("ignore", message=".*arg_constraints.*")
    return torch_struct


def to_ts(theta: torch.Tensor) -> torch.Tensor:
    """Ours ``[B, N+1, N+1]`` -> torch-struct ``[B, N, N]`` (root scores on the diagonal)."""
    x = theta[:, 1:, 1:].clone()
    x.diagonal(dim1=-2, dim2=-1).copy_(theta[:, 0, 1:])
    return x


def from_ts(mu: torch.Tensor) -> torch.Tensor:
    """torch-struct marginals ``[B, N, N]`` -> ours ``[B, N+1, N+1]``."""
    Bn, N, _ = mu.shape
    out = mu.new_zeros(Bn, N + 1, N + 1)
    out[:, 1:, 1:] = mu
    out[:, 1:, 1:].diagonal(dim1=-2, dim2=-1).zero_()
    out[:, 0, 1:] = mu.diagonal(dim1=-2, dim2=-1)
    return out


def ts_crf(x: torch.Tensor, single_root: bool):
    ts = _torch_struct()
    # torch-struct 0.5 needs a non-leaf that requires grad on current torch
    return ts.NonProjectiveDependencyCRF(x.detach().requires_grad_() * 1, multiroot=not single_root)


def ts_marginals(x: torch.Tensor, single_root: bool) -> torch.Tensor:
    return ts_crf(x, single_root).marginals


def plain_float64(theta: torch.Tensor, single_root: bool) -> torch.Tensor:
    """The textbook recipe in float64: shift every dependent's scores by their max, Laplacian,
    ``torch.linalg.inv``, Koo et al.'s formulas (``X_mm - X_mh``)."""
    th = theta.double().clone()
    n = th.shape[-1] - 1
    th.diagonal(dim1=-2, dim2=-1).fill_(-math.inf)
    th[:, :, 0] = -math.inf
    th = th - th.amax(1, keepdim=True).clamp_min(-1e300)
    W = th.exp()
    W[:, :, 0] = 0
    Ww, r = W[:, 1:, 1:], W[:, 0, 1:]
    L = torch.diag_embed(Ww.sum(1)) - Ww
    if not single_root:
        L = L + torch.diag_embed(r)
    else:
        L = torch.cat([r[:, None, :], L[:, 1:]], 1)
    X = torch.linalg.inv(L)
    mu = torch.zeros_like(W)
    first = torch.zeros(n, dtype=torch.bool)
    first[0] = True
    if not single_root:
        mu[:, 0, 1:] = r * X.diagonal(dim1=-2, dim2=-1)
        mu[:, 1:, 1:] = Ww * (X.diagonal(dim1=-2, dim2=-1)[:, None, :] - X.mT)
    else:
        mu[:, 0, 1:] = r * X[:, :, 0]
        dX = X.diagonal(dim1=-2, dim2=-1).masked_fill(first, 0)
        XT = X.mT.masked_fill(first[:, None], 0)
        mu[:, 1:, 1:] = Ww * (dX[:, None, :] - XT)
    return mu


# ---------------------------------------------------------------------------- runs


def speed(repeat: int, synjax: SynJax | None) -> list:
    """A row per size, root mode and query (log-partition, marginals): medians of ours, torch-struct
    and SynJax (round-robin), SynJax's first call (jit compile) apart, our exact path alone."""
    rows = []
    for n in SIZES:
        for single_root in (False, True):
            seed_all(n + single_root)
            theta = torch.randn(B, n + 1, n + 1)
            x_ts = to_ts(theta)
            lengths = torch.full((B,), n)
            info: dict = {}
            logZ, mu = log_partition_and_marginals(theta, lengths, single_root, info=info)
            fast = sum(m == "fast" for m in info["method"])
            # torch-struct adds 1e-5 to every arc weight and computes in float32
            torch.testing.assert_close(mu.float(), from_ts(ts_marginals(x_ts, single_root).detach()), atol=2e-3, rtol=0)
            for query in ("log_partition", "marginals"):
                fns = {
                    "ours": lambda q=query: getattr(NonProjectiveDependencyCRF(theta, single_root=single_root), q),
                    "torch-struct": lambda q=TS_NAME[query]: getattr(ts_crf(x_ts, single_root), q),
                }
                first = None
                if synjax is not None:
                    call, value, first = synjax.load(query, theta.numpy(), single_root)
                    ours = logZ if query == "log_partition" else mu
                    torch.testing.assert_close(torch.from_numpy(value).double(), ours, atol=2e-3, rtol=1e-5)
                    fns["SynJax"] = lambda c=call: synjax.lap(c)
                t = time_round_robin(fns, repeat=repeat, warmup=2, min_repeat=5, budget_s=30.0)
                size = f"B={B} n={n} {'single' if single_root else 'multi'}-root"
                rows.append((size, query.replace("_", "-"), f"{fast}/{B}", t["ours"], t["torch-struct"], t.get("SynJax"), first))
            # timed apart: its large temporaries would change the allocator's state for the next call
            exact = {"exact": lambda: log_partition_and_marginals(theta, lengths, single_root, fast=False)}
            rows[-1] += (time_round_robin(exact, repeat=repeat, warmup=1, min_repeat=3, budget_s=15.0)["exact"],)
    return rows


def accuracy(synjax: SynJax | None, examples: int = 4) -> list:
    seed_all(40)
    out = []
    for single_root in (False, True):
        theta = (torch.randn(examples, 21, 21) * 40).float()
        refs = [high_precision_reference(theta[b].double(), single_root)[1] for b in range(examples)]
        results = {
            "ours (float32 out)": NonProjectiveDependencyCRF(theta, single_root=single_root).marginals.double(),
            "torch-struct (float32)": from_ts(ts_marginals(to_ts(theta), single_root).detach()).double(),
            "plain float64 (shift, inverse, Koo)": plain_float64(theta, single_root),
        }
        if synjax is not None:
            results["SynJax (float32)"] = torch.from_numpy(synjax.load("marginals", theta.numpy(), single_root)[1]).double()
        for name, mu in results.items():
            errs = [(mu[b] - refs[b]).abs().max().item() for b in range(examples)]
            worst = "NaN" if any(math.isnan(e) for e in errs) else f"{max(errs):.1e}"
            out.append(("single" if single_root else "multi", name, worst, sum(e > 1e-5 or math.isnan(e) for e in errs)))
    return out


def render(info, rows, acc) -> str:
    def ratio(peer, ours) -> str:
        return "-" if peer is None else f"**{peer.median / ours.median:.2f}×** ({peer.min / ours.min:.2f}×)"

    parts = ["### Machine", "", markdown_table(["", ""], list(info.items()), "ll"), ""]
    parts += ["### Median ms of round-robin runs; peer / ours > 1: ours is faster (in brackets: the ratio of minimums)", ""]
    parts.append(markdown_table(
        ["size", "query", "ours: certified fast path", "ours", "torch-struct", "SynJax", "torch-struct / ours",
         "SynJax / ours", "SynJax first call (jit), s", "ours exact path only (marginals)"],
        [(s, q, f, fmt_ms(o.median), fmt_ms(p.median), "-" if j is None else fmt_ms(j.median), ratio(p, o), ratio(j, o),
          "-" if c is None else f"{c:.2f}", fmt_ms(e[0].median) if e else "")
         for s, q, f, o, p, j, c, *e in rows], "llrrrrrrrr"))
    if acc:
        parts += ["", "### Accuracy: std-40 scores, n = 20, float32 inputs; max |marginal error| vs mpmath (700 digits)", ""]
        parts.append(markdown_table(["root", "method", "max error", "examples off by > 1e-5"], acc, "llrr"))
    return "\n".join(parts)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as benchmarks.chain)")
    p.add_argument("--quick", action="store_true", help="3 rounds, no accuracy table")
    p.add_argument("--no-accuracy", action="store_true")
    p.add_argument("--no-synjax", action="store_true", help="skip the SynJax column (skipped anyway without its venv)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    a = p.parse_args(argv)
    setup(a.threads)
    info = machine_info()
    info["pinned to core"] = str(pin_one_core())
    with SynJax.running(not a.no_synjax) as synjax:
        rows = speed(3 if a.quick else a.repeat, synjax)
        acc = [] if (a.quick or a.no_accuracy) else accuracy(synjax)
    info["load average after"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    report = render(info, rows, acc)
    print(report)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "nonprojective.md"), "w") as f:
        f.write(report + "\n")
    write_csv(os.path.join(a.out, "nonprojective.csv"),
              ["size", "query", "fast_examples", "ours_ms", "torch_struct_ms", "synjax_ms", "synjax_first_s", "exact_only_ms"],
              [(s, q, f, f"{o.ms:.3f}", f"{p.ms:.3f}", "" if j is None else f"{j.ms:.3f}", "" if c is None else f"{c:.3f}",
                f"{e[0].ms:.3f}" if e else "") for s, q, f, o, p, j, c, *e in rows])


if __name__ == "__main__":
    main()
