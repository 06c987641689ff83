"""The certified fast path's marginals (:func:`._certified.marginals`) on a GPU as one Triton launch:
one program per example factors its matrix, inverts it, bounds the error and writes the marginals
(:mod:`._certified_triton_kernel`).

Through torch and cuSOLVER the same path is ~80 kernel launches a query (the factorization, the
solves, the bound's products and the formulas), so on a GPU it is launch-bound. Runs take the kernel
where Triton imports and the weights are a float64 CUDA tensor of at most :data:`MAX_WORDS` words,
multi-root or single root; larger sentences, other devices and log Z alone stay on
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


def applies(W: Tensor) -> bool:
    """Whether :func:`marginals` takes these weights ``W [B, N+1, N+1]``: float64, at most
    :data:`MAX_WORDS` words, on a CUDA device outside graph capture (or the CPU while
    :data:`interpreting`)."""
    if not enabled or W.dtype != torch.float64 or not 1 <= W.shape[-1] - 1 <= MAX_WORDS:
        return False
    if W.device.type == "cuda":
        return not torch.cuda.is_current_stream_capturing()
    return W.device.type == "cpu" and bool(interpreting)


def marginals(W: Tensor, real: Tensor, single_root: bool) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`._certified.marginals`: ``(log Z(W) [B], μ [B, N+1, N+1], ok [B])`` for contiguous
    float64 weights ``W [B, N+1, N+1]`` (overwritten by μ, as there) and ``real [B, N]``."""
    import triton

    from ._certified_triton_kernel import certified

    B, N1, _ = W.shape
    n = N1 - 1
    W = W.contiguous()
    logZ = torch.empty(B, dtype=torch.float64, device=W.device)
    ok = torch.empty(B, dtype=torch.int8, device=W.device)
    block = max(16, triton.next_power_of_2(n))
    certified[(B,)](W, real.to(torch.int8).contiguous(), logZ, ok, n, SINGLE_ROOT=single_root, TOL=cert.TOL,
                    UNIT=cert._U, BLOCK=block, num_warps=16 if block >= 128 else 8 if block >= 64 else 4)
    return logZ, W, ok.bool()
