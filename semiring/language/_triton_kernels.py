"""The Triton kernels of :mod:`.triton_levels`: the twins of ``_kernel.c``'s loops, reading the same
descriptors (:mod:`.pack`). Imported only when a run takes them (this module imports Triton).

One program per example runs a whole stretch of levels: a level's items depend only on earlier
levels of their own example, so the program loops over the levels and their steps inside, a barrier
between steps (each step's writes are visible to the next within the block), and the stretch costs
one launch. A level with much work per example (a PCFG's, with its labels cubed) runs instead a step
per launch, each example's item tiles shared by several programs. A step's box is walked in tiles of ``BI`` items by ``BK`` instances: the position of a
term at (item i, instance k) is ``offset + Σ_{d < nL} stride_d coord_d(i) + Σ_{d >= nL} stride_d
coord_d(k)``, the item part a ``[BI]`` vector and the instance part a ``[BK]`` vector (their
coordinates unravelled once per tile, not per instance), and so are the masks' affine forms. The
backward recomputes the terms and adds each instance's weight into the gradients with atomic adds
(several items, and several examples where an input is shared by the batch, read one position).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _along(idx, sizes, strides, lo, hi):
    """``Σ_{lo <= d < hi} strides[d] * c_d`` where ``idx`` (any shape) is the linear index of the
    coordinates ``c_lo..c_{hi-1}`` over ``sizes[lo:hi]``, the last fastest."""
    out = idx.to(tl.int64) * 0
    rest = idx.to(tl.int32)  # (coordinates fit 32 bits, and a 64-bit division costs several times more)
    for j in range(hi - lo):
        d = hi - 1 - j
        size = tl.load(sizes + d).to(tl.int32)
        out += (rest % size).to(tl.int64) * tl.load(strides + d)
        rest = rest // size
    return out


@triton.jit
def _address(table, src, b, DTYPE: tl.constexpr):
    """Where example ``b`` of buffer ``src`` starts (the table holds (address, batch stride) per buffer)."""
    at = tl.load(table + 2 * src)
    return at.to(tl.pointer_type(DTYPE), bitcast=True) + b * tl.load(table + 2 * src + 1)


@triton.jit
def _position(rd, n, nL, sizes, table, b, ii, kk, valid):
    """A read's positions at items ``ii`` and instances ``kk`` (broadcast together; their looked-up
    indices read where ``valid``), clamped where it gathers, and where the next read's descriptor starts."""
    bound = tl.load(rd + 2 + n)
    at = tl.load(rd + 1) + _along(ii, sizes, rd + 2, 0, nL) + _along(kk, sizes, rd + 2, nL, n)
    lk = rd + 4 + n
    for _ in range(tl.load(rd + 3 + n)):
        bound_l = tl.load(lk + 3)
        at_l = tl.load(lk + 2) + _along(ii, sizes, lk + 4, 0, nL) + _along(kk, sizes, lk + 4, nL, n)
        if bound_l > 0:
            at_l = tl.minimum(tl.maximum(at_l, 0), bound_l - 1)
        at += tl.load(lk + 1) * tl.load(_address(table, tl.load(lk), b, tl.int64) + at_l, mask=valid, other=0)
        lk += 4 + n
    if bound > 0:
        at = tl.minimum(tl.maximum(at, 0), bound - 1)
    return at, lk


@triton.jit
def _next(rd, n):
    """Where the read after the one at ``rd`` starts."""
    return rd + 4 + n + tl.load(rd + 3 + n) * (4 + n)


@triton.jit
def _varies(rd, n, nL):
    """Whether a read's position varies with the K coordinates (its own strides or its lookups')."""
    out = n * 0
    for d in range(nL, n):
        out += tl.abs(tl.load(rd + 2 + d))
    lk = rd + 4 + n
    for _ in range(tl.load(rd + 3 + n)):
        for d in range(nL, n):
            out += tl.abs(tl.load(lk + 4 + d))
        lk += 4 + n
    return out != 0


