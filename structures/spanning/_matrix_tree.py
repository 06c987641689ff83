"""Exact, subtraction-free matrix-tree computations (the exact path of :mod:`structures.spanning._tree_partition`).

Graph convention: words ``0..n-1`` (here 0-based), ``A[b, h, m] >= 0`` the weight of the arc
head ``h`` -> modifier ``m`` (zero diagonal), ``g[b, m] >= 0`` the *margin* of word ``m`` (its
weight to an absorbing root) and ``s[b, m] >= 0`` its *source* weight (the weight of the arc
root -> m that the marginals are computed for). The Laplacian is

    M = diag(g + colsum(A)) - A,        1^T M = g^T,

an M-matrix whose determinant is the total weight of the spanning arborescences rooted at the
root (Tutte's directed matrix-tree theorem, Koo et al. 2007 for multi-root trees: ``g = s = root
scores``). With ``g = 0`` and ``s = root scores`` the same code computes single-root trees (see
:func:`leave_one_out`).

Why subtraction-free
--------------------
Gaussian elimination of M computes the pivots as ``d_j - A_jk A_kj / d_k``: a difference that
cancels catastrophically when the graph has cycles much heavier than its ways to the root (at
large score scales every peer returns NaN or marginals off by O(1)). Grassmann, Taksar & Heyman
(1985) observed that the Schur complement of such a Laplacian is again a Laplacian,

    A'_ij = A_ij + A_ik A_kj / d_k,      g'_j = g_j + g_k A_kj / d_k,      d'_j = g'_j + sum_i A'_ij,

so that the pivots can be recomputed from the margins without any subtraction. The blocked form
used here eliminates a set ``E`` of words at once, keeping ``K``:

    A'_KK = A_KK + A_KE Y A_EK,     g'_K = g_K + (g_E^T Y) A_EK,     Y = M_EE^{-1} >= 0,

where ``M_EE`` is itself such a Laplacian (margins ``g_E + colsum(A_KE)``) inverted by the same
recursion (:func:`inverse`). Every quantity is a sum of products of non-negative numbers and
quotients of them: each is computed with a relative error of a small multiple of n u, however
ill-conditioned M is, and the products are batched matrix products (BLAS-3).

The marginals without cancellation
----------------------------------
Koo's formula ``mu_hm = W_hm (X_mm - X_mh)`` (X = M^{-1}) subtracts two numbers that are both
of the order of (cycle weight / tree weight). Instead, with ``beta^{(m)} = s_S^T M_SS^{-1}``,
``S`` = every word but ``m`` (the probability that a walk from h along heads reaches the root
before m),

    mu_hm  proportional to  W_hm beta^{(m)}_h       (beta_root = 1),

normalised over the heads h of m. :func:`leave_one_out` computes every ``beta^{(m)}`` by divide and
conquer: at each level, every group of words is split in halves, and each half is kept while the
other is eliminated (one batched :func:`inverse` of all the halves of the level); the halves are
then processed as independent groups, down to single words, and the betas are assembled on the
way up (``beta_E = s_E^T Y + beta_K A_KE Y``). Work: about (4/3) n^3 multiply-adds, plus the
inverses (n^3 / 3); the levels run in sequence, the groups of a level in one batch.

Two arithmetic backends run the same code: :data:`LIN` (float64, after shifting each column's
scores by their max; exact as long as no needed quantity leaves float64's range, which the caller
checks) and :data:`LOG` (log space, for any range).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# ------------------------------------------------------------------------------------- backends


class _Lin:
    """Non-negative reals in float64."""

    name = "lin"
    zero = 0.0

    @staticmethod
    def mm(a: Tensor, b: Tensor) -> Tensor:
        return a @ b

    @staticmethod
    def add(a: Tensor, b: Tensor) -> Tensor:
        return a + b

    @staticmethod
    def colsum(a: Tensor) -> Tensor:
        return a.sum(-2)

    @staticmethod
    def div(a: Tensor, b: Tensor) -> Tensor:
        return a / b

    @staticmethod
    def mul(a: Tensor, b: Tensor) -> Tensor:
        return a * b

    @staticmethod
    def log(a: Tensor) -> Tensor:
        return a.log()

    @staticmethod
    def sum3(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
        return a + b + c


class _Log:
    """Non-negative reals as their logarithms (any range)."""

    name = "log"
    zero = -math.inf

    @staticmethod
    def mm(a: Tensor, b: Tensor) -> Tensor:
        # log sum_k exp(a_ik + b_kj), in slabs of rows to bound the [i, k, j] temporary
        rows = max(1, (1 << 24) // max(1, a.shape[-1] * b.shape[-1] * max(1, a[..., 0, 0].numel())))
        outs = []
        for i in range(0, a.shape[-2], rows):
            t = a[..., i : i + rows, :, None] + b[..., None, :, :]
            outs.append(torch.logsumexp(t, -2))
        return torch.cat(outs, -2) if len(outs) > 1 else outs[0]

    @staticmethod
    def add(a: Tensor, b: Tensor) -> Tensor:
        return torch.logaddexp(a, b)

    @staticmethod
    def colsum(a: Tensor) -> Tensor:
        return torch.logsumexp(a, -2)

    @staticmethod
    def div(a: Tensor, b: Tensor) -> Tensor:
        return a - b

    @staticmethod
    def mul(a: Tensor, b: Tensor) -> Tensor:
        return a + b

    @staticmethod
    def log(a: Tensor) -> Tensor:
        return a

    @staticmethod
    def sum3(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
        return torch.logsumexp(torch.stack([a, b, c]), 0)


LIN = _Lin()
LOG = _Log()


def _zero_diag(a: Tensor, ops) -> Tensor:
    n = a.shape[-1]
    eye = torch.eye(n, dtype=torch.bool, device=a.device)
    return a.masked_fill(eye, ops.zero)


# ------------------------------------------------------------------------------------- inverse


_BASE = 16  # blocks up to this size are eliminated one word at a time (linear backend)


def _inverse_unblocked(A: Tensor, g: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`inverse` of a small block in float64: GTH elimination one word at a time (pivot
    ``d_k = g_k + Σ_{i>k} A_ik`` from the margins, never by a subtraction), ``M = L D U`` with
    unit triangular ``L = I - Lo``, ``U = I - Up`` (``Lo, Up >= 0``), and
    ``M^{-1} = (I - Up)^{-1} D^{-1} (I - Lo)^{-1}`` by triangular solves, which subtract only
    non-positive numbers (additions of non-negative ones)."""
    s = A.shape[-1]
    A = A.clone()
    g = g.clone()
    d = torch.empty_like(g)
    for k in range(s):
        col = A[..., k + 1 :, k]
        dk = g[..., k] + col.sum(-1)
        d[..., k] = dk
        if k + 1 < s:
            rd = A[..., k, k + 1 :] / dk[..., None]
            A[..., k + 1 :, k + 1 :].addcmul_(col[..., :, None], rd[..., None, :])
            g[..., k + 1 :].addcmul_(g[..., k : k + 1], rd)
    eye = torch.eye(s, dtype=A.dtype, device=A.device)
    low = torch.tril(A, -1) / d[..., None, :]  # Lo[i, k] = A^(k)_ik / d_k
    up = torch.triu(A, 1) / d[..., :, None]  # Up[k, j] = A^(k)_kj / d_k
    Linv = torch.linalg.solve_triangular(eye - low, eye.expand_as(A), upper=False, unitriangular=True)
    Uinv = torch.linalg.solve_triangular(eye - up, eye.expand_as(A), upper=True, unitriangular=True)
    Y = (Uinv / d[..., None, :]) @ Linv
    return Y, d.log().sum(-1), d.amin(-1)


