"""The layers of structures.nn under torch.compile: the same outputs and the same gradients (of the
inputs and of the parameters) as eager, on small padded batches.

The default run uses the ``aot_eager`` backend (AOTAutograd without code generation: no C
compiler, seconds); the ``slow`` tests use the default inductor backend. The layers whose
attention is the marginals of a dynamic program (segmentation, syntactic, hop attention) run that
program eagerly inside the compiled graph (a graph break): see docs/nn.md, "torch.compile".
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import pytest
import torch
from torch import Tensor

from structures.nn import (GatedSyntacticContext, HopAttention, MemoryHopAttention, SegmentationAttention,
                           SigmoidAttention, SoftmaxAttention, StructuredSelfAttention, SubtreeAttention,
                           SyntacticAttention, TreeLSTM)


class Case(NamedTuple):
    """A layer, the arguments of its forward (float tensors get gradients) and the dtype it is
    checked in (each layer in one dtype, both dtypes over the cases, to keep the file fast)."""

    make: Callable[[], torch.nn.Module]
    args: Callable[[torch.dtype], tuple]
    dtype: torch.dtype = torch.float64


def _rand(*shape, dtype):
    return torch.randn(*shape, dtype=dtype)


F32 = torch.float32
HEADS = torch.tensor([[0, 1, 1, 3, 3], [2, 0, 2, 0, 0], [0, 0, 0, 0, 0]])  # trees over 5, 3 and 1 words
LENGTHS = torch.tensor([5, 3, 1])

CASES = {
    "softmax": Case(lambda: SoftmaxAttention(4, 3),
                    lambda dt: (_rand(3, 5, 4, dtype=dt), _rand(3, 2, 3, dtype=dt), LENGTHS), F32),
    "sigmoid": Case(lambda: SigmoidAttention(4, 3),
                    lambda dt: (_rand(3, 5, 4, dtype=dt), _rand(3, 3, dtype=dt), LENGTHS)),
    "syntactic-simple": Case(lambda: SyntacticAttention(4, 6, structured=False, children=True),
                             lambda dt: (_rand(3, 5, 4, dtype=dt), _rand(3, 5, 2, dtype=dt), torch.tensor([5, 3, 2])), F32),
    "structured-self": Case(lambda: StructuredSelfAttention(4, 3, output="update"),
                            lambda dt: (_rand(3, 5, 4, dtype=dt), _rand(3, 5, 3, dtype=dt), LENGTHS)),
    "structured-self-dot-hard": Case(lambda: StructuredSelfAttention(4, scores="dot", hard=True),
                                     lambda dt: (_rand(3, 5, 4, dtype=dt), None, LENGTHS), F32),
    "gated": Case(lambda: GatedSyntacticContext(3, 4),
                  lambda dt: (_rand(3, 2, 3, dtype=dt), _rand(3, 5, 4, dtype=dt), torch.rand(3, 2, 5, dtype=dt), LENGTHS)),
    "gated-own": Case(lambda: GatedSyntacticContext(3, 4, shared=False),
                      lambda dt: (_rand(3, 3, dtype=dt), _rand(3, 5, 4, dtype=dt), None, LENGTHS), F32),
    "memory-hops": Case(lambda: MemoryHopAttention(),
                        lambda dt: (_rand(3, 2, 5, 4, dtype=dt), _rand(3, 2, 5, 4, dtype=dt), _rand(3, 4, dtype=dt), LENGTHS)),
    "tree-lstm": Case(lambda: TreeLSTM(4, 3), lambda dt: (_rand(3, 5, 4, dtype=dt), HEADS, LENGTHS), F32),
    "subtree": Case(lambda: SubtreeAttention(4, 3),
                    lambda dt: (_rand(3, 4, 4, dtype=dt), _rand(3, 5, 3, dtype=dt), HEADS, torch.tensor([4, 2, 1]), LENGTHS)),
}

# The layers whose attention is the marginals of a dynamic program (semiring.program).
STRUCTURED = {
    "segmentation": Case(lambda: SegmentationAttention(4, 3),
                         lambda dt: (_rand(2, 4, 4, dtype=dt), _rand(2, 3, dtype=dt), torch.tensor([4, 2]))),
    "syntactic": Case(lambda: SyntacticAttention(4, 6),
                      lambda dt: (_rand(2, 4, 4, dtype=dt), None, torch.tensor([4, 3]))),
    "hops-binary": Case(lambda: HopAttention("binary"),
                        lambda dt: (_rand(2, 2, 4, 3, dtype=dt), _rand(2, 2, 4, 3, dtype=dt), _rand(2, 2, 3, dtype=dt),
                                    torch.tensor([4, 2]))),
}


def outputs(out) -> list[Tensor]:
    """The tensors a layer returns: (context, attention) of an AttentionOutput, all of TreeStates."""
    return [out.context, out.attention] if hasattr(out, "context") else list(out)


def check_compiled_like_eager(case: Case, backend: str) -> None:
    """Forward outputs and the gradients of a random projection of them with respect to every float
    input and every parameter: compiled equals eager (float64: to 1e-9 relative)."""
    torch.manual_seed(0)
    dtype = case.dtype
    layer = case.make().to(dtype)
    args = [a.clone().requires_grad_() if isinstance(a, Tensor) and a.is_floating_point() else a
            for a in case.args(dtype)]
    leaves = [a for a in args if isinstance(a, Tensor) and a.requires_grad] + list(layer.parameters())
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend=backend, dynamic=False)
    expected, got = outputs(layer(*args)), outputs(compiled(*args))
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-10)
    for e, g in zip(expected, got, strict=True):
        assert g.shape == e.shape and torch.allclose(g, e, **tol)
    weights = [torch.randn_like(e) for e in expected]
    def loss(values):
        return sum((w * v).sum() for w, v in zip(weights, values))
    want = torch.autograd.grad(loss(expected), leaves, allow_unused=True)
    have = torch.autograd.grad(loss(got), leaves, allow_unused=True)
    for leaf, w, h in zip(leaves, want, have):
        if w is None:
            assert h is None
        else:
            assert h is not None and torch.allclose(h, w, **tol), tuple(leaf.shape)


SLOW_CASES = {"structured-self-dot-hard"}  # the spanning-tree decode: many graph breaks, the slowest to compile


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_CASES else n for n in CASES])
def test_compiled_layer_equals_eager(name):
    check_compiled_like_eager(CASES[name], "aot_eager")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["softmax", "syntactic-simple", "structured-self", "tree-lstm"])
def test_inductor_compiled_layer_equals_eager(name):
    check_compiled_like_eager(CASES[name], "inductor")


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", list(STRUCTURED))
def test_compiled_structured_layer_trains_like_eager(name, backend):
    """The whole layer compiled: its dynamic program runs eagerly inside (a graph break, see
    ``structures.base._eager``), the rest is compiled; outputs and gradients as eager."""
    check_compiled_like_eager(STRUCTURED[name], backend)