@triton.jit
def _terms(reads, masks, R, M, n, nL, sizes, table, b, items, ks, valid, DTYPE: tl.constexpr, PAIRS: tl.constexpr, S):
    """``[BI, BK]``: the sum of the step's reads at (item, instance), -inf where no instance is; and
    (``PAIRS``) the sum of their tangents, whose table rows follow the values' (``S`` buffers on), 0
    where no instance is (else 0 everywhere)."""
    t = tl.zeros(valid.shape, DTYPE)
    dt = tl.zeros(valid.shape, DTYPE)
    rd = reads
    for r in range(R):
        at, next_rd = _position(rd, n, nL, sizes, table, b, items[:, None], ks[None, :], valid)
        src = tl.load(rd)
        t += tl.load(_address(table, src, b, DTYPE) + at, mask=valid, other=0.0)
        if PAIRS:
            dt += tl.load(_address(table, src + S, b, DTYPE) + at, mask=valid, other=0.0)
        rd = next_rd
    for j in range(M):
        md = masks + j * (2 + n)
        e = tl.load(md + 1) + _along(items, sizes, md + 2, 0, nL)[:, None] + _along(ks, sizes, md + 2, nL, n)[None, :]
        valid = valid & tl.where(tl.load(md) == 0, e >= 0, e != 0)
    return tl.where(valid, t, float("-inf")), tl.where(valid, dt, 0.0)


@triton.jit
def _logaddexp(a, b):
    """``_kernel.c``'s logaddexp: NaN propagates, an infinite max is the answer."""
    m = tl.maximum(a, b)
    lo = tl.minimum(a, b)
    r = m + tl.log(1.0 + tl.exp(lo - m))
    r = tl.where((m == float("inf")) | (m == float("-inf")), m, r)
    return tl.where((a != a) | (b != b), a + b, r)


@triton.jit
def _best(reads, masks, R, M, n, nL, sizes, table, b, items, iv, K, DTYPE: tl.constexpr, BI: tl.constexpr,
          BK: tl.constexpr):
    """The Max semiring's item ``[BI]`` and the first instance reaching it (the first NaN where one is)."""
    best = tl.full([BI], float("-inf"), DTYPE)
    at = items * 0
    nan = items < 0
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        t, _ = _terms(reads, masks, R, M, n, nL, sizes, table, b, items, ks, iv[:, None] & (ks < K)[None, :], DTYPE, False, 0)
        kk = ks[None, :] + items[:, None] * 0
        isnan = t != t
        first_nan = tl.min(tl.where(isnan, kk, K), 1)
        t = tl.where(isnan, float("-inf"), t)
        top = tl.max(t, 1)
        first_top = tl.min(tl.where(t == top[:, None], kk, K), 1)
        take_nan = (first_nan < K) & ~nan
        take = ~nan & ~take_nan & (top > best)
        best = tl.where(take_nan, float("nan"), tl.where(take, top, best))
        at = tl.where(take_nan, first_nan, tl.where(take, first_top, at))
        nan = nan | take_nan
    return best, at


@triton.jit
def _parse(p):
    """The step whose descriptor starts at ``p``: its counts, where its sizes, reads, heads and
    masks start, its number of items and of instances per item."""
    n = tl.load(p)
    nL = tl.load(p + 1)
    R = tl.load(p + 2)
    sizes = p + 7
    reads = sizes + n
    rd = reads
    for _ in range(R):
        rd = _next(rd, n)
    I = n * 0 + 1
    for d in range(nL):
        I *= tl.load(sizes + d)
    K = n * 0 + 1
    for d in range(nL, n):
        K *= tl.load(sizes + d)
    return n, nL, R, tl.load(p + 3), tl.load(p + 4), sizes, reads, rd, rd + tl.load(p + 3) * (2 + nL), I, K


