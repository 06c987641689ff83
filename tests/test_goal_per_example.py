"""A run given lengths computes the goal at each example's own lengths only (``plan.PerExample``:
its reads looked up per example), where a plan for every length computes the goal's whole box: the
same values, gradients, best structures and Hessian-vector products, on the C kernel, the torch
calls and Triton's kernels (in its interpreter without a GPU)."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sys

import pytest
import torch
from torch.testing import assert_close

import semiring.language.kernel as kernel
import semiring.language.plan as plan_module
import structures as st


def _forced(monkeypatch, each: bool, *programs) -> None:
    """Every run given lengths plans its goal per example (``each``) or at every length; plans made."""
    for module in (plan_module, sys.modules["semiring.language.program"]):  # (the package's `program` is the function)
        monkeypatch.setattr(module, "EACH", 0 if each else math.inf)
    for p in programs:
        p._plans.clear()
        p._checked.clear()


def _cases():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, 9, generator=g, dtype=torch.float64)
    x[0, 2, 3] = x[2, :, 4] = -math.inf
    pair = (torch.tensor([7, 3, 1, 6]), torch.tensor([9, 2, 5, 1]))
    logits = torch.randn(4, 12, 4, generator=g, dtype=torch.float64)
    targets = torch.randint(1, 4, (4, 3), generator=g)
    frames, labels = torch.tensor([12, 6, 3, 2]), torch.tensor([3, 1, 0, 3])  # the last: too few frames
    chain = torch.randn(4, 6, 3, 3, generator=g, dtype=torch.float64)
    arcs = torch.randn(4, 7, 7, generator=g, dtype=torch.float64)
    n, words = torch.tensor([7, 4, 1, 2]), torch.tensor([6, 4, 1, 2])
    return {
        "alignment": (x, lambda t: st.AlignmentCRF(t, lengths=pair)),
        "alignment one to many": (x, lambda t: st.AlignmentCRF(t, lengths=pair, kind="one_to_many")),
        "ctc": (logits, lambda t: st.CTC(t.log_softmax(-1), targets, frames, labels)),
        "chain": (chain, lambda t: st.LinearChainCRF(t, lengths=n)),
        "projective": (arcs, lambda t: st.ProjectiveDependencyCRF(t, lengths=words)),
        "projective single root": (arcs, lambda t: st.ProjectiveDependencyCRF(t, lengths=words, single_root=True)),
    }


CASES = _cases()


def _queries(x: torch.Tensor, make) -> list[torch.Tensor]:
    x = x.clone().requires_grad_()
    d = make(x)
    (g,) = torch.autograd.grad(d.log_partition.sum(), x, create_graph=True)
    (hv,) = torch.autograd.grad((g * torch.cos(torch.arange(g.numel(), dtype=g.dtype)).view_as(g)).nan_to_num().sum(), x)
    return [d.log_partition.detach(), d.marginals, d.argmax, g.detach(), hv]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_a_goal_at_each_examples_lengths_is_the_goal_at_every_length(monkeypatch, name, path):
    x, make = CASES[name]
    program = make(x).program
    with kernel.disabled() if path == "torch" else contextlib.nullcontext():
        _forced(monkeypatch, True, program)
        each = _queries(x, make)
        plans = list(program._plans.values())
        _forced(monkeypatch, False, program)
        every = _queries(x, make)
    for a, b in zip(each, every):
        assert_close(a, b, atol=1e-10, rtol=1e-10, equal_nan=True)
    if name != "projective single root":  # (its goal sums over the root's children up to n: a mask on both)
        assert any(p.per_example is not None for p in plans)


@pytest.mark.triton
@pytest.mark.skipif(importlib.util.find_spec("triton") is None or torch.cuda.is_available()
                    or os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter (tests/test_triton.py: on a GPU)")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_goal_at_each_examples_lengths_runs_in_the_triton_kernels(monkeypatch):
    from semiring.language import triton_levels

    x, make = CASES["ctc"]
    program = make(x).program
    _forced(monkeypatch, True, program)
    with triton_levels.interpreted():
        each = _queries(x.float(), make)
    _forced(monkeypatch, False, program)
    every = _queries(x.float(), make)
    for a, b in zip(each[:3], every[:3]):
        assert_close(a, b, atol=1e-4, rtol=1e-4)