def inverse(A: Tensor, g: Tensor, ops=LIN) -> tuple[Tensor, Tensor, Tensor]:
    """``(Y, logdet, low)`` for the Laplacian ``M = diag(g + colsum A) - A`` of ``A [b, s, s]``
    (zero diagonal), ``g [b, s]``, ``s`` a power of two: ``Y = M^{-1}`` (entrywise >= 0),
    ``log det M``, and the smallest 2x2 determinant met (for the caller's range check).

    Recursive block elimination: invert the leading half (its margins include the arcs from the
    trailing half), form the trailing Schur complement as a Laplacian (off-diagonals and margins
    updated by sums of products, the diagonal never formed), invert it, assemble. No subtraction.
    Blocks of at most ``_BASE`` words (linear backend) are eliminated one word at a time
    (:func:`_inverse_unblocked`); 2x2 blocks have a closed form (``det = g1 g2 + g1 a12 + g2 a21``).
    """
    s = A.shape[-1]
    if ops is LIN and 2 < s <= _BASE:
        return _inverse_unblocked(A, g)
    if s == 1:
        return ops.div(torch.zeros_like(g).fill_(0.0 if ops is LOG else 1.0), g)[..., None], ops.log(g[..., 0]), (
            g[..., 0] if ops is LIN else g[..., 0].exp()
        )
    if s == 2:
        a12, a21 = A[..., 0, 1], A[..., 1, 0]
        g1, g2 = g[..., 0], g[..., 1]
        det = ops.sum3(ops.mul(g1, g2), ops.mul(g1, a12), ops.mul(g2, a21))
        adj = torch.stack([torch.stack([ops.add(g2, a12), a12], -1), torch.stack([a21, ops.add(g1, a21)], -1)], -2)
        return ops.div(adj, det[..., None, None]), ops.log(det), (det if ops is LIN else det.exp())
    h = s // 2
    A11, A12, A21, A22 = A[..., :h, :h], A[..., :h, h:], A[..., h:, :h], A[..., h:, h:]
    Y1, ld1, lo1 = inverse(A11, ops.add(g[..., :h], ops.colsum(A21)), ops)
    P = ops.mm(Y1, A12)  # M11^{-1} A12
    S = _zero_diag(ops.add(A22, ops.mm(A21, P)), ops)
    g2 = ops.add(g[..., h:], ops.mm(g[..., None, :h], P)[..., 0, :])
    Y2, ld2, lo2 = inverse(S, g2, ops)
    Q = ops.mm(A21, Y1)
    X12 = ops.mm(P, Y2)
    X21 = ops.mm(Y2, Q)
    X11 = ops.add(Y1, ops.mm(X12, Q))
    Y = torch.cat([torch.cat([X11, X12], -1), torch.cat([X21, Y2], -1)], -2)
    return Y, ld1 + ld2, torch.minimum(lo1, lo2)


