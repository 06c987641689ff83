"""Log-partition and marginals of non-projective dependency trees by the matrix-tree theorem,
exactly at any score scale (Koo et al. 2007): the numerics of
:class:`structures.NonProjectiveDependencyCRF`, which choose, per example, the cheapest path that
is certified or exact.

Potentials ``theta [B, N+1, N+1]`` (``[b, h, m]``: head h -> modifier m, 0 the root; column 0 and
the diagonal unused), ``lengths [B]`` words (None: every example N).

Every score is shifted by its column's (its dependent's) max, which changes each tree's score by
the same constant (every word has exactly one head), so the arc weights ``W = exp(θ - c)`` lie in
``[0, 1]`` with a 1 in every column. Then, per example:

1. **Fast path**: LU of the Laplacian in float64, ``log Z`` from its pivots, ``X = M^{-1}`` and
   Koo et al.'s formulas for the marginals (single root: the Laplacian of the words rooted at one
   word ``c0`` and a rank-one correction). It is kept only where an *a-posteriori bound* of its
   error, computed from the factors at ``O(n^2)`` cost, certifies that ``log Z`` and every
   marginal are within ``TOL = 1e-9`` (absolute) of the exact values. LU of an M-matrix has
   backward error ``|E| <= γ |L||U|``; the bound propagates it through ``X`` with the column sums
   of ``|L||U|`` and the row maxima and absorption times of ``X``. On the CPU, where the optional
   extension is built, the whole batch is one C call (``_matrix_tree_c.c``: the same factorization
   and bound, each example at its own length); on a GPU, the whole path for sentences up to 128 words
   is one Triton launch (:mod:`structures.spanning._certified_triton`: the same
   factorization and bound, in registers); elsewhere torch and LAPACK
   (:mod:`structures.spanning._certified`). ``log Z`` alone (``log_partition`` of potentials that do not
   require grad; otherwise the backward will want the marginals, computed with it) needs no
   inverse: in C, the subtraction-free elimination of step 2 one word at a time, exact without a
   certificate; in torch, the factors, one solve and a bound on ``diag X`` from ``U``. At large
   score scales the pivots cancel, the bound explodes, and the example moves on:
2. **Exact path** (:mod:`structures.spanning._matrix_tree`): subtraction-free elimination
   (Grassmann–Taksar–Heyman) in float64, blocked, with the marginals from leave-one-out
   eliminations instead of Koo's cancelling difference; every quantity is a sum of products of
   non-negative numbers, so the relative error is a small multiple of ``n u`` whatever the scale.
   Its range check (no inverse entry above 1e280, no pivot below 1e-280) sends the rare example
   whose cycles outweigh its trees by more than ~e^640 to
3. **Log space** (same code, log-sum-exp arithmetic): no range limit.

Single root without a strongly connected word graph (``-inf`` arcs) is computed by conditioning
on the root's child (one multi-root problem per candidate).

**Off the CPU** (``device_path``, :func:`_on_device`; opt-in: :data:`DEVICE_PATH`) the choices above would each read the
device (a synchronisation per decision, and no CUDA graph capture), so there every example gets
the certified path *and* the linear exact path, and ``torch.where`` picks its answer: no value is
read and no shape depends on one. The price is the exact path's arithmetic on every query,
certified or not. The examples neither answers (the linear range check failing, or single root
without a strongly connected word graph) are the rare ones: with :data:`RARE_SYNC` (the default)
one read of their mask — the device path's only synchronisation, every query — sends them through
steps 2-3 and the conditioning as above (which synchronise again, only then); with ``RARE_SYNC =
False`` nothing is read and they come back NaN (for CUDA graph capture, which cannot read).

Padding words are isolated nodes hanging from the root with weight 1: they contribute exactly
``log 1 = 0`` and exact zeros to every product, so an example's log-partition does not depend on
the padding (up to float64 rounding of differently blocked sums).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import _certified as cert
from . import _certified_triton
from . import _matrix_tree as mt

try:  # the fast paths in C (_matrix_tree_c.c, built at install time where a C compiler is)
    from . import _matrix_tree_c
except ImportError:
    _matrix_tree_c = None

_RANGE = 1e280  # the linear exact path's range check

DEVICE_PATH = False
"""Whether runs off the CPU take the device path by default. Off until it is measured on a GPU: it
pays the exact path's arithmetic on every example, and with :data:`RARE_SYNC` on it still reads the
device once (``python -m benchmarks.gpu`` times it beside the default path)."""

RARE_SYNC = True
"""Device path: whether its rare examples are recomputed exactly after one read of their mask (a
synchronisation every query), or left NaN without any read (see the module doc)."""


def masks(N: int, lengths: Tensor, device) -> tuple[Tensor, Tensor]:
    """``valid [B, N+1, N+1]`` (arcs h -> m of real words, h != m) and ``real [B, N]`` (real words)."""
    pos = torch.arange(N + 1, device=device)
    inside = pos <= lengths.to(device)[:, None]  # root and words 1..n
    valid = inside[:, :, None] & inside[:, None, :] & (pos[:, None] != pos[None, :]) & (pos[None, :] > 0)
    return valid, inside[:, 1:]


def shift(theta: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
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


def feasibility(logW: Tensor, real: Tensor, single_root: bool, shortcut: bool = True) -> tuple[Tensor, Tensor]:
    """``(feasible [B], connected [B])``: some tree has finite score; (single root) the words'
    graph is strongly connected, so that every word can be the root's child. ``shortcut``: the
    reachability is computed only for the examples with a forbidden real arc, which reads the
    device (``shortcut=False``: for every example, no host decision)."""
    fin = torch.isfinite(logW)
    if not shortcut:
        return _reachability(fin, real, single_root)
    B = logW.shape[0]
    real_arcs = torch.cat([real[:, None, :].expand(B, 1, -1), real[:, :, None] & real[:, None, :]], 1)
    eye = torch.eye(real.shape[1], dtype=torch.bool, device=real.device)
    real_arcs[:, 1:] &= ~eye
    full = (fin[:, :, 1:] | ~real_arcs).all(2).all(1)  # no real arc forbidden: both answers True
    feasible = full.clone()
    connected = full.clone()
    if bool(full.all()):
        return feasible, connected
    rows = (~full).nonzero().squeeze(1)
    feasible[rows], connected[rows] = _reachability(fin[rows], real[rows], single_root)
    return feasible, connected


def _reachability(fin: Tensor, real: Tensor, single_root: bool) -> tuple[Tensor, Tensor]:
    """:func:`feasibility` of every example from its finite arcs ``fin [B, N+1, N+1]``."""
    R = _closure(fin[:, 1:, 1:])  # words -> words
    pad = ~real
    reach_all = (R | pad[:, None, :]).all(2) & real  # word c reaches every real word
    if single_root:
        return (reach_all & fin[:, 0, 1:]).any(1), (reach_all | pad).all(1)
    from_root = (fin[:, 0, 1:].double()[:, None, :] @ R.double())[:, 0] > 0
    feasible = (from_root | pad).all(1)
    return feasible, feasible.clone()


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def exact(logW: Tensor, real: Tensor, single_root: bool, ops) -> tuple[Tensor, Tensor, Tensor]:
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
        logT = out["logminor"][:, :n]
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
    z, m = solve(sub, real[bs], single_root=False, fast=True)
    z = z.masked_fill(~torch.isfinite(z), -math.inf)
    zz = torch.full((B, n), -math.inf, dtype=logW.dtype, device=logW.device)
    zz[bs, cs] = z
    logZ = torch.logsumexp(zz, 1)
    w = torch.where(torch.isfinite(z), (z - logZ[bs]).exp(), torch.zeros_like(z))
    mu.index_add_(0, bs, m * w[:, None, None])
    return logZ, mu


def solve(logW: Tensor, real: Tensor, single_root: bool, fast: bool = True, info: dict | None = None):
    """``(log Z(W), μ)`` for column-shifted log-weights ``logW [B, N+1, N+1]`` (-inf off the valid
    arcs), float64; every example through the cheapest path that is certified or exact."""
    B = logW.shape[0]
    logZ = torch.full((B,), -math.inf, dtype=logW.dtype, device=logW.device)
    mu = torch.zeros_like(logW)
    method = ["none"] * B
    feasible, connected = feasibility(logW, real, single_root)
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
        z, m, ok = exact(logW[todo], real[todo], single_root, ops)
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
                                info: dict | None = None, marginals: bool = True,
                                device_path: bool | None = None,
                                dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor | None]:
    """``(log Z [B], μ [B, N+1, N+1])`` in ``dtype`` (computed in float64 and rounded once: the C path
    writes them so, with no float64 copy and no conversion after), exactly (see the module doc). ``fast=False``
    skips the fast paths; ``info['certified']`` (``[B]`` bool, on θ's device) tells where the fast
    path answered and, off the device path, ``info['method']`` which path answered each example
    (``fast``: the certified path or, for log Z alone, the C elimination; ``lin``, ``log``,
    ``conditioned`` or ``none`` where no tree exists).
    ``marginals=False``: log Z alone (μ is None), the fast path without an inverse.
    ``device_path`` (None: :data:`DEVICE_PATH` on every device but the CPU; ignored with
    ``fast=False``): the path of :func:`_on_device`, without host decisions."""
    x = theta.detach()
    B, N1, _ = x.shape
    dev = x.device
    if device_path is None:
        device_path = DEVICE_PATH and dev.type != "cpu"
    if fast and device_path:
        logZ, mu, certified, rare = _on_device(x, lengths, single_root, marginals)
        if info is not None:
            info["certified"] = certified
        if RARE_SYNC:
            rows = rare.nonzero().squeeze(1)  # the one synchronisation of the device path
            if rows.numel():
                _exact_rows(x, lengths, single_root, rows, logZ, mu)
        return _converted(logZ, mu, dtype)
    if fast and _matrix_tree_c is not None and dev.type == "cpu":
        logZ, mu, ok, failed = _in_c(x, lengths, single_root, marginals, dtype)
    elif fast:
        logZ, mu, ok = _fast(x, single_root, marginals, _masks(N1 - 1, lengths, dev))
        failed = not bool(ok.all())
    if fast:
        if not failed:
            if info is not None:
                info["method"] = ["fast"] * B
                info["certified"] = ok
            return _converted(logZ, mu, dtype)
        rows = (~ok).nonzero().squeeze(1)
        method = ["fast" if o else "" for o in ok.tolist()]
    else:
        logZ = x.new_zeros(B, dtype=dtype)
        mu = x.new_zeros(B, N1, N1, dtype=dtype) if marginals else None
        rows = torch.arange(B, device=dev)
        method = [""] * B
    for i, name in zip(rows.tolist(), _exact_rows(x, lengths, single_root, rows, logZ, mu)):
        method[i] = name
    if info is not None:
        info["method"] = method
        info["certified"] = torch.tensor([m == "fast" for m in method], dtype=torch.bool, device=dev)
    return _converted(logZ, mu, dtype)


def _converted(logZ: Tensor, mu: Tensor | None, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """``(log Z, μ)`` in ``dtype`` (no copy where they are in it already)."""
    return logZ.to(dtype), None if mu is None else mu.to(dtype)


def _fast(x: Tensor, single_root: bool, marginals: bool,
          masks_: tuple[Tensor | None, Tensor | None]) -> tuple[Tensor, Tensor | None, Tensor]:
    """``(log Z [B], μ or None, ok [B])`` of every example by the certified fast path in torch
    (:mod:`structures.spanning._certified`; on a GPU one Triton launch,
    :mod:`structures.spanning._certified_triton`), ``ok`` where it is certified; ``masks_``: :func:`_masks`."""
    B, N1, _ = x.shape
    N = N1 - 1
    valid, real = masks_
    in_kernel = _certified_triton.applies(x)
    if in_kernel or marginals:
        logW, c = _shifted(x, valid)
        W, real = logW.exp_(), _real(real, B, N, x.device)
        z, mu, ok = (_certified_triton.certified(W, real, single_root, marginals) if in_kernel
                     else cert.marginals(W, real, single_root))
    else:
        Wt, root, c = _word_weights(x, valid)
        (z, ok), mu = cert.log_partition(Wt, root, real, single_root), None
    return z.add_(c.sum(1)), mu, ok


def _exact_rows(x: Tensor, lengths: Tensor | None, single_root: bool, rows: Tensor, logZ: Tensor,
                mu: Tensor | None) -> list[str]:
    """Writes the examples ``rows`` of ``logZ`` and ``mu`` (if not None) by :func:`solve` without
    the fast path; returns the path that answered each (host decisions: it synchronises)."""
    B, N1, _ = x.shape
    valid, real = _masks(N1 - 1, lengths, x.device)
    sub: dict = {}
    logW, c = _shifted(x[rows], None if valid is None else valid[rows])
    z, m = solve(logW, _real(real, B, N1 - 1, x.device)[rows], single_root, False, sub)
    logZ[rows] = (z + c.sum(1)).to(logZ.dtype)
    if mu is not None:
        mu[rows] = m.to(mu.dtype)
    return sub["method"]


def _on_device(x: Tensor, lengths: Tensor | None, single_root: bool,
               marginals: bool) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
    """``(log Z [B], μ or None, certified [B], rare [B])`` with no host decision (no value read
    from the device, no shape that depends on one): the certified fast path (:func:`_fast`) and
    the exact linear path (:func:`exact`, ``mt.LIN``) both for every example, each example's
    answer chosen by ``torch.where``, -inf and zero marginals where no tree exists. ``rare``: the
    examples neither answers, NaN here: the linear path's range check failed (cycles outweighing
    trees by ~e^640), or single root without a strongly connected word graph (``-inf`` arcs).

    The exact path is paid for on every example, every query (about twice the fast path's
    arithmetic), because deciding to skip it would read the device."""
    B, N1, _ = x.shape
    N = N1 - 1
    valid, real = (None, None) if lengths is None else masks(N, lengths, x.device)
    logZ, mu, certified = _fast(x, single_root, marginals, (valid, real))
    real = _real(real, B, N, x.device)
    logW, c = _shifted(x, valid)
    feasible, connected = feasibility(logW, real, single_root, shortcut=False)
    z, m, ok = exact(logW, real, single_root, mt.LIN)
    lin = ~certified & feasible & connected & ok
    rare = ~certified & feasible & ~lin
    nan = torch.full_like(z, math.nan)
    logZ = torch.where(certified, logZ, torch.where(lin, z + c.sum(1), torch.where(rare, nan, -math.inf)))
    if mu is not None:
        mu = torch.where(certified[:, None, None], mu,
                         torch.where(lin[:, None, None], m, torch.where(rare[:, None, None], math.nan, 0.0)))
    return logZ, mu, certified, rare


def _masks(N: int, lengths: Tensor | None, device) -> tuple[Tensor | None, Tensor | None]:
    """:func:`masks`, or ``(None, None)`` where every example has all N words."""
    if lengths is None or bool((lengths == N).all()):
        return None, None
    return masks(N, lengths, device)


def _real(real: Tensor | None, B: int, N: int, device) -> Tensor:
    """``real [B, N]`` (None: every word real)."""
    return torch.ones(B, N, dtype=torch.bool, device=device) if real is None else real


def _shifted(x: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor]:
    """``(θ - c, c [b, N])`` in float64 (a copy), -inf on the arcs that do not exist (``valid``
    False; None: every example full, the diagonal and column 0), c the max of every column."""
    out = x.to(torch.float64, copy=True)
    if valid is None:
        out.diagonal(dim1=-2, dim2=-1).fill_(-math.inf)
        out.select(2, 0).fill_(-math.inf)
    else:
        out.masked_fill_(~valid, -math.inf)
    c = out[:, :, 1:].amax(1).nan_to_num_(neginf=0.0)  # padding words and words without heads (-inf)
    out[:, :, 1:].sub_(c[:, None, :])
    return out, c


def _in_c(x: Tensor, lengths: Tensor | None, single_root: bool, marginals: bool,
          dtype: torch.dtype) -> tuple[Tensor, Tensor | None, Tensor, int]:
    """``(log Z [B], μ [B, N+1, N+1] or None, ok [B], how many not ok)`` on the CPU by the C extension
    (``_matrix_tree_c.c``), every example at its own length: log Z alone by the subtraction-free
    elimination (exact at any scale, no certificate), with the marginals by the certified path of
    :mod:`structures.spanning._certified` (the same factorization and bound); not ok where that bound does not
    certify, where a pivot underflows or no tree exists, or for NaN or +inf scores. The examples
    are split across up to ``torch.get_num_threads()`` threads, each with :data:`_THREAD_WORK`."""
    B, N1, _ = x.shape
    t = x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float64)
    t = t.contiguous()
    n = None if lengths is None else lengths.to(torch.int64).contiguous()
    out32 = dtype == torch.float32  # (written so by the C call; other dtypes are converted from float64)
    out = torch.float32 if out32 else torch.float64
    logZ = torch.empty(B, dtype=out)
    ok = torch.empty(B, dtype=torch.bool)
    parts = max(1, min(torch.get_num_threads(), B, B * (N1 - 1) ** 3 // _THREAD_WORK))
    # (addresses, not numpy views: a view costs more than the C call at small sizes)
    args = (t.data_ptr(), t.dtype == torch.float32, B, N1, 0 if n is None else n.data_ptr(), single_root, logZ.data_ptr(), ok.data_ptr())
    if not marginals:
        return logZ, None, ok, _matrix_tree_c.log_partition(*args, out32, parts)
    mu = torch.empty(B, N1, N1, dtype=out)
    return logZ, mu, ok, _matrix_tree_c.marginals(*args, mu.data_ptr(), out32, parts)


_THREAD_WORK = 1 << 20
"""Multiply-adds (``n^3`` per example) a thread of the C extension is worth: starting one costs
tens of microseconds."""


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
