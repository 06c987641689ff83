"""The matrix-tree theorem in mpmath at hundreds of digits: an independent reference for
:class:`structures.NonProjectiveDependencyCRF` at any score scale (used by
tests/test_nonprojective.py and benchmarks/nonprojective.py; needs the ``mpmath`` package)."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def high_precision_reference(theta: Tensor, single_root: bool = False, dps: int = 700) -> tuple[float, Tensor]:
    """(log Z, marginals ``[N+1, N+1]``) of one example ``theta [N+1, N+1]`` by the matrix-tree theorem
    (Koo et al. 2007) in mpmath at ``dps`` digits: a slow, independent check of the fast paths at any
    score scale (needs the ``mpmath`` package)."""
    import mpmath

    with mpmath.workdps(dps):
        n = theta.shape[-1] - 1
        W = [[mpmath.exp(mpmath.mpf(float(theta[h, m]))) if (m > 0 and h != m and math.isfinite(float(theta[h, m])))
              else mpmath.mpf(0) for m in range(n + 1)] for h in range(n + 1)]
        L = mpmath.zeros(n, n)
        for m in range(1, n + 1):
            for h in range(n + 1):
                if h == m:
                    continue
                if h > 0:
                    L[h - 1, m - 1] -= W[h][m]
                if h > 0 or not single_root:
                    L[m - 1, m - 1] += W[h][m]
        if single_root:  # Koo et al. 2007: the first row replaced by the root scores
            for m in range(1, n + 1):
                L[0, m - 1] = W[0][m]
        X = L**-1
        logz = float(mpmath.log(mpmath.det(L)))
        mu = torch.zeros(n + 1, n + 1, dtype=torch.float64)
        for m in range(1, n + 1):
            for h in range(n + 1):
                if h == m:
                    continue
                if not single_root:
                    v = W[h][m] * (X[m - 1, m - 1] - (X[m - 1, h - 1] if h else 0))
                elif h == 0:
                    v = W[0][m] * X[m - 1, 0]
                else:
                    v = W[h][m] * ((X[m - 1, m - 1] if m > 1 else 0) - (X[m - 1, h - 1] if h > 1 else 0))
                mu[h, m] = float(v)
        return logz, mu
