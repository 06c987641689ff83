"""Exact samples of non-projective dependency trees (spanning arborescences): Wilson's algorithm
where its random walks are short, sequential conditioning on exact marginals elsewhere."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._tree_partition import feasibility, masks, shift, solve

__all__ = ["sample_arborescences"]


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
        _, mm = solve(lw, real, single_root=False)
        p = torch.where(on[:, None], mm[:, :, m], torch.ones_like(mm[:, :, m]))
        h = torch.multinomial(p, 1, generator=generator)[:, 0]
        off = on[:, None] & (torch.arange(N1, device=logW.device) != h[:, None])
        lw[:, :, m] = lw[:, :, m].masked_fill(off, -math.inf)
        heads[:, m] = torch.where(on, h, heads[:, m])
    return heads


def sample_arborescences(theta: Tensor, lengths: Tensor, single_root: bool, copies: int = 1,
                         budget: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """``copies`` exact samples of heads of every example of arc scores ``theta [U, N+1, N+1]``
    (``[u, h, m]``, 0 the root) with ``lengths [U]`` words: ``[copies * U, N]`` long (row
    ``j * U + u`` is the j-th sample of example u, 0 past its length), float64 inside.

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
    valid, real = masks(N, lengths, dev)
    if budget is None:
        budget = 50.0 * N1
    logW, _ = shift(theta, valid)
    R = copies * U
    idx = torch.arange(R, device=dev) % U
    if single_root:
        logZ, mu = solve(logW, real, single_root=True)
        alive = torch.isfinite(logZ)
        p0 = torch.where(alive[:, None], mu[:, 0, 1:], real.double())
        c = torch.multinomial(p0[idx], 1, generator=generator)[:, 0] + 1  # [R]
        # the problems: (example, root child) pairs
        key, pid = torch.unique(idx * N1 + c, return_inverse=True)
        pu, pc = key // N1, key % N1
        plw = logW[pu].clone()
        plw[:, 0, :] = plw[:, 0, :].masked_fill(torch.arange(N1, device=dev) != pc[:, None], -math.inf)
        plw, _ = shift(plw, valid[pu])
        preal = real[pu]
        palive = alive[pu]
    else:
        plw, preal, pid = logW, real, idx
        palive = feasibility(logW, real, False)[0]
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