# ------------------------------------------------------------------------------------- leave one out


def leave_one_out(A: Tensor, g: Tensor, s: Tensor | None, ops=LIN, live: Tensor | None = None):
    """Every word's view of the graph with all other words eliminated.

    ``A [b, n, n]``, ``g [b, n]`` margins, ``s [b, n]`` sources (``None``: the same as ``g``), n a
    power of two. Returns a dict with

    * ``beta [b, n, n]``: ``beta[m, h] = (s_S^T M_SS^{-1})_h`` for ``S`` = all words but m
      (0 at h = m): multi-root (``s = g``) the probability that the walk from h along heads reaches
      the root before m; single-root (``g = 0``) its first-order coefficient in the root scores;
    * ``margin [b, n]``: the margin of m once every other word is eliminated (``1 / X_mm``);
    * ``logminor [b, n]``: ``log det`` of M without row and column m (with ``g = 0``: the log of
      the total weight of the arborescences of the words rooted at m);
    * ``ymax [b]``, ``low [b]``: the largest inverse entry and smallest 2x2 determinant met
      (range check of the linear backend).

    ``log det M = logminor[m] + log margin[m]`` for every m.

    ``live [b, n]`` (optional): the words whose results are wanted; the range statistics ignore
    the groups without one (with ``g = 0`` the groups of padding words are singular, harmlessly:
    the groups of a level are independent).
    """
    b, n, _ = A.shape
    same = s is None
    gs = g[:, None, None, :] if same else torch.stack([g, s], 1)[:, None]  # [b, G, c, n]
    A = A[:, None]  # [b, G, n, n]
    logminor = torch.zeros(b, 1, dtype=A.dtype, device=A.device)
    ymax = torch.zeros(b, dtype=A.dtype, device=A.device) if ops is LIN else None
    low = torch.full((b,), math.inf, dtype=A.dtype, device=A.device)
    saved = []
    size = n
    while size > 1:
        h = size // 2
        G = A.shape[1]
        A11, A12, A21, A22 = A[..., :h, :h], A[..., :h, h:], A[..., h:, :h], A[..., h:, h:]
        gs1, gs2 = gs[..., :h], gs[..., h:]
        # child 0 keeps the first half and eliminates the second; child 1 the reverse
        AKK = torch.stack([A11, A22], 2).reshape(b, 2 * G, h, h)
        AKE = torch.stack([A12, A21], 2).reshape(b, 2 * G, h, h)
        AEK = torch.stack([A21, A12], 2).reshape(b, 2 * G, h, h)
        AEE = torch.stack([A22, A11], 2).reshape(b, 2 * G, h, h)
        gsK = torch.stack([gs1, gs2], 2).reshape(b, 2 * G, -1, h)
        gsE = torch.stack([gs2, gs1], 2).reshape(b, 2 * G, -1, h)
        Y, ld, lo = inverse(AEE.reshape(-1, h, h), ops.add(gsE[:, :, 0], ops.colsum(AKE)).reshape(-1, h), ops)
        Y = Y.reshape(b, 2 * G, h, h)
        lo = lo.reshape(b, 2 * G)
        ym = Y.reshape(b, 2 * G, -1).amax(-1) if ymax is not None else None
        if live is not None:
            dead = ~live.reshape(b, 2 * G, h).any(-1)
            lo = lo.masked_fill(dead, math.inf)
            ym = ym.masked_fill(dead, 0.0) if ym is not None else None
        low = torch.minimum(low, lo.amin(1))
        if ymax is not None:
            ymax = torch.maximum(ymax, ym.amax(1))
        T = ops.mm(Y, AEK)
        A = _zero_diag(ops.add(AKK, ops.mm(AKE, T)), ops)
        rho = ops.mm(gsE[:, :, -1:], Y)  # [b, 2G, 1, h]: exits of the eliminated half to the root
        F = ops.mm(AKE, Y)  # [b, 2G, h(K), h(E)]: exits to the kept half
        gs = ops.add(gsK, ops.mm(gsE, T))
        logminor = logminor.repeat_interleave(2, 1) + ld.reshape(b, 2 * G)
        saved.append((rho, F))
        size = h
    margin = gs[:, :, 0, 0]
    beta = torch.full((b, n, 1, 1), ops.zero, dtype=A.dtype, device=A.device)
    for rho, F in reversed(saved):
        G2, h = F.shape[1], F.shape[-1]
        bE = ops.add(rho, ops.mm(beta, F)).reshape(b, G2 // 2, 2, h, h)
        bK = beta.reshape(b, G2 // 2, 2, h, h)
        rows0 = torch.cat([bK[:, :, 0], bE[:, :, 0]], -1)
        rows1 = torch.cat([bE[:, :, 1], bK[:, :, 1]], -1)
        beta = torch.cat([rows0, rows1], -2)
    return {
        "beta": beta[:, 0],
        "margin": margin,
        "logminor": logminor,
        "ymax": ymax,
        "low": low,
    }
