"""The certified fast path of :mod:`structures.spanning._tree_partition`: the matrix-tree theorem with LAPACK
in float64 and an a-posteriori bound of its error.

Input: column-shifted arc weights in ``[0, 1]``, 0 where an arc does not exist, and which words
are real (padding words are isolated, hanging from the root with weight 1): ``W [B, N+1, N+1]``
(``W[b, h, m]``, row 0 the root) for :func:`marginals`; the words' block transposed and the
root's row apart for :func:`log_partition`. Each function returns ``ok [B]``: where the bound
certifies that every answer is within ``TOL`` (absolute) of the exact value; elsewhere the caller
moves on to the exact subtraction-free path (:mod:`structures.spanning._matrix_tree`).

LU of a column diagonally dominant M-matrix without row exchanges has backward error
``|E| <= γ |L||U|`` with ``γ = 4 n u`` (Higham, Thm. 9.3 and 8.5), and every solve with the factors
is the exact solve of such an ``M + E``. ``φ`` (:func:`_phi`) bounds the column sums of
``|L||U|``; the inverse ``X`` is entrywise non-negative.

On the CPU, where the optional extension is built, the same path runs in C instead
(``_matrix_tree_c.c``, one call per batch); this module is the path elsewhere (other devices, no
C compiler at install time).
"""

from __future__ import annotations

import torch
from torch import Tensor

TOL = 1e-9  # certified absolute error of the fast path (log Z and every marginal)
_U = 2.0**-53


def _phi(LU: Tensor) -> Tensor:
    """``φ [B, n] >=`` the column sums of ``|L||U|``. ``LU`` is overwritten by ``U`` (its strict
    lower part zeroed in place: no temporary of its size).

    Without row exchanges, the LU factors of a column diagonally dominant M-matrix have ``U > 0``
    on the diagonal, ``U <= 0`` above it, and columns of ``L`` (below the unit diagonal) of
    absolute sum at most 1 (every Schur complement stays column diagonally dominant); so
    ``φ_j = 2 Σ_k |U_kj| = 2 (2 U_jj - Σ_{k<=j} U_kj)``."""
    d = LU.diagonal(dim1=-2, dim2=-1)
    return (4.0 * d).sub_(LU.mT.tril_().sum(-1), alpha=2.0)  # LU.mT: row-major, row j = column j of U