@triton.jit
def _step_forward(p, table, b, active, IS_MAX: tl.constexpr, DTYPE: tl.constexpr, LOWEST: tl.constexpr,
                  BI: tl.constexpr, BK: tl.constexpr, PAIRS: tl.constexpr, S):
    """One step of a level into its heads (where ``active``; this program's tiles of its items: every
    ``num_programs(1)``-th); returns where the next step's descriptor starts. ``PAIRS``: Log on pairs
    (value, tangent), the tangents' table rows ``S`` after the values': an item of terms t with
    tangents τ is (log Σ e^t, Σ p τ), p = softmax(t) (execute._pair_logsumexp)."""
    n, nL, R, H, M, sizes, reads, heads, masks, I, K = _parse(p)
    accumulate = tl.load(p + 5)
    for i0 in range(tl.program_id(1) * BI, I * active, tl.num_programs(1) * BI):
        items = i0 + tl.arange(0, BI)
        iv = items < I
        dv = tl.zeros([BI], DTYPE)
        if IS_MAX:
            v, _ = _best(reads, masks, R, M, n, nL, sizes, table, b, items, iv, K, DTYPE, BI, BK)
        else:
            m = tl.full([BI], LOWEST, DTYPE)
            s = tl.zeros([BI], DTYPE)
            for k0 in range(0, K, BK):
                ks = k0 + tl.arange(0, BK)
                t, dt = _terms(reads, masks, R, M, n, nL, sizes, table, b, items, ks, iv[:, None] & (ks < K)[None, :], DTYPE,
                               PAIRS, S)
                top = tl.minimum(tl.maximum(m, tl.max(t, 1)), -LOWEST)
                scale = tl.exp(m - top)
                e = tl.exp(t - top[:, None])
                s = s * scale + tl.sum(e, 1)
                if PAIRS:
                    dv = dv * scale + tl.sum(e * dt, 1)
                m = top
            v = tl.log(s) + m
            if PAIRS:
                dv = dv / tl.maximum(s, 1.0)  # (s >= 1 where any term is finite)
        for h in range(H):
            hd = heads + h * (2 + nL)
            at = tl.load(hd + 1) + _along(items, sizes, hd + 2, 0, nL)
            y = _address(table, tl.load(hd), b, DTYPE) + at
            out = v
            if accumulate != 0:
                old = tl.load(y, mask=iv, other=0.0)
                if IS_MAX:
                    out = tl.where((v != v) | ((old == old) & (v > old)), v, old)
                elif PAIRS:  # (old, its tangent) ⊕ (v, dv)
                    ty = _address(table, tl.load(hd) + S, b, DTYPE) + at
                    top = tl.minimum(tl.maximum(tl.maximum(old, v), LOWEST), -LOWEST)
                    pa = tl.exp(old - top)
                    pb = tl.exp(v - top)
                    z = pa + pb
                    tl.store(ty, (pa * tl.load(ty, mask=iv, other=0.0) + pb * dv) / tl.maximum(z, 1.0), mask=iv)
                    out = tl.log(z) + top
                else:
                    out = _logaddexp(old, v)
            elif PAIRS:
                tl.store(_address(table, tl.load(hd) + S, b, DTYPE) + at, dv, mask=iv)
            tl.store(y, out, mask=iv)
    return masks + M * (2 + n)


@triton.jit
def _step_backward(p, table, gtable, b, active, IS_MAX: tl.constexpr, DTYPE: tl.constexpr, LOWEST: tl.constexpr,
                   BI: tl.constexpr, BK: tl.constexpr, SEM: tl.constexpr, PAIRS: tl.constexpr, S):
    """One step's gradients into its reads' gradient buffers (the Log weights exp(terms - item) of
    the gradient at its items; Max: all of it to the best instance, where several rules write the
    item the first rule reaching it claiming it; where ``active``, this program's tiles of its items);
    returns where the next step's descriptor starts. ``PAIRS``: the gradient g (tangent γ) of an item
    a (tangent α) reaches its instances as w = e^(t - a) g with tangent e^(t - a) (γ + g (τ - α))."""
    n, nL, R, H, M, sizes, reads, heads, masks, I, K = _parse(p)
    shared = tl.load(p + 6)
    passes = (n == nL) & (shared == 0)  # one instance alone writes the item: the gradient passes
    for i0 in range(tl.program_id(1) * BI, I * active, tl.num_programs(1) * BI):
        items = i0 + tl.arange(0, BI)
        iv = items < I
        g = tl.zeros([BI], DTYPE)
        dg = tl.zeros([BI], DTYPE)
        for h in range(H):
            hd = heads + h * (2 + nL)
            at = tl.load(hd + 1) + _along(items, sizes, hd + 2, 0, nL)
            g += tl.load(_address(gtable, tl.load(hd), b, DTYPE) + at, mask=iv, other=0.0, cache_modifier=".cg")
            if PAIRS:
                dg += tl.load(_address(gtable, tl.load(hd) + S, b, DTYPE) + at, mask=iv, other=0.0, cache_modifier=".cg")
        hd = heads
        at = tl.load(hd + 1) + _along(items, sizes, hd + 2, 0, nL)
        item = tl.load(_address(table, tl.load(hd), b, DTYPE) + at, mask=iv, other=0.0)
        da = tl.zeros([BI], DTYPE)
        if PAIRS:
            da = tl.load(_address(table, tl.load(hd) + S, b, DTYPE) + at, mask=iv, other=0.0)
        live = iv & ((g != 0) | (dg != 0)) & (items * 0 + K > 0)
        if IS_MAX:
            best, kb = _best(reads, masks, R, M, n, nL, sizes, table, b, items, live, K, DTYPE, BI, BK)
            if shared != 0:
                live = live & (best == item)
                for h in range(H):
                    hd = heads + h * (2 + nL)
                    at = tl.load(hd + 1) + _along(items, sizes, hd + 2, 0, nL)
                    tl.store(_address(gtable, tl.load(hd), b, DTYPE) + at, tl.zeros([BI], DTYPE), mask=live)
            rd = reads
            for r in range(R):
                at, next_rd = _position(rd, n, nL, sizes, table, b, items, kb, live)
                tl.atomic_add(_address(gtable, tl.load(rd), b, DTYPE) + at, g, mask=live, sem=SEM)
                rd = next_rd
        else:
            item = tl.minimum(tl.maximum(item, LOWEST), -LOWEST)
            for k0 in range(0, K, BK):
                ks = k0 + tl.arange(0, BK)
                valid = live[:, None] & (ks < K)[None, :]
                dw = tl.zeros([BI, BK], DTYPE)
                if passes:
                    w = tl.where(valid, g[:, None] + tl.zeros([BI, BK], DTYPE), 0.0)
                    if PAIRS:
                        dw = tl.where(valid, dg[:, None] + tl.zeros([BI, BK], DTYPE), 0.0)
                else:
                    t, dt = _terms(reads, masks, R, M, n, nL, sizes, table, b, items, ks, valid, DTYPE, PAIRS, S)
                    e = tl.exp(t - item[:, None])
                    w = tl.where(valid, e * g[:, None], 0.0)
                    if PAIRS:
                        dw = tl.where(valid, e * (dg[:, None] + g[:, None] * (dt - da[:, None])), 0.0)
                rd = reads
                for r in range(R):
                    src = tl.load(rd)
                    if _varies(rd, n, nL):
                        pos = _position(rd, n, nL, sizes, table, b, items[:, None], ks[None, :], valid)[0]
                        tl.atomic_add(_address(gtable, src, b, DTYPE) + pos, w, mask=valid, sem=SEM)
                        if PAIRS:
                            tl.atomic_add(_address(gtable, src + S, b, DTYPE) + pos, dw, mask=valid, sem=SEM)
                    else:  # the term does not vary with K: one add per item
                        one = _position(rd, n, nL, sizes, table, b, items, items * 0, live)[0]
                        tl.atomic_add(_address(gtable, src, b, DTYPE) + one, tl.sum(w, 1), mask=live, sem=SEM)
                        if PAIRS:
                            tl.atomic_add(_address(gtable, src + S, b, DTYPE) + one, tl.sum(dw, 1), mask=live, sem=SEM)
                    rd = _next(rd, n)
    return masks + M * (2 + n)


