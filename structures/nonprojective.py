"""The non-projective dependency CRF: the matrix-tree theorem, exactly (Koo et al. 2007; the
structured attention of Bisk & Tran 2018 and Liu & Lapata 2018).

Not a dynamic program: the class registers one algorithm per semiring (see :meth:`run`).

Numerics (the point of this module)
-----------------------------------
Every score is shifted by its column's (its dependent's) max, which changes each tree's score by
the same constant (every word has exactly one head), so the arc weights ``W = exp(θ - c)`` lie in
``[0, 1]`` with a 1 in every column. Then, per example:

1. **Fast path** (float64, LAPACK; :mod:`structures._certified`): LU of the Laplacian, ``log Z``
   from its pivots, ``X = M^{-1}`` and Koo et al.'s formulas for the marginals (single root: the
   Laplacian of the words rooted at one word ``c0`` and a rank-one correction). It is kept only
   where an *a-posteriori bound* of its error, computed from the factors at ``O(n^2)`` cost,
   certifies that ``log Z`` and every marginal are within ``TOL = 1e-9`` (absolute) of the exact
   values. LU of an M-matrix has backward error ``|E| <= γ |L||U|``; the bound propagates it
   through ``X`` with the column sums of ``|L||U|`` and the row maxima and absorption times of
   ``X``. ``log Z`` alone (``log_partition`` of potentials that do not require grad; otherwise the
   backward will want the marginals, computed with it) needs no inverse: the factors, one solve
   and a bound on ``diag X`` from ``U``; for full-length sentences of up to ``_SMALL`` words it is
   computed in C instead (``_matrix_tree_c.c``, where the optional extension is built): the
   subtraction-free elimination of step 2 one word at a time, exact without a certificate, and
   cheaper than the ~70 small torch calls of the LAPACK path at these sizes. At large score scales the pivots cancel, the bound explodes, and the example moves on:
2. **Exact path** (:mod:`structures._matrix_tree`): subtraction-free elimination
   (Grassmann–Taksar–Heyman) in float64, blocked, with the marginals from leave-one-out
   eliminations instead of Koo's cancelling difference; every quantity is a sum of products of
   non-negative numbers, so the relative error is a small multiple of ``n u`` whatever the scale.
   Its range check (no inverse entry above 1e280, no pivot below 1e-280) sends the rare example
   whose cycles outweigh its trees by more than ~e^640 to
3. **Log space** (same code, log-sum-exp arithmetic): no range limit.

Single root without a strongly connected word graph (``-inf`` arcs) is computed by conditioning
on the root's child (one multi-root problem per candidate).

Padding words are isolated nodes hanging from the root with weight 1: they contribute exactly
``log 1 = 0`` and exact zeros to every product, so an example's log-partition does not depend on
the padding (up to float64 rounding of differently blocked sums).

Second derivatives (the backward of the marginals, ``H G`` with ``H = ∂μ/∂θ`` the covariance of
the arcs) follow the path that answered the forward: where the fast path was certified, the
derivative of torch's float64 ``slogdet`` (twice differentiable); elsewhere the exact path is
differentiated in forward mode (``H`` is symmetric, so the Jacobian-vector product in direction
``G`` is the backward's ``H G``). The tangent of a subtraction-free computation stays accurate:
the relative tangent of a sum of non-negative terms is a convex combination of theirs, of a
product the sum of theirs. Where the forward needed log space or conditioning on the root's child,
and for third derivatives off the fast path, ``slogdet`` is used (accurate at moderate scales).
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

import semiring as sr
from semiring.semirings import CountSemiring, KMax, LogSemiring, MaxSemiring, RealSemiring, SampledSemiring

from . import _certified as cert
from . import _matrix_tree as mt

try:  # exact log Z of short sentences in C (_matrix_tree_c.c, built at install time where a C compiler is)
    from . import _matrix_tree_c
except ImportError:
    _matrix_tree_c = None
from .distribution import StructuredDistribution, _eager, _inner
from .trees import DependencyTrees, arcs

_RANGE = 1e280  # the linear exact path's range check
_SMALL = 96  # up to this many words, log Z alone is computed by the C extension where it is built

__all__ = ["NonProjectiveDependencyCRF"]


# ======================================================================================= helpers


def _masks(N: int, lengths: Tensor, device) -> tuple[Tensor, Tensor]:
    """``valid [B, N+1, N+1]`` (arcs h -> m of real words, h != m) and ``real [B, N]`` (real words)."""
    pos = torch.arange(N + 1, device=device)
    inside = pos <= lengths.to(device)[:, None]  # root and words 1..n
    valid = inside[:, :, None] & inside[:, None, :] & (pos[:, None] != pos[None, :]) & (pos[None, :] > 0)
    return valid, inside[:, 1:]


def _shift(theta: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """``(θ - c masked to valid arcs (-inf elsewhere), c [B, N])``: c the max score of each column."""
    th = theta.masked_fill(~valid, -math.inf)
    c = th[:, :, 1:].amax(1)
    c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
    return th - torch.cat([torch.zeros_like(c[:, :1]), c], 1)[:, None, :], c


def _closure(adj: Tensor) -> Tensor:
    """Reflexive-transitive closure of boolean ``adj [B, n, n]`` (``R[i, j]``: a path i -> j)."""
    n = adj.shape[-1]
    R = (adj | torch.eye(n, dtype=torch.bool, device=adj.device)).double()
    for _ in range(max(1, (n - 1).bit_length())):
        R = ((R @ R) > 0).double()
    return R > 0


def _feasibility(logW: Tensor, real: Tensor, single_root: bool) -> tuple[Tensor, Tensor]:
    """``(feasible [B], connected [B])``: some tree has finite score; (single root) the words'
    graph is strongly connected, so that every word can be the root's child."""
    B = logW.shape[0]
    fin = torch.isfinite(logW)
    valid_fin = fin[:, :, 1:]
    # fast answer when no real arc is forbidden
    real_arcs = torch.cat([real[:, None, :].expand(B, 1, -1), real[:, :, None] & real[:, None, :]], 1)
    eye = torch.eye(real.shape[1], dtype=torch.bool, device=real.device)
    real_arcs[:, 1:] &= ~eye
    full = (valid_fin | ~real_arcs).all(2).all(1)
    feasible = full.clone()
    connected = full.clone()
    if bool(full.all()):
        return feasible, connected
    rows = (~full).nonzero().squeeze(1)
    R = _closure(fin[rows, 1:, 1:])  # words -> words
    pad = ~real[rows]
    reach_all = (R | pad[:, None, :]).all(2) & real[rows]  # word c reaches every real word
    if single_root:
        feasible[rows] = (reach_all & fin[rows, 0, 1:]).any(1)
        connected[rows] = (reach_all | pad).all(1)
    else:
        from_root = (fin[rows, 0, 1:].double()[:, None, :] @ R.double())[:, 0] > 0
        feasible[rows] = (from_root | pad).all(1)
        connected[rows] = feasible[rows]
    return feasible, connected


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# ======================================================================================= exact path


