"""The Triton kernel of :mod:`._certified_triton`: the certified path of :func:`._certified.marginals`
(multi-root and single root) for one example per program. Imported only when a run takes it (this
module imports Triton).

The example's matrix lives in registers as a ``[BLOCK, BLOCK]`` tile (``BLOCK``: n rounded up to a
power of two; the rows and columns past n are the identity's and take no part in the sums). LU
without row exchanges, then the inverse by a forward and a back substitution of the identity's
columns (and, single root, of the arcs into ``c0``), each a loop of rank-one updates over the tile:
the operations LAPACK does, in another order of the sums, so the a-posteriori bound of
:mod:`._certified` (Higham, Thm. 9.3 and 8.5: any order) certifies them alike.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _entry(tile, i, j, rows, cols):
    """``tile[i, j]``."""
    return tl.sum(tl.sum(tl.where((rows[:, None] == i) & (cols[None, :] == j), tile, 0.0), axis=1), axis=0)


@triton.jit(do_not_specialize=["n"])
def certified(w_ptr, real_ptr, logz_ptr, ok_ptr, n, SINGLE_ROOT: tl.constexpr, MARGINALS: tl.constexpr,
              TOL: tl.constexpr, UNIT: tl.constexpr, BLOCK: tl.constexpr):
    """Example ``program_id(0)``: reads its weights ``W [n+1, n+1]`` (row 0 the root; float64, column
    shifted, 0 where no arc) and ``real [n]`` (int8), writes ``log Z`` (less the shifts) to
    ``logz_ptr``, the marginals in W's place and whether the bound certifies them within ``TOL`` to
    ``ok_ptr`` (``UNIT``: the unit roundoff of float64). The formulas and bounds are those of
    :func:`._certified.marginals`, multi-root or (``SINGLE_ROOT``) rooted at the most popular head
    ``c0`` with a rank-one correction. Without ``MARGINALS``, log Z alone: certified by the bound on
    log Z only, no marginals written."""
    b = tl.program_id(0)
    rows = tl.arange(0, BLOCK)
    cols = tl.arange(0, BLOCK)
    in_r = rows < n
    in_c = cols < n
    inside = in_r[:, None] & in_c[None, :]
    diag = rows[:, None] == cols[None, :]
    n1 = n + 1
    base = w_ptr + b.to(tl.int64) * n1 * n1
    unit = tl.full([], UNIT, tl.float64)
    tol = tl.full([], TOL, tl.float64)
    gam = 4.0 * n.to(tl.float64) * unit
    w = tl.load(base + (1 + rows[:, None]) * n1 + 1 + cols[None, :], mask=inside, other=0.0)  # [h, m]
    root = tl.load(base + 1 + cols, mask=in_c, other=0.0)
    real = tl.load(real_ptr + b * n + cols, mask=in_c, other=1) != 0
    pad = tl.where(real, 0.0, 1.0)
    if SINGLE_ROOT:
        # K: the words' Laplacian with c0's row and column the identity's; T_c = det K v_c, K v = w_in
        real_r = tl.load(real_ptr + b * n + rows, mask=in_r, other=1) != 0
        out_w = tl.where(in_r, tl.where(real_r, tl.sum(w, axis=1), -1.0), -float("inf"))
        c0 = tl.argmax(out_w, axis=0)
        w_in = tl.sum(tl.where(cols[None, :] == c0, w, 0.0), axis=1)  # [h]: the arcs into c0
        d = tl.where(in_c, tl.sum(w, axis=0) + pad, 1.0)
        a = tl.where(diag, d[None, :], -w)
        a = tl.where((rows[:, None] == c0) | (cols[None, :] == c0), tl.where(diag, 1.0, 0.0), a)
    else:
        # M = diag(colsum W + root + padding) - W_words
        d = tl.where(in_c, tl.sum(w, axis=0) + root + pad, 1.0)
        a = tl.where(diag, d[None, :], -w)
        w_in = tl.zeros([BLOCK], tl.float64)
    v = w_in
    for k in range(0, n):  # LU, the multipliers below the diagonal
        row = tl.sum(tl.where(rows[:, None] == k, a, 0.0), axis=0)
        col = tl.sum(tl.where(cols[None, :] == k, a, 0.0), axis=1)
        pivot = tl.sum(tl.where(cols == k, row, 0.0), axis=0)
        mult = tl.where(rows > k, col / pivot, 0.0)
        a = a - mult[:, None] * tl.where(cols > k, row, 0.0)[None, :]
        a = tl.where((rows[:, None] > k) & (cols[None, :] == k), mult[:, None], a)
    x = tl.where(diag, 1.0, 0.0).to(tl.float64)
    for k in range(0, n):  # L [X | v] = [I | w_in]
        lk = tl.sum(tl.where((cols[None, :] == k) & (rows[:, None] > k), a, 0.0), axis=1)
        x = x - lk[:, None] * tl.sum(tl.where(rows[:, None] == k, x, 0.0), axis=0)[None, :]
        v = v - lk * tl.sum(tl.where(rows == k, v, 0.0), axis=0)
    for j in range(0, n):  # U [X | v] = ...
        k = n - 1 - j
        ukk = _entry(a, k, k, rows, cols)
        uk = tl.sum(tl.where((cols[None, :] == k) & (rows[:, None] < k), a, 0.0), axis=1)
        xk = tl.sum(tl.where(rows[:, None] == k, x, 0.0), axis=0) / ukk
        x = tl.where(rows[:, None] == k, xk[None, :], x) - uk[:, None] * xk[None, :]
        vk = tl.sum(tl.where(rows == k, v, 0.0), axis=0) / ukk
        v = tl.where(rows == k, vk, v) - uk * vk
    w = tl.load(base + (1 + rows[:, None]) * n1 + 1 + cols[None, :], mask=inside, other=0.0)  # again: not live in the loops
    u_diag = tl.sum(tl.where(diag, a, 0.0), axis=0)  # [j]
    logdet = tl.sum(tl.where(in_c, tl.log(u_diag), 0.0), axis=0)
    # φ_j = 2 Σ_k |U_kj| = 4 U_jj - 2 Σ_{k <= j} U_kj; rowmax_m = X_mm; τ'_h = Σ_j φ_j X_jh
    phi = 4.0 * u_diag - 2.0 * tl.sum(tl.where(rows[:, None] <= cols[None, :], a, 0.0), axis=0)
    x_diag = tl.sum(tl.where(diag, x, 0.0), axis=0)  # [m]
    rowmax = x_diag * tl.full([], 1.0 + 1e-6, tl.float64)
    tau = tl.sum(tl.where(in_r[:, None], phi[:, None] * x, 0.0), axis=0)  # [h]
    tau_max = tl.max(tl.where(in_c, tau, -float("inf")), axis=0)
    err_z = gam * tl.sum(tl.where(in_c, rowmax * phi, 0.0), axis=0)
    if SINGLE_ROOT:
        v = tl.where(rows == c0, 1.0, v)
        rr = tl.where(cols == c0, 0.0, root)
        r0 = tl.sum(tl.where(cols == c0, root, 0.0), axis=0)
        u = tl.sum(tl.where(in_r[:, None], rr[:, None] * x, 0.0), axis=0)  # [h]: r^T X (0 at c0)
        q = r0 + tl.sum(u * w_in, axis=0)
        vq = v / q
        sig_w = tl.sum(tau * w_in, axis=0)
        rho_r = tl.sum(rr * rowmax, axis=0)
        dv = gam * rowmax * sig_w
        du = gam * rho_r * tau
        dq = gam * rho_r * sig_w
        umax = tl.max(tl.where(in_c, u, -float("inf")), axis=0)
        dumax = tl.max(tl.where(in_c, du, -float("inf")), axis=0)
        rel_q = dq / q + 2.0 * gam
        uu = u + umax
        err_w = rowmax * (gam * (tau + tau_max) + 8.0 * unit) + (dv * uu + v * (dumax + du + uu * rel_q)) / q
        err_c0 = (dumax + umax * rel_q) / q
        err_mu = tl.maximum(tl.where(cols == c0, err_c0, err_w), root * (dv + v * rel_q) / q)
        err_z = err_z + dq / q + gam * (tl.abs(logdet) + tl.abs(tl.log(q)))
        logz = logdet + tl.log(q)
        # μ_hm = W_hm ((X_mm - vq_m u_m) - X_mh + u_h vq_m), into c0: W_hc0 u_h / q; the root's r_m vq_m
        t = ((x_diag - vq * u)[None, :] - tl.trans(x)) + u[:, None] * vq[None, :]
        mu = tl.where(cols[None, :] == c0, (w_in * u / q)[:, None], w * t)
        mu_root = root * vq
    else:
        err_mu = rowmax * (gam * (tau + tau_max) + 4.0 * unit)
        err_z = err_z + gam * tl.abs(logdet)
        logz = logdet
        # μ_hm = W_hm (X_mm - X_mh), the root's r_m X_mm
        mu = w * (x_diag[None, :] - tl.trans(x))
        mu_root = root * x_diag
    ok = (logz == logz) & (tl.abs(logz) < float("inf")) & (err_z <= tol)
    if MARGINALS:
        ok = ok & (tl.max(tl.where(in_c & real, err_mu, 0.0), axis=0) <= tol)
        tl.store(base + (1 + rows[:, None]) * n1 + 1 + cols[None, :], tl.maximum(mu, 0.0), mask=inside)
        tl.store(base + 1 + cols, mu_root, mask=in_c)
    tl.store(logz_ptr + b, logz)
    tl.store(ok_ptr + b, ok.to(tl.int8))
