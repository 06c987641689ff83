"""Inputs of ``Semiring.scan`` and what a test compares of it, shared by the tests of its native
paths (tests/test_cpu_scan.py, tests/test_triton_scan.py): each runs :func:`states_and_gradients`
with its path on and off."""

from __future__ import annotations

import torch

import semiring as sr

SHAPES = {  # (xs's batch, xs's steps): which of [B, T, K, K] the matrices vary along (Semiring.scan's two forms)
    "a matrix per step and example": (True, True),
    "one matrix for every step and example": (False, False),
}


def scan_inputs(shape: str, unary: bool, dtype, B=3, T=6, K=5, seed=0, device="cpu"):
    """``[init [B, K], xs, unary [B, T, K] or None]`` with a forbidden transition and a state no path
    reaches (one matrix for every step always has a unary: it gives the steps)."""
    g = torch.Generator().manual_seed(seed)
    per_example, per_step = SHAPES[shape]
    xs = torch.randn(B if per_example else 1, T if per_step else 1, K, K, generator=g, dtype=dtype)
    xs[..., 1, 2] = float("-inf")  # a forbidden transition
    xs[..., :, 4] = float("-inf")  # and a state no path reaches
    init = torch.randn(B, K, generator=g, dtype=dtype)
    u = torch.randn(B, T, K, generator=g, dtype=dtype) if unary or not per_step else None
    return [t.to(device) if t is not None else None for t in (init, xs, u)]


def states_and_gradients(semiring, init, xs, u, weighting: str = "every state", check=None):
    """The states, and the gradients of (init, xs, u) against a fixed weighting of the states:
    ``"every state"``, or (Max's default, a best path's backtrace) ``"one end state"``; ``check`` is
    called with the leaves first (a path's ``applies``)."""
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (init, xs, u)]
    if check is not None:
        check(*leaves)
    alphas = semiring.scan(*leaves)
    weight = torch.linspace(-1, 1, alphas.numel(), dtype=alphas.dtype, device=alphas.device).reshape(alphas.shape)
    if weighting == "one end state":
        weight = torch.zeros_like(alphas)
        weight[:, -1, 0] = 1.0
    grads = torch.autograd.grad((torch.where(alphas.isfinite(), alphas, 0) * weight).sum(),
                                [t for t in leaves if t is not None])
    return alphas.detach(), grads
