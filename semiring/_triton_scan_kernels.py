"""The Triton kernels of :mod:`.triton_scan`. Imported only when a scan takes them (this module
imports Triton).

One program per example walks every step of the recurrence ``alpha_t[l] = (⊕_k alpha_{t-1}[k] ⊗
x_t[k, l]) ⊗ u_t[l]``, the state vector kept in registers from step to step and each step's matrix a
``[BK, BK]`` tile (K = L states, padded lanes -inf): the whole scan is one launch, its backward
another. The backward walks the steps in reverse with the outside weights: Log, the softmax of each
column of sums times the incoming gradient; Max, the column's first argmax (the forward's own sums,
so a decode agrees with the values exactly) carrying the gradient to one from-state.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def forward(init, xs, unary, alphas, base, T, K,
            s_ib, s_ik, s_xb, s_xt, s_xk, s_xl, s_ub, s_ut, s_ul,
            HAS_UNARY: tl.constexpr, IS_MAX: tl.constexpr, BK: tl.constexpr):
    """``alphas [B, T, K]`` (contiguous) and, in Log with a unary, ``base [B, T, K]``: each step's ⊕
    before the unary (the backward's normalizer)."""
    b = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BK)
    on = k < K
    tile = on[:, None] & on[None, :]
    prev = tl.load(init + b * s_ib + k * s_ik, mask=on, other=float("-inf"))
    at = xs + b * s_xb + k[:, None] * s_xk + k[None, :] * s_xl
    out_at = b * T * K + k
    for t in range(T):
        s = prev[:, None] + tl.load(at + t * s_xt, mask=tile, other=float("-inf"))
        m = tl.max(s, 0)
        if IS_MAX:
            out = m
        else:
            shift = tl.where(m == float("-inf"), 0.0, m)
            out = tl.log(tl.sum(tl.exp(s - shift[None, :]), 0)) + shift
            if HAS_UNARY:
                tl.store(base + out_at + t * K, out, mask=on)
        if HAS_UNARY:
            out += tl.load(unary + b * s_ub + t * s_ut + k * s_ul, mask=on, other=0.0)
        tl.store(alphas + out_at + t * K, out, mask=on)
        prev = out


@triton.jit
def backward(init, xs, alphas, base, grad, g_init, g_xs, g_unary, T, K,
             s_ib, s_ik, s_xb, s_xt, s_xk, s_xl,
             HAS_UNARY: tl.constexpr, IS_MAX: tl.constexpr, PER_STEP: tl.constexpr, BK: tl.constexpr):
    """From ``grad [B, T, K]`` (contiguous): ``g_init [B, K]``, ``g_unary [B, T, K]`` (with a unary)
    and ``g_xs`` ``[B, T, K, K]`` (``PER_STEP``) or ``[B, K, K]``: this example's gradient of the
    matrix summed over the steps (the caller sums the examples where they share it)."""
    b = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BK)
    on = k < K
    tile = on[:, None] & on[None, :]
    at = xs + b * s_xb + k[:, None] * s_xk + k[None, :] * s_xl
    row = b * T * K + k
    square = k[:, None] * K + k[None, :]
    carry = tl.zeros([BK], dtype=grad.dtype.element_ty)
    total = tl.zeros([BK, BK], dtype=grad.dtype.element_ty)
    for j in range(T):
        t = T - 1 - j
        g = tl.load(grad + row + t * K, mask=on, other=0.0) + carry
        if HAS_UNARY:
            tl.store(g_unary + row + t * K, g, mask=on)
        if t > 0:
            prev = tl.load(alphas + row + (t - 1) * K, mask=on, other=float("-inf"))
        else:
            prev = tl.load(init + b * s_ib + k * s_ik, mask=on, other=float("-inf"))
        s = prev[:, None] + tl.load(at + t * s_xt, mask=tile, other=float("-inf"))
        if IS_MAX:
            best = tl.argmax(s, 0, tie_break_left=True)
            w = tl.where(k[:, None] == best[None, :], g[None, :], 0.0)
        else:
            if HAS_UNARY:
                norm = tl.load(base + row + t * K, mask=on, other=0.0)
            else:
                norm = tl.load(alphas + row + t * K, mask=on, other=0.0)
            norm = tl.where(norm == float("-inf"), 0.0, norm)  # a column of -inf sums: weights exp(-inf) = 0
            w = tl.exp(s - norm[None, :]) * g[None, :]
        w = tl.where(tile, w, 0.0)
        if PER_STEP:
            tl.store(g_xs + (b * T + t) * K * K + square, w, mask=tile)
        else:
            total += w
        carry = tl.sum(w, 1)
    tl.store(g_init + b * K + k, carry, mask=on)
    if not PER_STEP:
        tl.store(g_xs + b * K * K + square, total, mask=tile)