def _exact(logW: Tensor, real: Tensor, single_root: bool, ops) -> tuple[Tensor, Tensor, Tensor]:
    """Subtraction-free ``(log Z(W), μ, ok)`` of every example (single root: the word graph must be
    strongly connected). ``ok``: the linear backend's range check (always True in log space)."""
    B, N1, _ = logW.shape
    n = N1 - 1
    n2 = _pow2(n)
    lin = ops is mt.LIN
    W = logW.exp() if lin else logW
    one, zero = (1.0, 0.0) if lin else (0.0, -math.inf)
    A = torch.full((B, n2, n2), zero, dtype=W.dtype, device=W.device)
    A[:, :n, :n] = W[:, 1:, 1:]
    pad = torch.ones(B, n2, dtype=torch.bool, device=W.device)
    pad[:, :n] = ~real
    root = torch.full((B, n2), zero, dtype=W.dtype, device=W.device)
    root[:, :n] = W[:, 0, 1:]
    if single_root:
        g = torch.full_like(root, zero).masked_fill(pad, one)
        s = root.masked_fill(pad, zero)
    else:
        g = root.masked_fill(pad, one)
        s = None
    out = mt.leave_one_out(A, g, s, ops, live=~pad)
    beta = out["beta"][:, :n, :n]  # [m, h]
    # numerators of the head distribution of every word m: root W_0m, word h: W_hm beta[m, h]
    num = torch.cat([W[:, 0:1, 1:], ops.mul(W[:, 1:, 1:], beta.transpose(-1, -2))], 1)
    den = ops.colsum(num)  # [B, n]
    mu = ops.div(num, den[:, None, :])
    if not lin:
        mu = mu.exp()
    mu = torch.cat([torch.zeros_like(mu[:, :, :1]), mu.masked_fill(~real[:, None, :], 0.0)], 2)
    if single_root:
        logT = out["logminor"][:, :n] if lin else out["logminor"][:, :n]
        lw0 = W[:, 0, 1:].log() if lin else W[:, 0, 1:]
        logZ = torch.logsumexp((lw0 + logT).masked_fill(~real, -math.inf), 1)
    else:
        logZ = out["logminor"][:, 0] + ops.log(out["margin"][:, 0])
    ok = torch.isfinite(logZ) & torch.isfinite(mu).flatten(1).all(1)
    if lin:
        dmin = den.masked_fill(~real, 1.0).amin(1)
        ok &= (out["ymax"] <= _RANGE) & (out["low"] >= 1 / _RANGE) & (dmin >= 1 / _RANGE)
        if not single_root:
            ok &= out["margin"][:, 0] >= 1 / _RANGE
    return logZ, mu, ok


def _conditioned_on_root_child(logW: Tensor, real: Tensor) -> tuple[Tensor, Tensor]:
    """Single root by conditioning on the root's child c: one multi-root problem per (example, c)
    whose only root arc is the one to c. ``O(n)`` multi-root problems per example."""
    B, N1, _ = logW.shape
    n = N1 - 1
    cand = torch.isfinite(logW[:, 0, 1:]) & real  # [B, n]
    bs, cs = cand.nonzero(as_tuple=True)
    logZ = torch.full((B,), -math.inf, dtype=logW.dtype, device=logW.device)
    mu = torch.zeros_like(logW)
    if bs.numel() == 0:
        return logZ, mu
    sub = logW[bs].clone()
    keep = torch.nn.functional.one_hot(cs + 1, N1).bool()
    sub[:, 0, :] = sub[:, 0, :].masked_fill(~keep, -math.inf)
    z, m = _solve(sub, real[bs], single_root=False, fast=True)
    z = z.masked_fill(~torch.isfinite(z), -math.inf)
    zz = torch.full((B, n), -math.inf, dtype=logW.dtype, device=logW.device)
    zz[bs, cs] = z
    logZ = torch.logsumexp(zz, 1)
    w = torch.where(torch.isfinite(z), (z - logZ[bs]).exp(), torch.zeros_like(z))
    mu.index_add_(0, bs, m * w[:, None, None])
    return logZ, mu


