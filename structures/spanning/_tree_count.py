"""The number of non-projective dependency trees that use allowed arcs: the matrix-tree theorem
in float64, exact integers (a fraction-free determinant) where the count is below 2**53."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._tree_partition import log_partition_and_marginals


def count_trees(theta: Tensor, lengths: Tensor, single_root: bool) -> Tensor:
    """``[B]`` float64: the number of trees of finite score of arc scores ``theta [B, N+1, N+1]``
    with ``lengths [B]`` words; exact integers where there are fewer than 2**53."""
    fin = torch.isfinite(theta.detach())
    zero_one = torch.zeros_like(theta.detach(), dtype=torch.float64).masked_fill(~fin, -math.inf)
    logc, _ = log_partition_and_marginals(zero_one, lengths, single_root)
    count = logc.exp()
    out = count.clone()
    for b in range(theta.shape[0]):
        if math.isfinite(float(count[b])) and float(count[b]) < 2.0**53 * 1.01:
            exact = _exact_count(fin[b], int(lengths[b]), single_root)
            if exact < 2**53:
                out[b] = float(exact)
    return out


def _bareiss(M: list[list[int]]) -> int:
    """Exact integer determinant (fraction-free Gaussian elimination, Bareiss 1968)."""
    a = [row[:] for row in M]
    n = len(a)
    sign, prev = 1, 1
    for k in range(n - 1):
        if a[k][k] == 0:
            swap = next((i for i in range(k + 1, n) if a[i][k] != 0), None)
            if swap is None:
                return 0
            a[k], a[swap] = a[swap], a[k]
            sign = -sign
        for i in range(k + 1, n):
            for j in range(k + 1, n):
                a[i][j] = (a[i][j] * a[k][k] - a[i][k] * a[k][j]) // prev
        prev = a[k][k]
    return sign * a[n - 1][n - 1] if n else 1


def _exact_count(fin: Tensor, n: int, single_root: bool) -> int:
    """The number of trees using allowed arcs of one example (``fin [N+1, N+1]`` bool), exactly."""
    f = fin[: n + 1, : n + 1].tolist()
    M = [[0] * n for _ in range(n)]
    for m in range(1, n + 1):
        for h in range(0, n + 1):
            if h != m and f[h][m]:
                if h > 0:
                    M[h - 1][m - 1] -= 1
                    M[m - 1][m - 1] += 1
                elif not single_root:
                    M[m - 1][m - 1] += 1
    if single_root:
        M[0] = [1 if f[0][m] else 0 for m in range(1, n + 1)]
    return _bareiss(M)
