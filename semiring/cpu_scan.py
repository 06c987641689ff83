"""The Log and Max semirings' scans (:meth:`~semiring.semirings.Semiring.scan`) on the CPU: one call
of a C loop forward and one backward (``_scan.c``), where torch calls take a handful of dispatches per
step and the language's kernel a level per step.

The Log forward keeps its state relative to a running shift (a double), so float32 weights keep
their precision at any length, and, where the backward is wanted, keeps the weights ``exp(term -
column max)`` (one number per entry of ``xs``): the backward is then products only. The Max scan does
the torch calls' float operations, so it gives the same bits, and its backward is Viterbi's backtrace.
Where the extension was not built (setup.py), for other dtypes or component dimensions, the torch
calls run as before.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .switch import Switch

try:  # built at install time where a C compiler is (setup.py)
    from . import _scan
except ImportError:  # pragma: no cover - the torch calls run instead
    _scan = None

enabled = Switch(_scan is not None)

KEEP = 1 << 26  # the most weights a Log scan keeps for its backward beyond twice its matrices' numbers (256 MiB in float32)
SHARED_TERMS = {torch.float32: 40_000, torch.float64: 12_000}
"""A Log scan of one matrix for every step and example (an HMM's, an EmissionCRF's, ``nn.CRF``'s) is
this kernel's only up to this many terms a step (``B K^2``): it takes an exp of each, where the torch
scan multiplies ``exp(state)`` by ``exp(matrix)`` once computed (a matrix product, ``B K`` exps a
step), which wins beyond (EmissionCRF marginals, one thread, Intel Xeon, 2026-11-28: the C scan
1.1-1.5x faster at 16-33 thousand terms in float32 and 9 thousand in float64, 0.67-0.78x at 49-65
thousand and 16 thousand, 0.07-0.14x at half a million and more: an HMM's batch of 256)."""
_UNARY, _KEEP, _SHARED_GRAD = 1, 2, 4  # _scan.c's flags


def applies(init: Tensor, xs: Tensor, unary: Tensor | None, keep: bool = False, log: bool = True) -> bool:
    """Whether a scan of these tensors (``init [B, K]``, ``xs [B or 1, T or 1, K, K]``, ``unary [B,
    T, K]`` or None) is this kernel's: built and enabled, every tensor on the CPU in float32 or
    float64 alike, and (``keep``: a Log scan whose backward is wanted) its weights within
    :data:`KEEP` (a matrix per step keeps as many numbers as it reads; one for every step, B T times
    as many); a ``log`` scan of one matrix for every step and example, within :data:`SHARED_TERMS`."""
    if not enabled or init.dim() != 2 or xs.dim() != 4 or xs.shape[-1] != xs.shape[-2] or init.shape[-1] != xs.shape[-1]:
        return False
    tensors = [t for t in (init, xs, unary) if t is not None]
    steps = unary.shape[1] if unary is not None else xs.shape[1]
    B, K = init.shape
    if keep and B * steps * K * _pad(K) > max(KEEP, 2 * xs.numel()):
        return False
    if log and xs.shape[0] == xs.shape[1] == 1 and B * K * K > SHARED_TERMS.get(init.dtype, 0):
        return False
    return (B > 0 and steps > 0 and K > 0 and xs.shape[1] in (1, steps)
            and xs.shape[0] in (1, init.shape[0]) and (unary is None or unary.shape == (B, steps, K))
            and init.dtype in (torch.float32, torch.float64)
            and all(t.device.type == "cpu" and t.dtype == init.dtype and t.layout == torch.strided for t in tensors))


def _strides(t: Tensor) -> list[int]:
    return [0 if n == 1 else s for n, s in zip(t.shape, t.stride())]


def _pad(K: int) -> int:
    return -(-K // _scan.PAD_TO) * _scan.PAD_TO


def _args(init: Tensor, xs: Tensor, unary: Tensor | None, flags: int, *addresses: Tensor | None) -> np.ndarray:
    B, K = init.shape
    T = unary.shape[1] if unary is not None else xs.shape[1]
    u = [unary.data_ptr(), *_strides(unary)] if unary is not None else [0, 0, 0, 0]
    return np.array([B, T, K, flags | (_UNARY if unary is not None else 0),
                     init.data_ptr(), *_strides(init), xs.data_ptr(), *_strides(xs), *u,
                     *[0 if t is None else t.data_ptr() for t in addresses]], dtype=np.int64)


def forward(init: Tensor, xs: Tensor, unary: Tensor | None, is_max: bool, keep: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """``(alphas [B, T, K], weights, sums)``: every step's state, and (Log, ``keep``) what the
    backward reads, the weights ``[B, T, K, KP]`` and their column sums ``[B, T, K]``."""
    B, K = init.shape
    T = unary.shape[1] if unary is not None else xs.shape[1]
    alphas = init.new_empty(B, T, K)
    keep = keep and not is_max
    weights = init.new_empty(B, T, K, _pad(K)) if keep else None
    sums = init.new_empty(B, T, K) if keep else None
    args = _args(init, xs, unary, _KEEP if keep else 0, alphas, weights, sums, None, None, None, None)
    _scan.forward(is_max, init.dtype == torch.float64, torch.get_num_threads(), args)
    return alphas, weights, sums


def backward(init: Tensor, xs: Tensor, unary: Tensor | None, alphas: Tensor, weights: Tensor | None,
             sums: Tensor | None, grad: Tensor, is_max: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """The gradients of ``(init, xs, unary)`` from ``grad [B, T, K]``, the gradient of ``alphas``
    (Log: from the forward's kept ``weights`` and ``sums``; Max: the backtrace, each state's gradient
    carried to its first best predecessor)."""
    B, T, K = alphas.shape
    per_step = xs.shape[1] > 1 or T == 1
    grad = grad.contiguous()
    g_init = init.new_empty(B, K)
    g_xs = init.new_empty((B, T, K, K) if per_step else (B, K, K))
    g_unary = torch.empty_like(grad) if unary is not None else None
    args = _args(init, xs, unary, 0 if per_step else _SHARED_GRAD, alphas, weights, sums, grad, g_init, g_xs, g_unary)
    _scan.backward(is_max, init.dtype == torch.float64, torch.get_num_threads(), args)
    if xs.shape[0] == 1:
        g_xs = g_xs.sum(0, keepdim=True)
    return g_init, g_xs.reshape(xs.shape), g_unary


def pair_applies(init: Tensor, xs: Tensor, unary: Tensor | None) -> bool:
    """Whether a scan on pairs (value, tangent) of these tensors (``init [2, B, K]``, ``xs [2, B or 1,
    T or 1, K, K]``, ``unary [2, B, T, K]`` or None) is this kernel's (as :func:`applies`)."""
    return (init.dim() == 3 and xs.dim() == 5 and init.shape[0] == xs.shape[0] == 2
            and (unary is None or (unary.dim() == 4 and unary.shape[0] == 2))
            and applies(init[0], xs[0], None if unary is None else unary[0], log=False))  # (the pair levels are the alternative)


def _pair_args(init: Tensor, xs: Tensor, unary: Tensor | None, flags: int, *addresses: Tensor | None) -> np.ndarray:
    _, B, K = init.shape
    T = unary.shape[2] if unary is not None else xs.shape[2]
    u = [unary.data_ptr(), *_strides(unary)] if unary is not None else [0] * 5
    flags |= _UNARY if unary is not None else 0
    return np.array([B, T, K, flags, init.data_ptr(), *_strides(init), xs.data_ptr(), *_strides(xs), *u,
                     *[0 if t is None else t.data_ptr() for t in addresses]], dtype=np.int64)


def pair_forward(init: Tensor, xs: Tensor, unary: Tensor | None):
    """The Log scan on pairs (value, tangent): ``(alphas [2, B, T, K], backward)``, ``backward(grad
    [2, B, T, K])`` the pairs' gradients of ``(init, xs, unary)`` in their shapes, computed in double
    (the inputs' dtype out)."""
    dtype = init.dtype
    init, xs = init.double(), xs.double()
    unary = None if unary is None else unary.double()
    _, B, K = init.shape
    T = unary.shape[2] if unary is not None else xs.shape[2]
    alphas = init.new_empty(2, B, T, K)
    _scan.pair_forward(torch.get_num_threads(), _pair_args(init, xs, unary, 0, alphas, None, None, None, None))

    def backward(grad: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        grad = grad.double().contiguous()
        per_step = xs.shape[2] > 1 or T == 1
        g_init = init.new_empty(2, B, K)
        g_xs = init.new_empty(2, B, T if per_step else 1, K, K)
        g_unary = torch.empty_like(grad) if unary is not None else None
        flags = 0 if per_step else _SHARED_GRAD
        _scan.pair_backward(torch.get_num_threads(), _pair_args(init, xs, unary, flags, alphas, grad, g_init, g_xs, g_unary))
        if xs.shape[1] == 1:
            g_xs = g_xs.sum(1, keepdim=True)
        return g_init.to(dtype), g_xs.reshape(xs.shape).to(dtype), None if g_unary is None else g_unary.to(dtype)

    return alphas.to(dtype), backward