def _solve(logW: Tensor, real: Tensor, single_root: bool, fast: bool = True, info: dict | None = None):
    """``(log Z(W), μ)`` for column-shifted log-weights ``logW [B, N+1, N+1]`` (-inf off the valid
    arcs), float64; every example through the cheapest path that is certified or exact."""
    B = logW.shape[0]
    logZ = torch.full((B,), -math.inf, dtype=logW.dtype, device=logW.device)
    mu = torch.zeros_like(logW)
    method = ["none"] * B
    feasible, connected = _feasibility(logW, real, single_root)
    todo = (feasible & connected).nonzero().squeeze(1)
    if fast and todo.numel():
        z, m, ok = cert.marginals(logW[todo].exp(), real[todo], single_root)
        good = todo[ok]
        logZ[good], mu[good] = z[ok], m[ok]
        for i in good.tolist():
            method[i] = "fast"
        todo = todo[~ok]
    for ops in (mt.LIN, mt.LOG):
        if not todo.numel():
            break
        z, m, ok = _exact(logW[todo], real[todo], single_root, ops)
        good = todo[ok]
        logZ[good], mu[good] = z[ok], m[ok]
        for i in good.tolist():
            method[i] = ops.name
        todo = todo[~ok]
    if todo.numel():  # cannot happen in log space; kept as a guard
        raise FloatingPointError("NonProjectiveDependencyCRF: the exact matrix-tree computation failed")
    cond = (feasible & ~connected).nonzero().squeeze(1)
    if cond.numel():
        z, m = _conditioned_on_root_child(logW[cond], real[cond])
        logZ[cond], mu[cond] = z, m
        for i in cond.tolist():
            method[i] = "conditioned"
    if info is not None:
        info["method"] = method
    return logZ, mu


def log_partition_and_marginals(theta: Tensor, lengths: Tensor | None, single_root: bool, fast: bool = True,
                                info: dict | None = None, marginals: bool = True) -> tuple[Tensor, Tensor | None]:
    """``(log Z [B], μ [B, N+1, N+1])`` in float64, exactly (see the module doc). ``fast=False``
    skips the certified LAPACK path; ``info['method']`` tells, per example, which path answered
    (``fast``: the certified LAPACK path or, for log Z alone, the C elimination; ``lin``, ``log``,
    ``conditioned`` or ``none`` where no tree exists).
    ``marginals=False``: log Z alone (μ is None), the fast path without an inverse."""
    x = theta.detach()
    B, N1, _ = x.shape
    N = N1 - 1
    dev = x.device
    full = lengths is None or bool((lengths == N).all())
    valid, real = (None, torch.ones(B, N, dtype=torch.bool, device=dev)) if full else _masks(N, lengths, dev)

    def shifted(rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(θ - c, c [b, N])`` in float64 (a copy) for some examples, -inf on the arcs that do not
        exist (every example full: the diagonal and column 0), c the max of every column."""
        out = (x if rows is None else x[rows]).to(torch.float64, copy=True)
        if valid is None:
            out.diagonal(dim1=-2, dim2=-1).fill_(-math.inf)
            out.select(2, 0).fill_(-math.inf)
        else:
            out.masked_fill_(~(valid if rows is None else valid[rows]), -math.inf)
        c = out[:, :, 1:].amax(1).nan_to_num_(neginf=0.0)  # padding words and words without heads (-inf)
        out[:, :, 1:].sub_(c[:, None, :])
        return out, c

    if fast:
        if marginals:
            logW, c = shifted()
            z, mu, ok = cert.marginals(logW.exp_(), real, single_root)
        elif _matrix_tree_c is not None and valid is None and N <= _SMALL and x.device.type == "cpu":
            (z, ok), mu, c = _small_log_partition(x, single_root), None, None
        else:
            Wt, root, c = _word_weights(x, valid)
            (z, ok), mu = cert.log_partition(Wt, root, None if valid is None else real, single_root), None
        logZ = z if c is None else z.add_(c.sum(1))
        if bool(ok.all()):
            if info is not None:
                info["method"] = ["fast"] * B
            return logZ, mu
        rows = (~ok).nonzero().squeeze(1)
        method = ["fast" if o else "" for o in ok.tolist()]
    else:
        logZ = x.new_zeros(B, dtype=torch.float64)
        mu = x.new_zeros(B, N1, N1, dtype=torch.float64) if marginals else None
        rows = torch.arange(B, device=dev)
        method = [""] * B
    sub: dict = {}
    logW, c = shifted(rows if fast else None)
    z, m = _solve(logW, real[rows], single_root, False, sub)
    logZ[rows] = z + c.sum(1)
    if mu is not None:
        mu[rows] = m
    for i, name in zip(rows.tolist(), sub["method"]):
        method[i] = name
    if info is not None:
        info["method"] = method
    return logZ, mu


def _small_log_partition(x: Tensor, single_root: bool) -> tuple[Tensor, Tensor]:
    """``(log Z [B], ok [B])`` of full-length examples on CPU by the C extension
    (``_matrix_tree_c.c``): the subtraction-free elimination one word at a time, exact at any scale
    (no certificate needed); not ok where a pivot underflows or no tree exists."""
    t = x.to(torch.float64).contiguous()
    logZ = t.new_empty(t.shape[0])
    ok = torch.empty(t.shape[0], dtype=torch.uint8)
    _matrix_tree_c.log_partition(t.numpy(), t.shape[0], t.shape[1], single_root, logZ.numpy(), ok.numpy())
    return logZ, ok.bool()


def _word_weights(x: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """``(Wt [B, n, n], root [B, n], c [B, n])``: the column-shifted weights of the arcs between
    words, transposed (``Wt[b, m, h]`` = ``exp(θ[b, h, m] - c[b, m])``: each word's heads
    contiguous), and of the root's arcs, in float64, 0 where an arc does not exist (``valid``
    False; None: the diagonal); ``c`` each word's max score (0 without a head)."""
    B, N1, _ = x.shape
    Wt = torch.empty(B, N1 - 1, N1 - 1, dtype=torch.float64, device=x.device)
    Wt.copy_(x[:, 1:, 1:].mT)
    root = x[:, 0, 1:].to(torch.float64, copy=True)
    if valid is None:
        Wt.diagonal(dim1=-2, dim2=-1).fill_(-math.inf)
    else:
        Wt.masked_fill_(~valid[:, 1:, 1:].mT, -math.inf)
        root.masked_fill_(~valid[:, 0, 1:], -math.inf)
    c = torch.maximum(Wt.amax(2), root).nan_to_num_(neginf=0.0)
    Wt.sub_(c[:, :, None]).exp_()
    root.sub_(c).exp_()
    return Wt, root, c


