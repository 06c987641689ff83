"""The Triton kernel of :mod:`._certified_triton`: the certified multi-root path of
:func:`._certified.marginals` for one example per program. Imported only when a run takes it (this
module imports Triton).

The example's matrix lives in registers as a ``[BLOCK, BLOCK]`` tile (``BLOCK``: n rounded up to a
power of two; the rows and columns past n are the identity's and take no part in the sums). LU
without row exchanges, then the inverse by a forward and a back substitution of the identity's
columns, each a loop of rank-one updates over the tile: the operations LAPACK does, in another
order of the sums, so the a-posteriori bound of :mod:`._certified` (Higham, Thm. 9.3 and 8.5: any
order) certifies them alike.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _entry(tile, i, j, rows, cols):
    """``tile[i, j]``."""
    return tl.sum(tl.sum(tl.where((rows[:, None] == i) & (cols[None, :] == j), tile, 0.0), axis=1), axis=0)


@triton.jit(do_not_specialize=["n"])
def multi_root(w_ptr, real_ptr, logz_ptr, ok_ptr, n, TOL: tl.constexpr, UNIT: tl.constexpr, BLOCK: tl.constexpr):
    """Example ``program_id(0)``: reads its weights ``W [n+1, n+1]`` (row 0 the root; float64, column
    shifted, 0 where no arc) and ``real [n]`` (int8), writes ``log det M`` to ``logz_ptr``, the
    marginals in W's place and whether the bound certifies them within ``TOL`` to ``ok_ptr``
    (``UNIT``: the unit roundoff of float64)."""
    b = tl.program_id(0)
    rows = tl.arange(0, BLOCK)
    cols = tl.arange(0, BLOCK)
    in_r = rows < n
    in_c = cols < n
    inside = in_r[:, None] & in_c[None, :]
    n1 = n + 1
    base = w_ptr + b.to(tl.int64) * n1 * n1
    unit = tl.full([], UNIT, tl.float64)
    tol = tl.full([], TOL, tl.float64)
    gam = 4.0 * n.to(tl.float64) * unit
    w = tl.load(base + (1 + rows[:, None]) * n1 + 1 + cols[None, :], mask=inside, other=0.0)  # [h, m]
    root = tl.load(base + 1 + cols, mask=in_c, other=0.0)
    real = tl.load(real_ptr + b * n + cols, mask=in_c, other=1)
    diag = rows[:, None] == cols[None, :]
    # M = diag(colsum W + padding) - W_words, the identity past n
    d = tl.sum(w, axis=0) + root + tl.where(real == 0, 1.0, 0.0)
    d = tl.where(in_c, d, 1.0)
    a = tl.where(diag, d[None, :], -w)
    for k in range(0, n):  # LU, the multipliers below the diagonal
        row = tl.sum(tl.where(rows[:, None] == k, a, 0.0), axis=0)
        col = tl.sum(tl.where(cols[None, :] == k, a, 0.0), axis=1)
        pivot = tl.sum(tl.where(cols == k, row, 0.0), axis=0)
        mult = tl.where(rows > k, col / pivot, 0.0)
        a = a - mult[:, None] * tl.where(cols > k, row, 0.0)[None, :]
        a = tl.where((rows[:, None] > k) & (cols[None, :] == k), mult[:, None], a)
    x = tl.where(diag, 1.0, 0.0).to(tl.float64)
    for k in range(0, n):  # L Y = I
        yk = tl.sum(tl.where(rows[:, None] == k, x, 0.0), axis=0)
        lk = tl.sum(tl.where((cols[None, :] == k) & (rows[:, None] > k), a, 0.0), axis=1)
        x = x - lk[:, None] * yk[None, :]
    for j in range(0, n):  # U X = Y
        k = n - 1 - j
        ukk = _entry(a, k, k, rows, cols)
        xk = tl.sum(tl.where(rows[:, None] == k, x, 0.0), axis=0) / ukk
        x = tl.where(rows[:, None] == k, xk[None, :], x)
        uk = tl.sum(tl.where((cols[None, :] == k) & (rows[:, None] < k), a, 0.0), axis=1)
        x = x - uk[:, None] * xk[None, :]
    u_diag = tl.sum(tl.where(diag, a, 0.0), axis=0)  # [j]
    logdet = tl.sum(tl.where(in_c, tl.log(u_diag), 0.0), axis=0)
    # φ_j = 2 Σ_k |U_kj| = 4 U_jj - 2 Σ_{k <= j} U_kj; rowmax_m = X_mm; τ'_h = Σ_j φ_j X_jh
    phi = 4.0 * u_diag - 2.0 * tl.sum(tl.where(rows[:, None] <= cols[None, :], a, 0.0), axis=0)
    x_diag = tl.sum(tl.where(diag, x, 0.0), axis=0)  # [m]
    rowmax = x_diag * (1.0 + 1e-6)
    tau = tl.sum(tl.where(in_r[:, None], phi[:, None] * x, 0.0), axis=0)  # [h]
    err_z = gam * tl.sum(tl.where(in_c, rowmax * phi, 0.0), axis=0) + gam * tl.abs(logdet)
    tau_max = tl.max(tl.where(in_c, tau, -float("inf")), axis=0)
    err_mu = rowmax * (gam * (tau + tau_max) + 4.0 * unit)
    err_mu = tl.max(tl.where(in_c & (real != 0), err_mu, 0.0), axis=0)
    ok = (logdet == logdet) & (tl.abs(logdet) < float("inf")) & (err_z <= tol) & (err_mu <= tol)
    # μ_hm = W_hm (X_mm - X_mh), the root's r_m X_mm
    mu = tl.maximum(w * (x_diag[None, :] - tl.trans(x)), 0.0)
    tl.store(base + (1 + rows[:, None]) * n1 + 1 + cols[None, :], mu, mask=inside)
    tl.store(base + 1 + cols, root * x_diag, mask=in_c)
    tl.store(logz_ptr + b, logdet)
    tl.store(ok_ptr + b, ok.to(tl.int8))
