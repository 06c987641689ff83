"""The certified fast path (:func:`._certified.marginals`) on a GPU as one Triton launch: one program
per example factors its matrix, inverts it, bounds the error and writes log Z and the marginals
(:mod:`._certified_triton_kernel`).

Through torch and cuSOLVER the same path is ~80 kernel launches a query (the factorization, the
solves, the bound's products and the formulas), so on a GPU it is launch-bound. Runs take the kernel
where Triton imports and the scores are on a CUDA device, at most :data:`MAX_WORDS` words, multi-root
or single root, with or without the marginals (log Z alone: certified by the marginals' bound on
log Z, here from the inverse's diagonal itself); larger sentences and other devices stay on
:mod:`._certified`. The answer is the same to rounding: the bound certifies the kernel's factors as
it does LAPACK's, and an example it does not certify moves on to the exact path as before. Tests run
the kernel in Triton's interpreter on CPU tensors (:data:`interpreting`, ``TRITON_INTERPRET=1`` set
before the first run).
"""

from __future__ import annotations

import importlib.util

import torch
from torch import Tensor

from semiring.switch import Switch

from . import _certified as cert

MAX_WORDS = 128
"""The largest sentence the kernel takes: its matrix is a register tile of the next power of two."""
enabled = Switch(importlib.util.find_spec("triton") is not None)
interpreting = Switch(False)


def applies(theta: Tensor) -> bool:
    """Whether :func:`certified` takes the examples of scores ``θ [B, N+1, N+1]``: at most
    :data:`MAX_WORDS` words, on a CUDA device outside graph capture (or the CPU while
    :data:`interpreting`)."""
    if not enabled or not 1 <= theta.shape[-1] - 1 <= MAX_WORDS:
        return False
    if theta.device.type == "cuda":
        return not torch.cuda.is_current_stream_capturing()
    return theta.device.type == "cpu" and bool(interpreting)


def certified(W: Tensor, real: Tensor, single_root: bool, marginals: bool = True) -> tuple[Tensor, Tensor | None, Tensor]:
    """:func:`._certified.marginals`: ``(log Z(W) [B], μ [B, N+1, N+1], ok [B])`` for float64 weights
    ``W [B, N+1, N+1]`` (overwritten by μ, as there) and ``real [B, N]``. Without ``marginals``:
    ``(log Z, None, ok)``, ok where log Z alone is certified."""
    import triton

    from ._certified_triton_kernel import certified as kernel

    B, N1, _ = W.shape
    n = N1 - 1
    W = W.contiguous()
    logZ = torch.empty(B, dtype=torch.float64, device=W.device)
    ok = torch.empty(B, dtype=torch.int8, device=W.device)
    block = max(16, triton.next_power_of_2(n))
    kernel[(B,)](W, real.to(torch.int8).contiguous(), logZ, ok, n, SINGLE_ROOT=single_root, MARGINALS=marginals,
                 TOL=cert.TOL, UNIT=cert._U, BLOCK=block, num_warps=16 if block >= 128 else 8 if block >= 64 else 4)
    return logZ, W if marginals else None, ok.bool()