# ======================================================================================= autograd


def _laplacian(W: Tensor, real: Tensor, single_root: bool) -> Tensor:
    """The (differentiable) matrix of the matrix-tree theorem: multi-root ``L + diag(r)``, single
    root Koo et al.'s first row replaced by the root scores; padding words are identity rows."""
    Ww = W[:, 1:, 1:]
    padI = torch.diag_embed((~real).to(W.dtype))
    if not single_root:
        return torch.diag_embed(W[:, :, 1:].sum(1)) - Ww + padI
    L = torch.diag_embed(Ww.sum(1)) - Ww + padI
    return torch.cat([W[:, 0:1, 1:], L[:, 1:]], 1)


def _hessian_vector(theta: Tensor, mu: Tensor, G: Tensor, lengths: Tensor, single_root: bool,
                    certified: Tensor) -> Tensor:
    """``H G`` (H = ∂μ/∂θ, the covariance of the arcs): by the exact path in forward mode for the
    examples whose forward was not ``certified`` by the fast path (:func:`_exact_tangent`), by
    :func:`_slogdet_hessian_vector` for the others and wherever the exact tangent is out of range.
    Differentiable when grad mode is on (then always by ``slogdet``)."""
    if torch.is_grad_enabled():
        return _slogdet_hessian_vector(theta, mu, G, lengths, single_root)
    N = theta.shape[-1] - 1
    valid, real = _masks(N, lengths, theta.device)
    out = torch.zeros_like(theta)
    by_slogdet = torch.ones_like(certified)
    rows = (~certified & (mu.flatten(1).sum(1) > 0)).nonzero().squeeze(1)
    if rows.numel():
        lw = _shift(theta[rows].to(torch.float64), valid[rows])[0]
        feasible, connected = _feasibility(lw, real[rows], single_root)
        keep = feasible & connected
        rows, lw = rows[keep], lw[keep]
    if rows.numel():
        tangent, ok = _exact_tangent(lw, G[rows].to(torch.float64).masked_fill(~valid[rows], 0.0), real[rows], single_root)
        rows = rows[ok]
        out[rows] = tangent[ok].masked_fill(~valid[rows], 0.0).to(out.dtype)
        by_slogdet[rows] = False
    rows = by_slogdet.nonzero().squeeze(1)
    if rows.numel():
        out[rows] = _slogdet_hessian_vector(theta[rows], mu[rows], G[rows], lengths[rows], single_root)
    return out


def _exact_tangent(logW: Tensor, G: Tensor, real: Tensor, single_root: bool) -> tuple[Tensor, Tensor]:
    """``(dμ [b, N+1, N+1], ok [b])``: the derivative of the exact path's marginals (linear backend)
    at column-shifted ``logW`` in direction ``G`` (forward-mode AD); ``ok`` its range check."""
    with torch.no_grad(), fwAD.dual_level():
        with warnings.catch_warnings():  # torch loads its jvp decompositions through torch.jit.script once
            warnings.simplefilter("ignore", DeprecationWarning)
            dual = fwAD.make_dual(logW, G)
        _, mu, ok = _exact(dual, real, single_root, mt.LIN)
        tangent = fwAD.unpack_dual(mu).tangent
    if tangent is None:  # μ does not depend on θ (a single tree)
        tangent = torch.zeros_like(logW)
    return tangent, ok & torch.isfinite(tangent).flatten(1).all(1)


def _slogdet_hessian_vector(theta: Tensor, mu: Tensor, G: Tensor, lengths: Tensor, single_root: bool) -> Tensor:
    """``H G``: ``G ⊙ μ`` with the exact μ, plus the rest of the derivative of ``⟨G, μ⟩`` by torch's
    ``slogdet`` (float64). Differentiable when grad mode is on."""
    higher = torch.is_grad_enabled()
    N = theta.shape[-1] - 1
    valid, real = _masks(N, lengths, theta.device)
    alive = mu.detach().flatten(1).sum(1) > 0
    with torch.enable_grad():
        th = theta.to(torch.float64) if higher else theta.detach().to(torch.float64).requires_grad_()
        if not th.requires_grad:
            th = th.requires_grad_()
        c = _shift(th.detach(), valid)[1]
        cc = torch.cat([torch.zeros_like(c[:, :1]), c], 1)[:, None, :]
        W = (th.masked_fill(~valid, -math.inf) - cc).exp()
        W = torch.where(alive[:, None, None], W, valid.to(W.dtype))  # no tree: any non-singular stand-in
        ld = torch.linalg.slogdet(_laplacian(W, real, single_root))[1]
        (m_lin,) = torch.autograd.grad(ld.sum(), th, create_graph=True)
        G64 = G.to(torch.float64)
        (hv,) = torch.autograd.grad((m_lin * G64).sum(), th, create_graph=higher)
        rest = hv - G64 * m_lin
    out = G64 * mu.to(torch.float64) + rest
    out = out * (valid & alive[:, None, None])
    return out.to(theta.dtype)