def _lu_bounds(LU: Tensor, X: Tensor, extra: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """:func:`_phi`, the row maxima of ``X``, ``τ' = φ^T X`` and (with ``extra [B, n]``)
    ``extra^T X`` from the same matrix product. ``X`` is the inverse of an M-matrix: its largest
    entry in row m is ``X_mm`` (``X_mh / X_mm`` is the probability that h reaches m)."""
    phi = _phi(LU)
    rowmax = X.diagonal(dim1=-2, dim2=-1) * (1.0 + 1e-6)
    if extra is None:
        return phi, rowmax, (phi[:, None, :] @ X)[:, 0], None
    tau, y = (torch.stack([phi, extra], 1) @ X).unbind(1)
    return phi, rowmax, tau, y


def _factor(M: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(LU, piv, logdet, ok)`` of ``M [B, n, n]`` (column-major, overwritten by its factors) by
    LAPACK; ok where no row was exchanged. A pivot <= 0 makes ``logdet`` NaN or -inf: the callers
    certify only finite results."""
    B, n, _ = M.shape
    piv = torch.empty(B, n, dtype=torch.int32, device=M.device)
    info = torch.empty(B, dtype=torch.int32, device=M.device)
    LU, piv, info = torch.linalg.lu_factor_ex(M, out=(M, piv, info))
    ok = (piv == torch.arange(1, n + 1, dtype=piv.dtype, device=piv.device)).all(1)
    return LU, piv, LU.diagonal(dim1=-2, dim2=-1).log().sum(1), ok


def _solve(LU: Tensor, piv: Tensor, rhs: Tensor) -> Tensor:
    """``M^{-1}`` applied to the rows of ``rhs [B, k, n]`` (the column-major ``[B, n, k]``
    right-hand sides, transposed), in place: the solutions as ``[B, n, k]``, column-major (a
    product with a column-major inverse would be a slow strided matrix-vector product)."""
    return torch.linalg.lu_solve(LU, piv, rhs.mT, out=rhs.mT)


def _lu_inverse(M: Tensor, extra: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """``(LU, X, logdet, ok, y)``: :func:`_factor`, ``X = M^{-1}`` (column-major) and, with
    ``extra [B, n]``, one more right-hand side solved beside the identity: ``y = X extra``."""
    B, n, _ = M.shape
    LU, piv, logdet, ok = _factor(M)
    rhs = M.new_zeros(B, n if extra is None else n + 1, n)
    rhs.diagonal(dim1=-2, dim2=-1).fill_(1.0)
    if extra is not None:
        rhs[:, n] = extra
    sol = _solve(LU, piv, rhs)
    return LU, sol[..., :n], logdet, ok, (None if extra is None else sol[..., n])


def _laplacian(Wt: Tensor, root: Tensor, pad: Tensor | None, single_root: bool, out: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """``(M, c0, w_in)``: the matrix of the matrix-tree theorem, column-major ``[B, n, n]`` (stored
    transposed in ``out``, which may be ``Wt`` itself), from the words' weights transposed
    (``Wt[b, m, h]``: the arc h -> m, 0 on the diagonal) and the root's ``root [B, n]``.

    Multi-root: ``M = diag(colsum W) - W_words``, ``det M = Z``. Single root: ``K``, the Laplacian
    of the words' graph rooted at ``c0 [B, 1]`` (the most popular head; its row and column are the
    identity's), and ``w_in [B, n]`` the arcs into ``c0``: the trees rooted at word c weigh
    ``T_c = det K v_c`` with ``K v = w_in`` (``v_c0 = 1``). ``pad [B, n]``: the padding words
    (None: none). Column-major is the layout LAPACK factors and solves in place (a row-major
    matrix costs a transposing copy in ``lu_factor_ex`` and another in ``lu_solve``)."""
    B, n, _ = Wt.shape
    c0 = w_in = None
    if single_root:
        out_weights = Wt.sum(1)
        c0 = (out_weights if pad is None else out_weights.masked_fill_(pad, -1.0)).argmax(1)[:, None]
        w_in = Wt.gather(1, c0[:, :, None].expand(B, 1, n))[:, 0]
        d = Wt.sum(2)
    else:
        d = Wt.sum(2).add_(root)
    if pad is not None:
        d.add_(pad)
    Mt = torch.neg(Wt, out=out)
    Mt.diagonal(dim1=-2, dim2=-1).copy_(d)
    if single_root:
        Mt.scatter_(1, c0[:, :, None].expand(B, 1, n), 0.0).scatter_(2, c0[:, None, :].expand(B, n, 1), 0.0)
        Mt.diagonal(dim1=-2, dim2=-1).scatter_(1, c0, 1.0)
    return Mt.mT, c0, w_in


def _diagonal_bound(LU: Tensor) -> Tensor:
    """``[B, n] >= diag(X)`` from the factors in ``O(n^2)``: ``U^{-1} 1``, inflated by ``1 + 1e-6``
    (for the rounding of the factors). ``X_jj = Σ_k (U^{-1})_jk (L^{-1})_kj`` and ``0 <= L^{-1} <= 1``:
    column j of ``L^{-1}`` holds the probabilities that a chain moving down the columns of
    ``I - L`` (substochastic, see :func:`_phi`) from j visits k, which it does at most once."""
    ones = LU.new_ones(LU.shape[0], LU.shape[-1], 1)
    return torch.linalg.solve_triangular(LU, ones, upper=True)[..., 0] * (1.0 + 1e-6)


def log_partition(Wt: Tensor, root: Tensor, real: Tensor | None, single_root: bool) -> tuple[Tensor, Tensor]:
    """``(log Z [B], ok [B])`` from the LU factors alone (no inverse: ``O(n^3 / 3)``), for the words'
    weights transposed ``Wt [B, n, n]`` (``Wt[b, m, h]``: the arc h -> m; overwritten by the
    factors) and the root's ``root [B, n]`` (``real``: None where no word is padding).

    The bound of :func:`marginals` on ``log Z``, with the row maxima ``X_mm`` of ``X`` replaced by
    the bound of :func:`_diagonal_bound`: ``|Δ log det| <= γ Σ_j X_jj φ_j``. Single root,
    ``Z = det K q`` with ``q = r_c0 + Σ_c r_c v_c``: ``|Δv_c| <= γ (X |L||U| v)_c <= γ X_cc (φ·v)``,
    so ``|Δq| <= γ (Σ_c r_c X_cc)(φ·v)``.
    """
    n = Wt.shape[-1]
    gam = 4.0 * n * _U
    M, c0, w_in = _laplacian(Wt, root, None if real is None else ~real, single_root, Wt)
    LU, piv, logdet, ok = _factor(M)
    if single_root:
        v = _solve(LU, piv, w_in[:, None, :])[..., 0]
        rr = root.scatter(1, c0, 0.0)
        q = root.gather(1, c0)[:, 0] + (rr * v).sum(1)  # (v_c0 = 0 here: rr_c0 = 0 anyway)
        logZ = logdet + q.log()
        err = 4 * n * _U * (logdet.abs() + q.log().abs())
    else:
        logZ, err = logdet, 4 * n * _U * logdet.abs()
    phi = _phi(LU)
    xd = _diagonal_bound(LU)
    err = err + gam * (phi * xd).sum(1)
    if single_root:
        err = err + gam * (rr * xd).sum(1) * (phi * v).sum(1) / q
    return logZ, ok & torch.isfinite(logZ) & (err <= TOL)


def marginals(W: Tensor, real: Tensor, single_root: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Koo et al.'s formulas in float64 with LAPACK, and a certificate: ``(log Z(W), μ, ok [B])``,
    ``ok`` where ``log Z`` and every marginal are certified within ``TOL`` (absolute). ``W`` is
    overwritten by ``μ``: the marginals are written where the weights were (a fresh ``[B, n, n]``
    buffer costs more in page faults than the arithmetic on it), so only the Laplacian and its
    inverse are new; the inverse is overwritten too, by Koo's differences.

    Error analysis (first order; where the certificate passes the second-order terms are of the
    order of ``TOL``^2): LU without row exchanges and the triangular solves give every column of
    ``X`` as the exact inverse of ``M + E`` with ``|E| <= γ |L||U|``, ``γ = 4 n u`` (Higham,
    Thm. 9.3 and 8.5); so ``|ΔX_mh| <= γ (X |L||U| X)_mh <= γ rowmax(X)_m τ'_h`` with ``τ' = φ^T X``
    and ``φ`` the column sums of ``|L||U|`` (:func:`_lu_bounds`), and ``|Δ log det| <= γ Σ_j
    rowmax_j φ_j``. These are propagated through Koo's formulas with ``W <= 1`` (shifted columns),
    plus the rounding of the formulas themselves. ``O(n^2)`` work besides LAPACK.
    """
    B, N1, _ = W.shape
    n = N1 - 1
    pad = ~real
    Ww = W[:, 1:, 1:]  # becomes the words' marginals
    r = W[:, 0, 1:]  # becomes the root's marginals
    gam = 4.0 * n * _U
    M, c0, w_in = _laplacian(Ww.mT, r, pad, single_root, W.new_empty(B, n, n))
    if not single_root:
        LU, X, logdet, ok, _ = _lu_inverse(M)
        phi, rowmax, tau, _ = _lu_bounds(LU, X)
        dX = X.diagonal(dim1=-2, dim2=-1).clone()
        r.mul_(dX)
        torch.sub(dX[:, None, :], X.mT, out=X.mT)  # [h, m]: X_mm - X_mh
        Ww.mul_(X.mT).clamp_min_(0.0)
        err_z = gam * (rowmax * phi).sum(1) + 4 * n * _U * logdet.abs()
        err_mu = rowmax * (gam * (tau + tau.amax(1, keepdim=True)) + 4 * _U)
        logZ = logdet
    else:
        # the words rooted at c0, then every root by a rank-one correction
        col0 = c0[:, None, :].expand(B, n, 1)
        LU, X, logdet, ok, v = _lu_inverse(M, w_in)
        v.scatter_(1, c0, 1.0)
        rr = r.scatter(1, c0, 0.0)
        r0 = r.gather(1, c0)[:, 0]
        phi, rowmax, tau, u = _lu_bounds(LU, X, rr)  # u = r^T X (0 at c0)
        q = r0 + (u * w_in).sum(1)
        qc = q[:, None]
        vq = v / qc
        sig_w = (tau * w_in).sum(1, keepdim=True)
        rho_r = (rr * rowmax).sum(1, keepdim=True)
        dv = gam * rowmax * sig_w
        du = gam * rho_r * tau
        dq = gam * rho_r * sig_w
        umax = u.amax(1, keepdim=True)
        dumax = du.amax(1, keepdim=True)
        taumax = tau.amax(1, keepdim=True)
        # (the sums u, v, q also carry their own rounding: relative n u, inside γ; the formula's
        # five roundings, each below u (2 rowmax + 2 vq umax), are within 8 u rowmax + 2 γ vq umax)
        rel_q = dq / qc + 2 * gam  # relative error of 1 / q, with the rounding of the division
        uu = u + umax
        err_w = rowmax * (gam * (tau + taumax) + 8 * _U) + (dv * uu + v * (dumax + du + uu * rel_q)) / qc
        err_c0 = (dumax + umax * rel_q) / qc
        err_root = r * (dv + v * rel_q) / qc
        err_mu = torch.maximum(err_w.scatter_(1, c0, err_c0), err_root)
        err_z = gam * (rowmax * phi).sum(1) + dq[:, 0] / q + 4 * n * _U * (logdet.abs() + q.log().abs())
        logZ = logdet + q.log()
        # X_mm - X_mh + vq_m (u_h - u_m), as (X_mm - vq_m u_m) - X_mh + u_h vq_m, in X's place
        dX = X.diagonal(dim1=-2, dim2=-1)
        torch.sub((dX - vq * u)[:, None, :], X.mT, out=X.mT)
        X.mT.addcmul_(u[:, :, None], vq[:, None, :])
        r.mul_(vq)
        Ww.mul_(X.mT).scatter_(2, col0, (w_in * u / qc)[:, :, None]).clamp_min_(0.0)
    err_mu = err_mu.masked_fill(pad, 0.0).amax(1)
    # rowmax and tau are NaN or inf wherever X is, so the bounds also catch a failed inverse
    ok &= torch.isfinite(logZ) & (err_z <= TOL) & (err_mu <= TOL)
    return logZ, W, ok
