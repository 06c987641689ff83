"""Small linear chains, long sequences (B = 4, C = 16, N = 256..2048): ours against a floor, a
torch-struct peer, and float32's accuracy at N = 4096.

    python -m benchmarks.small_chain [--repeat 15] [--threads 1] [--quick]

Rows: ``LinearChainCRF`` marginals (forward + backward) per size, round-robin in this process (see
``benchmarks.common``), against

* **floor**: the same marginals as a numba loop in probability space with scaling, the fastest plain
  algorithm (one exp per entry of the potentials, then matrix-vector products; each step's vector
  rescaled to sum 1): what a hand-written kernel for this one structure costs. Compiled before timing;
  skipped without numba (``pip install numba``).
* **torch-struct** 0.5's ``LinearChainCRF`` (``pip install -e '.[bench]'``; skipped without it).
* **SynJax**'s ``LinearChainCRF`` (jitted, float32), in its worker process on the same core
  (:mod:`benchmarks.synjax_peer`; skipped without its venv, docs/benchmarks.md says how to make it).
  The process is pinned to one core first (``benchmarks.common.pin_one_core``).

Every implementation is checked to give the same marginals before it is timed. Then the accuracy
table: float32 marginals at N = 4096 (randn potentials, two scales) against float64's, ours and the
floor's. Prints markdown tables with the machine (``benchmarks.common.machine_info``).
"""

from __future__ import annotations

import sys
from typing import Callable

import torch

from benchmarks.common import machine_info, markdown_table, pin_one_core, side_by_side_options, time_round_robin
from benchmarks.synjax_peer import SynJax
from structures import LinearChainCRF

B, C = 4, 16
SIZES = (256, 512, 1024, 2048)
QUICK_SIZES = (64,)
ACCURACY_N = 4096


def floor_marginals() -> Callable | None:
    """The numba floor, ``x [B, N-1, C, C]`` (numpy, ours' convention) -> marginals, or None without numba."""
    try:
        import numba
        import numpy as np
    except ImportError:
        return None

    @numba.njit(cache=False)
    def marginals(x):
        Bx, T, K, _ = x.shape
        out = np.empty_like(x)
        E = np.empty((T, K, K), x.dtype)
        alpha = np.empty((T + 1, K), x.dtype)
        beta = np.empty((T + 1, K), x.dtype)
        for b in range(Bx):
            for t in range(T):
                m = x[b, t].max()
                for y in range(K):
                    for c in range(K):
                        E[t, y, c] = np.exp(x[b, t, y, c] - m)
            alpha[0, :] = 1.0
            for t in range(T):
                s = 0.0
                for c in range(K):
                    a = 0.0
                    for y in range(K):
                        a += alpha[t, y] * E[t, y, c]
                    alpha[t + 1, c] = a
                    s += a
                alpha[t + 1, :] /= s
            beta[T, :] = 1.0
            for t in range(T - 1, -1, -1):
                s = 0.0
                for y in range(K):
                    v = 0.0
                    for c in range(K):
                        v += E[t, y, c] * beta[t + 1, c]
                    beta[t, y] = v
                    s += v
                beta[t, :] /= s
            for t in range(T):
                z = 0.0
                for y in range(K):
                    for c in range(K):
                        w = alpha[t, y] * E[t, y, c] * beta[t + 1, c]
                        out[b, t, y, c] = w
                        z += w
                out[b, t] /= z
        return out

    return lambda x: torch.from_numpy(marginals(x.numpy()))


def implementations(N: int, synjax=None, seed: int = 0) -> dict[str, Callable[[], object]]:
    """Zero-argument calls of every implementation on the same ``[B, N-1, C, C]`` potentials (SynJax's
    returns its lap; its result, :func:`check`'s, comes from its first call)."""
    x = torch.randn(B, N - 1, C, C, generator=torch.Generator().manual_seed(seed))
    impls = {"ours": lambda: LinearChainCRF(x).marginals}
    floor = floor_marginals()
    if floor is not None:
        impls["floor (numba)"] = lambda: floor(x)
    try:
        import torch_struct
        x_t = x.transpose(-1, -2).contiguous()
        impls["torch-struct"] = lambda: torch_struct.LinearChainCRF(x_t).marginals.transpose(-1, -2)
    except ImportError:
        pass
    if synjax is not None:
        call, first, _ = synjax.load("chain_marginals", x.numpy())
        impls["SynJax"] = lambda: synjax.lap(call)
        impls["SynJax"].result = torch.from_numpy(first)
    return impls


def check(impls: dict[str, Callable[[], object]]) -> None:
    expected = impls["ours"]()
    for name, fn in impls.items():
        got = getattr(fn, "result", None)
        got = fn() if got is None else got
        if not torch.allclose(got, expected, rtol=1e-3, atol=1e-4):
            raise SystemExit(f"{name} disagrees with ours: {(got - expected).abs().max().item():.3g}")


def accuracy_rows(synjax=None) -> list[list[str]]:
    rows = []
    floor = floor_marginals()
    for scale in (1.0, 3.0):
        x = torch.randn(2, ACCURACY_N - 1, C, C, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * scale
        exact = LinearChainCRF(x).marginals
        cells = {"ours": LinearChainCRF(x.float()).marginals}
        if floor is not None:
            cells["floor (numba)"] = floor(x.float())
        if synjax is not None:
            cells["SynJax"] = torch.from_numpy(synjax.load("chain_marginals", x.float().numpy())[1])
        for name, m in cells.items():
            rows.append([f"randn × {scale:g}", name, f"{(m.double() - exact).abs().max().item():.2e}"])
    return rows


def main(argv=None) -> None:
    args = side_by_side_options(__doc__, argv, repeat=15, quick=f"N = {QUICK_SIZES[0]} only, 3 rounds")
    sizes, repeat = (QUICK_SIZES, 3) if args.quick else (SIZES, args.repeat)
    rows = []
    core = pin_one_core()
    with SynJax.running() as synjax:
        for N in sizes:
            impls = implementations(N, synjax)
            check(impls)
            times = time_round_robin(impls, repeat=repeat, budget_s=60)
            ours = times["ours"]
            rows += [[f"marginals B{B} N{N} C{C}", f"{ours.ms:.2f}", peer, f"{times[peer].ms:.2f}",
                      f"**{times[peer].median / ours.median:.2f}×**", f"{times[peer].min / ours.min:.2f}×"]
                     for peer in impls if peer != "ours"]
        accuracy = accuracy_rows(synjax) if not args.quick else []
    print(markdown_table(["", ""], [[k, v] for k, v in machine_info().items()]))
    print(f"(every implementation on core {core})")
    print()
    print(markdown_table(["benchmark", "ours (ms)", "peer", "peer (ms)", "peer / ours", "ratio of minimums"], rows, "lllrrr"))
    print()
    if accuracy:
        print(markdown_table(["float32 at N = 4096, C = 16", "implementation", "max |float32 - float64|"], accuracy, "llr"))


if __name__ == "__main__":
    main(sys.argv[1:])