class _Marginals(torch.autograd.Function):
    """μ(θ) with a precomputed exact value; backward = the Hessian-vector product."""

    @staticmethod
    def forward(ctx, theta, mu64, lengths, single_root, certified):
        out = mu64.to(theta.dtype) if mu64.dtype != theta.dtype else mu64.clone()
        ctx.save_for_backward(theta, out)
        ctx.lengths, ctx.single_root, ctx.certified = lengths, single_root, certified
        return out

    @staticmethod
    def backward(ctx, G):
        theta, mu = ctx.saved_tensors
        return _hessian_vector(theta, mu, G, ctx.lengths, ctx.single_root, ctx.certified), None, None, None, None


class _LogPartition(torch.autograd.Function):
    """log Z(θ) with a precomputed exact value; gradient = the exact marginals (differentiable),
    computed when asked for: ``exact()`` gives ``(log Z, μ, certified, lengths)``, float64."""

    @staticmethod
    def forward(ctx, theta, logZ64, exact, single_root):
        ctx.save_for_backward(theta)
        ctx.exact, ctx.single_root = exact, single_root
        return logZ64.to(theta.dtype)

    @staticmethod
    def backward(ctx, g):
        (theta,) = ctx.saved_tensors
        _, mu64, certified, lengths = ctx.exact()
        mu = _Marginals.apply(theta, mu64, lengths, ctx.single_root, certified)
        if not torch.is_grad_enabled() and bool((g == 1).all()):
            return mu, None, None, None  # the marginals themselves (no copy)
        return g[:, None, None] * mu, None, None, None


# ======================================================================================= sampling


def _wilson_steps(W: Tensor, real: Tensor) -> Tensor:
    """Expected number of random-walk steps of Wilson's algorithm, multi-root graph of ``W``
    (column-normalised, float64): ``tr (I - P)^{-1} = Σ_m d_m X_mm`` (Marchal 2000). ``inf`` where
    it cannot be computed. A deterministic function of the input, used only to choose a sampler."""
    Ww = W[:, 1:, 1:]
    d = W[:, :, 1:].sum(1) + (~real).double()
    M = torch.diag_embed(d) - Ww
    X, info = torch.linalg.inv_ex(M)
    steps = (d * X.diagonal(dim1=-2, dim2=-1)).sum(1)
    return torch.where((info == 0) & torch.isfinite(steps) & (steps > 0), steps, torch.full_like(steps, math.inf))


