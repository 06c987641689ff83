"""The derivatives of :mod:`structures.spanning._tree_partition`'s log-partition and marginals: autograd
functions whose gradient of log Z is the exact marginals and whose backward of the marginals is
the Hessian-vector product ``H G``.

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

from . import _matrix_tree as mt
from ._tree_partition import exact, feasibility, masks, shift


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
    valid, real = masks(N, lengths, theta.device)
    out = torch.zeros_like(theta)
    by_slogdet = torch.ones_like(certified)
    rows = (~certified & (mu.flatten(1).sum(1) > 0)).nonzero().squeeze(1)
    if rows.numel():
        lw = shift(theta[rows].to(torch.float64), valid[rows])[0]
        feasible, connected = feasibility(lw, real[rows], single_root)
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
        _, mu, ok = exact(dual, real, single_root, mt.LIN)
        tangent = fwAD.unpack_dual(mu).tangent
    if tangent is None:  # μ does not depend on θ (a single tree)
        tangent = torch.zeros_like(logW)
    return tangent, ok & torch.isfinite(tangent).flatten(1).all(1)


def _slogdet_hessian_vector(theta: Tensor, mu: Tensor, G: Tensor, lengths: Tensor, single_root: bool) -> Tensor:
    """``H G``: ``G ⊙ μ`` with the exact μ, plus the rest of the derivative of ``⟨G, μ⟩`` by torch's
    ``slogdet`` (float64). Differentiable when grad mode is on."""
    higher = torch.is_grad_enabled()
    N = theta.shape[-1] - 1
    valid, real = masks(N, lengths, theta.device)
    alive = mu.detach().flatten(1).sum(1) > 0
    with torch.enable_grad():
        th = theta.to(torch.float64) if higher else theta.detach().to(torch.float64).requires_grad_()
        if not th.requires_grad:
            th = th.requires_grad_()
        c = shift(th.detach(), valid)[1]
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


class Marginals(torch.autograd.Function):
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


class LogPartition(torch.autograd.Function):
    """log Z(θ) with a precomputed exact value; gradient = the exact marginals (differentiable),
    computed when asked for: ``solution()`` gives ``(log Z, μ, certified, lengths)``, float64."""

    @staticmethod
    def forward(ctx, theta, logZ64, solution, single_root):
        ctx.save_for_backward(theta)
        ctx.solution, ctx.single_root = solution, single_root
        return logZ64.to(theta.dtype)

    @staticmethod
    def backward(ctx, g):
        (theta,) = ctx.saved_tensors
        _, mu64, certified, lengths = ctx.solution()
        mu = Marginals.apply(theta, mu64, lengths, ctx.single_root, certified)
        # the marginals themselves (no copy); not off the CPU, where the test would read the device
        if not torch.is_grad_enabled() and g.device.type == "cpu" and bool((g == 1).all()):
            return mu, None, None, None
        return g[:, None, None] * mu, None, None, None
