"""The Log and Max semirings' scans (:meth:`~semiring.semirings.Semiring.scan`) on a GPU: one Triton
launch forward and one backward, where torch calls take a handful of launches per step.

A chain program's levels (an EmissionCRF's, an HMM's, a linear-chain CRF's: :class:`~semiring.language.plan.Scan`)
and ``nn.CRF`` run through the scan; eager on a GPU, its per-step torch calls made a query thousands
of launches. The kernels (:mod:`._triton_scan_kernels`) keep the state vector in registers, so they
take states up to :data:`MAX_STATES`; beyond it, other dtypes, component dimensions, the CPU, or
where Triton is missing, the torch calls run as before. Tests run them in Triton's interpreter on CPU
tensors (:data:`interpreting`, ``TRITON_INTERPRET=1`` set before the first run).
"""

from __future__ import annotations

import importlib.util

import torch
from torch import Tensor

from .switch import Switch

MAX_STATES = 128
enabled = Switch(importlib.util.find_spec("triton") is not None)
interpreting = Switch(False)


def applies(init: Tensor, xs: Tensor, unary: Tensor | None) -> bool:
    """Whether a scan of these tensors (``init [B, K]``, ``xs [B or 1, T or 1, K, K]``, ``unary [B,
    T, K]`` or None) is these kernels': on one CUDA device (or the CPU while :data:`interpreting`),
    float32 or float64 alike, K <= :data:`MAX_STATES`, not during CUDA graph capture (its launches
    take no host table and could be captured, but that has not run on a device yet, and a first
    launch compiles, which capture cannot)."""
    steps = unary.shape[1] if unary is not None else xs.shape[-3] if xs.dim() == 4 else 0
    if not enabled or init.dim() != 2 or xs.dim() != 4 or xs.shape[-1] != xs.shape[-2] or not (init.shape[0] and steps):
        return False
    tensors = [t for t in (init, xs, unary) if t is not None]
    device = init.device
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return False
    elif not (device.type == "cpu" and interpreting):
        return False
    return (0 < xs.shape[-1] <= MAX_STATES and init.shape[-1] == xs.shape[-1]
            and init.dtype in (torch.float32, torch.float64)
            and all(t.device == device and t.dtype == init.dtype for t in tensors))


def _strides(t: Tensor) -> list[int]:
    return [0 if n == 1 else s for n, s in zip(t.shape, t.stride())]


def _block(K: int) -> dict:
    import triton

    BK = triton.next_power_of_2(K)
    return dict(BK=BK, num_warps=8 if BK >= 128 else 4 if BK >= 32 else 1)


def forward(init: Tensor, xs: Tensor, unary: Tensor | None, is_max: bool) -> tuple[Tensor, Tensor]:
    """``(alphas [B, T, K], base)``: every step's state, and (Log with a unary) each step's ⊕ before
    the unary, else ``alphas`` again."""
    from . import _triton_scan_kernels as kernels

    B, K = init.shape
    T = unary.shape[1] if unary is not None else xs.shape[1]
    alphas = init.new_empty(B, T, K)
    base = init.new_empty(B, T, K) if unary is not None and not is_max else alphas
    u = unary if unary is not None else alphas
    kernels.forward[(B,)](init, xs, u, alphas, base, T, K, *_strides(init), *_strides(xs), *_strides(u)[:3],
                          HAS_UNARY=unary is not None, IS_MAX=is_max, **_block(K))
    return alphas, base


def backward(init: Tensor, xs: Tensor, unary: Tensor | None, alphas: Tensor, base: Tensor, grad: Tensor,
             is_max: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """The gradients of ``(init, xs, unary)`` from ``grad [B, T, K]``, the gradient of ``alphas``
    (Max: the backtrace, each state's gradient carried to its first best predecessor)."""
    from . import _triton_scan_kernels as kernels

    B, T, K = alphas.shape
    per_step = xs.shape[1] > 1
    grad = grad.contiguous()
    g_init = torch.empty_like(init, memory_format=torch.contiguous_format)
    g_xs = init.new_empty((B, T, K, K) if per_step else (B, K, K))
    g_unary = torch.empty_like(grad) if unary is not None else None
    kernels.backward[(B,)](init, xs, alphas, base, grad, g_init, g_xs, g_unary if g_unary is not None else grad, T, K,
                           *_strides(init), *_strides(xs), HAS_UNARY=unary is not None, IS_MAX=is_max,
                           PER_STEP=per_step, **_block(K))
    if xs.shape[0] == 1:
        g_xs = g_xs.sum(0, keepdim=True)
    return g_init, g_xs.reshape(xs.shape), g_unary