def _wilson(C: Tensor, pid: Tensor, start_tree: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Wilson's algorithm (1996), vectorised over the rows: heads ``[R, N+1]`` (0 at the root).

    ``C [P, N+1, N+1]``: the cumulative weights over heads of every problem (``C[p, h, m]`` =
    Σ_{h' <= h} W[p, h', m]); row r samples a tree of problem ``pid[r]``. ``start_tree [R, N+1]``:
    the nodes already in the tree (hanging from the root). Every iteration moves every running row
    by one step: a walker draws the next head of its node until it hits the tree, then retraces its
    loop-erased path (the last exit from every node) into the tree, then the next node not in the
    tree starts a walk. Finished rows are set aside as the tail of long walks runs on.
    """
    R, N1 = start_tree.shape
    dev = C.device
    out = torch.zeros(R, N1, dtype=torch.long, device=dev)
    ids = torch.arange(R, device=dev)  # the original row of every row still running
    in_tree = start_tree.clone()
    heads = torch.zeros(R, N1, dtype=torch.long, device=dev)
    nxt = torch.zeros(R, N1, dtype=torch.long, device=dev)

    def first_out(t: Tensor) -> tuple[Tensor, Tensor]:
        out_ = (~t).to(torch.uint8)
        return out_.argmax(1), out_.amax(1) > 0  # the first node not in the tree (argmax: first max)

    start, more = first_out(in_tree)
    mode = torch.where(more, 0, 2)  # 0 walking, 1 retracing, 2 done
    u = start.clone()
    while True:
        running = mode != 2
        n_run = int(running.sum())
        if n_run == 0 or n_run < 0.75 * ids.numel():  # hand finished rows back, keep the running ones
            done = ~running
            out[ids[done]] = heads[done]
            if n_run == 0:
                break
            keep = running.nonzero().squeeze(1)
            pid, in_tree, heads, nxt, start, mode, u, ids = (t[keep] for t in (pid, in_tree, heads, nxt, start, mode, u, ids))
        rows = torch.arange(ids.numel(), device=dev)
        it = in_tree[rows, u]
        walk, retr = mode == 0, mode == 1
        w_hit, w_step = walk & it, walk & ~it
        r_add, r_end = retr & ~it, retr & it
        col = C[pid, :, u]  # [R, N1]
        x = torch.rand(rows.numel(), dtype=C.dtype, device=dev, generator=generator) * col[:, -1]
        h = torch.searchsorted(col, x[:, None], right=True)[:, 0].clamp_max(N1 - 1)
        nxt_u = nxt[rows, u]
        nxt[rows, u] = torch.where(w_step, h, nxt_u)
        heads[rows, u] = torch.where(r_add, nxt_u, heads[rows, u])
        in_tree[rows, u] = it | r_add
        u = torch.where(w_step, h, torch.where(w_hit, start, torch.where(r_add, nxt_u, u)))
        mode = torch.where(w_hit, 1, mode)
        ends = r_end.nonzero().squeeze(1)
        if ends.numel():  # paths that reached the tree: the next walk starts at the first node out of it
            new_start, more = first_out(in_tree[ends])
            mode[ends] = torch.where(more, 0, 2)
            start[ends] = new_start
            u[ends] = new_start
    return out


def _sequential(logW: Tensor, real: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Exact multi-root samples word after word: the head of word m is drawn from its marginal
    given the heads drawn so far (the other heads of the words already drawn forbidden). ``n``
    exact marginal computations; heads ``[R, N+1]``."""
    R, N1, _ = logW.shape
    lw = logW.clone()
    heads = torch.zeros(R, N1, dtype=torch.long, device=logW.device)
    for m in range(1, N1):
        on = real[:, m - 1]
        if not bool(on.any()):
            continue
        _, mm = _solve(lw, real, single_root=False)
        p = torch.where(on[:, None], mm[:, :, m], torch.ones_like(mm[:, :, m]))
        h = torch.multinomial(p, 1, generator=generator)[:, 0]
        off = on[:, None] & (torch.arange(N1, device=logW.device) != h[:, None])
        lw[:, :, m] = lw[:, :, m].masked_fill(off, -math.inf)
        heads[:, m] = torch.where(on, h, heads[:, m])
    return heads


def _sample_heads(theta: Tensor, lengths: Tensor, single_root: bool, copies: int = 1,
                  budget: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """``copies`` exact samples of heads of every example of ``theta [U, N+1, N+1]``: ``[copies * U, N]``
    (row ``j * U + u`` is the j-th sample of example u), float64 inside.

    Multi-root: Wilson's algorithm where its expected number of steps ``Σ_m d_m X_mm`` is at most
    ``budget`` (default ``50 (N+1)``), else sequential conditioning on exact marginals
    (:func:`_sequential`, ``n`` exact computations). The choice depends on the problem only, never
    on the random draws, so both are exact. Single root (unbiased, as in Stanojević 2022): the
    root's child c is drawn from its exact marginal, then the rest given c, a multi-root problem
    whose only root arc goes to c, as above.
    """
    theta = theta.detach().to(torch.float64)
    U, N1, _ = theta.shape
    N = N1 - 1
    dev = theta.device
    valid, real = _masks(N, lengths, dev)
    if budget is None:
        budget = 50.0 * N1
    logW, _ = _shift(theta, valid)
    R = copies * U
    idx = torch.arange(R, device=dev) % U
    if single_root:
        logZ, mu = _solve(logW, real, single_root=True)
        alive = torch.isfinite(logZ)
        p0 = torch.where(alive[:, None], mu[:, 0, 1:], real.double())
        c = torch.multinomial(p0[idx], 1, generator=generator)[:, 0] + 1  # [R]
        # the problems: (example, root child) pairs
        key, pid = torch.unique(idx * N1 + c, return_inverse=True)
        pu, pc = key // N1, key % N1
        plw = logW[pu].clone()
        plw[:, 0, :] = plw[:, 0, :].masked_fill(torch.arange(N1, device=dev) != pc[:, None], -math.inf)
        plw, _ = _shift(plw, valid[pu])
        preal = real[pu]
        palive = alive[pu]
    else:
        plw, preal, pid = logW, real, idx
        palive = _feasibility(logW, real, False)[0]
    W = plw.exp()
    steps = _wilson_steps(W, preal)
    easy = palive & (steps <= budget)
    heads = torch.zeros(R, N1, dtype=torch.long, device=dev)
    rows_easy = easy[pid].nonzero().squeeze(1)
    if rows_easy.numel():
        start = torch.zeros(rows_easy.numel(), N1, dtype=torch.bool, device=dev)
        start[:, 0] = True
        start[:, 1:] = ~preal[pid[rows_easy]]
        heads[rows_easy] = _wilson(W.cumsum(1), pid[rows_easy], start, generator)
    rows_hard = (palive & ~easy)[pid].nonzero().squeeze(1)
    if rows_hard.numel():
        chunk = max(1, (1 << 26) // (N1 * N1 * 8))
        for i in range(0, rows_hard.numel(), chunk):
            r = rows_hard[i : i + chunk]
            heads[r] = _sequential(plw[pid[r]], preal[pid[r]], generator)
    return heads[:, 1:] * real[idx]


# ======================================================================================= counting


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


# ======================================================================================= the class


class NonProjectiveDependencyCRF(DependencyTrees, StructuredDistribution):
    """A distribution over non-projective dependency trees (spanning arborescences) of ``n`` words.

    ``log_potentials[b, h, m]`` (shape ``[B, N+1, N+1]``) scores the arc from head ``h`` to
    modifier ``m``; index 0 is the root symbol, words are ``1..n``. Column 0 (arcs into the root)
    and the diagonal are never used. ``lengths[b]`` in ``1..N`` is the number of words (default N).
    ``single_root=True`` lets the root take exactly one child (Koo et al. 2007; Bisk & Tran 2018),
    otherwise any number (Liu & Lapata 2018: root scores on a tree of sentences). ``-inf`` forbids
    an arc. Marginals and one-hot trees have the shape of ``log_potentials``; ``decode()`` gives
    heads ``[B, N]`` (``heads[b, m-1]`` is the head of word m, 0 = root; 0 past each length).

    Algorithms (not a dynamic program: one per semiring, see :meth:`run`): log-partition and
    marginals by the matrix-tree theorem, exactly at any score scale (module doc); the best and
    k best trees by Chu-Liu-Edmonds / Camerini et al. (:mod:`structures.decode.arborescence`);
    exact samples by Wilson's algorithm or sequential conditioning; the number of trees by the
    matrix-tree theorem on the allowed arcs (exact integers below 2**53).
    """

    shape = "B, N, N"

    def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None, single_root: bool = False):
        self.single_root = bool(single_root)
        self._cache: dict = {}
        if isinstance(log_potentials, Tensor) and log_potentials.dim() == 3 and log_potentials.shape[-1] < 2:
            raise ValueError(f"log_potentials: expected shape [B, N+1, N+1] with N >= 1 words, got {list(log_potentials.shape)}")
        super().__init__(log_potentials, lengths)

    # ------------------------------------------------------------------ hooks of the base

    def _inputs(self, theta: Tensor, expand: bool = False) -> dict[str, Tensor]:
        return {self._input: theta}  # no program, no shared scores: the arc scores only

    def _check_lengths(self, lengths: Tensor | None) -> Tensor | None:
        self._input = "arc"
        N = self._theta.shape[-1] - 1
        if lengths is None:
            return None
        if not isinstance(lengths, Tensor):
            lengths = torch.as_tensor(lengths)
        if (lengths.dim() != 1 or lengths.shape[0] != self._batch or lengths.dtype.is_floating_point
                or lengths.dtype == torch.bool or lengths.is_complex()):
            raise ValueError(f"lengths: expected an integer tensor of shape [B] = [{self._batch}], got {lengths.dtype} {tuple(lengths.shape)}")
        if self._batch and (int(lengths.min()) < 1 or int(lengths.max()) > N):
            raise ValueError(f"lengths: expected values in 1..{N} (the number of words), got {lengths.tolist()}")
        return lengths.to(device=self._theta.device, dtype=torch.long)

    @property
    def max_length(self) -> int:
        return self._theta.shape[-1] - 1

    def _len(self, lengths: Tensor | None, batch: int) -> Tensor:
        if lengths is None:
            return torch.full((batch,), self.max_length, dtype=torch.long, device=self._theta.device)
        return lengths

    # ------------------------------------------------------------------ the algorithms

    def _exact_result(self, theta: Tensor, lengths: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """``(log Z, μ, certified)`` in float64, memoised for this distribution's own potentials;
        ``certified [B]``: the fast path answered (it decides how the marginals are differentiated)."""
        key = self._memo_key(theta, lengths)
        if key in self._cache:
            return self._cache[key]
        info: dict = {}
        logZ, mu = log_partition_and_marginals(theta, lengths, self.single_root, info=info)
        res = logZ, mu, torch.tensor([m == "fast" for m in info["method"]], dtype=torch.bool, device=theta.device)
        if key is not None:
            self._cache = {key: res}
        return res

    def _memo_key(self, theta: Tensor, lengths: Tensor | None) -> tuple | None:
        """The key of :meth:`_exact_result`'s memo: None unless ``theta`` is this distribution's own."""
        if theta.data_ptr() == self._theta.data_ptr() and theta.shape == self._theta.shape and theta.stride() == self._theta.stride():
            return theta._version, None if lengths is None else tuple(lengths.tolist())
        return None

    def _log_partition(self, theta: Tensor, lengths: Tensor | None) -> Tensor:
        """log Z in float64: from the memo of :meth:`_exact_result` if it holds it, else without the
        marginals (the certified path needs no inverse for it)."""
        key = self._memo_key(theta, lengths) if self._cache else None
        if key in self._cache:
            return self._cache[key][0]
        return log_partition_and_marginals(theta, lengths, self.single_root, marginals=False)[0]

    @_eager
    def run(self, semiring: sr.Semiring, theta: Tensor | None = None, lengths: Tensor | None = None) -> Tensor:
        """The structure in ``semiring``: ``[*components, B]``.

        * ``Log``: log Z by the matrix-tree theorem (gradient: exact marginals, twice differentiable);
        * ``Real``: Z = exp(log Z);
        * ``Max``: ⟨θ, best tree⟩ (gradient: the tree);
        * ``KMax(k)``: ``[k, B]``, ⟨θ, j-th best tree⟩ (-inf past the number of trees);
        * ``Sampled``: ⟨θ, an exact sample⟩ (gradient: the sample), one per row;
        * ``Count``: the number of trees of finite score (float64).
        """
        theta = self._theta if theta is None else theta
        raw_lengths = self._lengths if lengths is None else lengths
        lengths = self._len(raw_lengths, theta.shape[0])
        if isinstance(semiring, SampledSemiring):
            U, copies = theta.shape[0], 1
            base = self._theta.detach()
            if U > self._batch and U % self._batch == 0 and theta.shape[1:] == base.shape[1:]:
                k = U // self._batch  # the base class samples k copies of the batch: solve it once
                if torch.equal(theta.detach().view(k, *base.shape), base.expand(k, *base.shape)) and torch.equal(
                        lengths.view(k, -1), self.lengths.expand(k, -1)):
                    U, copies = self._batch, k
            heads = _sample_heads(theta[:U], lengths[:U], self.single_root, copies, generator=semiring.generator)
            return self._score_trees(theta, heads, lengths)
        if isinstance(semiring, MaxSemiring):
            from .decode.arborescence import max_arborescence

            heads = max_arborescence(theta.detach(), lengths, self.single_root)
            score = self._score_trees(theta, heads, lengths)
            if self.single_root:  # where no single-root tree has a finite score, the best found has several root children
                words = torch.arange(heads.shape[-1], device=heads.device) < lengths[:, None]
                score = score.masked_fill(((heads == 0) & words).sum(-1) != 1, -math.inf)
            return score
        if isinstance(semiring, KMax):
            from .decode.arborescence import kbest_arborescences

            heads, _ = kbest_arborescences(theta.detach(), semiring.k, lengths, self.single_root)
            vals = self._score_trees(theta, heads.clamp_min(0), lengths)
            return vals.masked_fill((heads < 0).any(-1), -math.inf)
        if isinstance(semiring, LogSemiring):
            if theta.requires_grad and torch.is_grad_enabled():  # the backward will want μ: one factorization for both
                res = self._exact_result(theta, raw_lengths)
                return _LogPartition.apply(theta, res[0], lambda: (*res, lengths), self.single_root)
            return _LogPartition.apply(theta, self._log_partition(theta, raw_lengths),
                                       lambda: (*self._exact_result(theta, raw_lengths), lengths), self.single_root)
        if isinstance(semiring, CountSemiring):
            return self._count(theta, lengths)
        if isinstance(semiring, RealSemiring):
            return self.run(sr.Log, theta, lengths).exp()
        raise NotImplementedError(
            f"{type(self).__name__}: no algorithm for the {semiring} semiring (non-projective trees are not a "
            "dynamic program; available: Log, Real, Max, KMax, Sampled, Count; expectations via expected_score)")

    def _score_trees(self, theta: Tensor, heads: Tensor, lengths: Tensor) -> Tensor:
        """``[..., B]``: ⟨θ, tree⟩ for heads ``[..., B, N]`` (differentiable: the gradient is the tree)."""
        parts = self._parts(heads, lengths, theta.dtype)
        return _inner(theta, parts, 2)

    def _parts(self, heads: Tensor, lengths: Tensor, dtype) -> Tensor:
        return arcs(heads, lengths, self._theta.shape[-1], dtype)

    def _count(self, theta: Tensor, lengths: Tensor) -> Tensor:
        fin = torch.isfinite(theta.detach())
        zero_one = torch.zeros_like(theta.detach(), dtype=torch.float64).masked_fill(~fin, -math.inf)
        logc, _ = log_partition_and_marginals(zero_one, lengths, self.single_root)
        count = logc.exp()
        out = count.clone()
        for b in range(theta.shape[0]):
            if math.isfinite(float(count[b])) and float(count[b]) < 2.0**53 * 1.01:
                exact = _exact_count(fin[b], int(lengths[b]), self.single_root)
                if exact < 2**53:
                    out[b] = float(exact)
        return out

    @_eager
    def _marginals_exact(self) -> Tensor:
        """The exact marginals, differentiable (through :class:`_Marginals`) when θ requires grad;
        no autograd round trip through log Z otherwise."""
        _, mu, certified = self._exact_result(self._theta, self._lengths)
        if self._theta.requires_grad:
            return _Marginals.apply(self._theta, mu, self.lengths, self.single_root, certified)
        return mu.to(self._theta.dtype) if mu.dtype != self._theta.dtype else mu.clone()

    def _expected(self, theta: Tensor, v: Tensor, base: sr.Semiring) -> Tensor:
        """E_p⟨v, z⟩ = ⟨μ(θ), v⟩ (its gradient w.r.t. θ is the Hessian-vector product H v)."""
        if v.shape != theta.shape:
            raise ValueError(f"v: expected shape {list(theta.shape)} (that of log_potentials), got {list(v.shape)}")
        lengths = self._len(self._lengths, theta.shape[0])
        if theta.requires_grad:
            mu = self._derivative(self.run(sr.Log, theta), theta, create_graph=True)
        else:
            mu = self._exact_result(theta, self._lengths)[1].to(theta.dtype)
        valid, _ = _masks(theta.shape[-1] - 1, lengths, theta.device)
        return (mu * torch.where(valid, v.to(mu.dtype), torch.zeros_like(mu))).flatten(1).sum(1)

    # ------------------------------------------------------------------ trees

    def enumerate_support(self, limit: int = 2_000_000) -> tuple[Tensor, Tensor]:
        """Every tree of finite score (brute force over head assignments; ``(n+1)^n <= limit``):
        ``(values [S, B, N+1, N+1], valid [S, B])``, trees of each example in lexicographic order of
        their heads, slots past its count 0 and invalid."""
        import itertools

        from .decode.arborescence import is_tree

        N = self.max_length
        lengths = self.lengths
        theta = self._theta.detach()
        per = []
        for b in range(self._batch):
            n = int(lengths[b])
            if (n + 1) ** n > limit:
                raise ValueError(f"enumerate_support: {(n + 1) ** n} head assignments for n = {n} exceed limit={limit}")
            cand = torch.tensor(list(itertools.product(range(n + 1), repeat=n)), dtype=torch.long).reshape(-1, n)
            cand = torch.cat([cand, torch.zeros(cand.shape[0], N - n, dtype=torch.long)], 1).to(theta.device)
            L = torch.full((cand.shape[0],), n, dtype=torch.long, device=theta.device)
            ok = is_tree(cand, L, self.single_root)
            cand = cand[ok]
            sc = _inner(theta[b].expand(cand.shape[0], -1, -1), self._parts(cand, L[: cand.shape[0]], theta.dtype), 2) if cand.shape[0] else torch.zeros(0)
            per.append(cand[torch.isfinite(sc)] if cand.shape[0] else cand)
        S = max(1, max((p.shape[0] for p in per), default=0))
        heads = torch.zeros(S, self._batch, N, dtype=torch.long, device=theta.device)
        valid = torch.zeros(S, self._batch, dtype=torch.bool, device=theta.device)
        for b, p in enumerate(per):
            heads[: p.shape[0], b] = p
            valid[: p.shape[0], b] = True
        values = self._parts(heads, lengths, theta.dtype) * valid[..., None, None]
        return self._out(values), valid