# (level numbers and sources are not specialized on: Triton would compile a variant for 1 and for multiples of 16)
@triton.jit(do_not_specialize=["S", "first", "last", "only"])
def forward(desc, starts, table, S, first, last, only, IS_MAX: tl.constexpr, DTYPE: tl.constexpr, LOWEST: tl.constexpr,
            BI: tl.constexpr, BK: tl.constexpr, PAIRS: tl.constexpr):
    """Levels ``first..last-1`` of example ``program_id(0)``, in order (``only`` >= 0: that step of
    the level alone, its item tiles shared by the ``num_programs(1)`` programs of the example).
    ``PAIRS``: Log on pairs (value, tangent), the table's rows of tangents ``S`` after the values'."""
    b = tl.program_id(0).to(tl.int64)
    for lev in range(first, last):
        p = desc + tl.load(starts + lev)
        count = tl.load(p)
        p += 1
        for j in range(count):
            active = ((only < 0) | (j == only)).to(tl.int64)
            p = _step_forward(p, table, b, active, IS_MAX, DTYPE, LOWEST, BI, BK, PAIRS, S)
            tl.debug_barrier()


@triton.jit(do_not_specialize=["S", "first", "last", "only"])
def backward(desc, starts, table, gtable, S, first, last, only, IS_MAX: tl.constexpr, DTYPE: tl.constexpr,
             LOWEST: tl.constexpr, BI: tl.constexpr, BK: tl.constexpr, SEM: tl.constexpr, PAIRS: tl.constexpr):
    """The gradients of levels ``last-1`` down to ``first`` of example ``program_id(0)`` (``only``:
    as :func:`forward`'s, the backward descriptor's steps counted). ``SEM``: the atomic adds'
    memory semantics; the gradients a step reads are loaded from L2 (``.cg``), where atomic adds
    land, so relaxed adds are seen after the barrier that ends their step."""
    b = tl.program_id(0).to(tl.int64)
    for j in range(last - first):
        p = desc + tl.load(starts + last - 1 - j)
        count = tl.load(p)
        p += 1
        for k in range(count):
            active = ((only < 0) | (k == only)).to(tl.int64)
            p = _step_backward(p, table, gtable, b, active, IS_MAX, DTYPE, LOWEST, BI, BK, SEM, PAIRS, S)
            tl.debug_barrier()
