"""Every layer: padding holds anything (NaN, ±inf, 1e30) without effect, and nothing is NaN.

docs/nn.md promises that a position at or past ``lengths[b]`` gets weight exactly 0 and contributes
nothing, whatever it holds. Each case builds a layer, runs it on clean inputs, then again with the
padded positions of example 1 overwritten, and compares every output."""

from __future__ import annotations

import math

import pytest
import torch

from structures import nn as snn

B, N, D = 2, 5, 4
LENGTHS = torch.tensor([5, 3])
HEADS = torch.tensor([[0, 1, 1, 2, 4], [2, 0, 2, 0, 0]])  # example 1: a tree over its 3 words


def _poison(x: torch.Tensor, value: float, dim: int | None) -> torch.Tensor:
    """``x`` with example 1's positions past its length along ``dim`` set to ``value`` (``dim``
    None: ``x`` has no positions to pad)."""
    if dim is None:
        return x
    x = x.clone()
    index = [slice(None)] * x.dim()
    index[0], index[dim] = 1, slice(int(LENGTHS[1]), None)
    x[tuple(index)] = value
    return x


def by_lengths(prefix: str = "") -> dict:
    """The padding as a layer is told it: ``lengths=`` (``query_lengths=`` with ``prefix``)."""
    return {f"{prefix}lengths": LENGTHS}


def _cases():
    """(name, make the layer, call it): ``call(layer, p, padding)`` passes every tensor argument
    ``x`` as ``p(x, dim)``, ``dim`` its positions' dimension (None: not padded), and the padding as
    the keyword arguments ``padding(prefix)`` (:func:`by_lengths`, or a mask: tests/test_mask.py)."""
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    memory, query, states = r(B, N, D), r(B, D), r(B, N, D)
    facts, hop_queries = (r(B, 2, N, D), r(B, 2, N, D)), r(B, 2, D)
    decoder_weights, tree_query = torch.softmax(r(B, N), -1), r(B, N, D)
    yield "SoftmaxAttention", lambda: snn.SoftmaxAttention(D, D), lambda m, p, k: m(p(memory, 1), p(query, None), **k())
    yield "SigmoidAttention", lambda: snn.SigmoidAttention(D, D), lambda m, p, k: m(p(memory, 1), p(query, None), **k())
    yield "SegmentationAttention", lambda: snn.SegmentationAttention(D, D), lambda m, p, k: m(p(memory, 1), p(query, None), **k())
    yield "MemoryHopAttention", lambda: snn.MemoryHopAttention(), lambda m, p, k: m(p(facts[0], 2), p(facts[1], 2), p(query, None), **k())
    yield "HopAttention", lambda: snn.HopAttention(), lambda m, p, k: m(p(facts[0], 2), p(facts[1], 2), p(hop_queries, None), **k())
    yield "StructuredSelfAttention", lambda: snn.StructuredSelfAttention(D), lambda m, p, k: m(p(states, 1), None, **k())
    yield "SyntacticAttention", lambda: snn.SyntacticAttention(D, D), lambda m, p, k: m(p(states, 1), None, **k())
    yield "SyntacticAttention(structured=False)", lambda: snn.SyntacticAttention(D, D, structured=False), \
        lambda m, p, k: m(p(states, 1), None, **k())
    yield "GatedSyntacticContext", lambda: snn.GatedSyntacticContext(D, D), \
        lambda m, p, k: m(p(query, None), p(memory, 1), p(decoder_weights, 1), **k())
    yield "SubtreeAttention", lambda: snn.SubtreeAttention(D, D), \
        lambda m, p, k: m(p(memory, 1), p(tree_query, 1), p(HEADS, None), **k(), **k("query_"))
    yield "TreeLSTM", lambda: snn.TreeLSTM(D, D), lambda m, p, k: m(p(states, 1), p(HEADS, None), **k())


def flat(out) -> list[torch.Tensor]:
    return [t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)]


CASES = list(_cases())


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e30], ids=str)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_padding_holds_anything_without_effect(case, value):
    _, make, call = case
    torch.manual_seed(0)
    layer = make()
    clean = flat(call(layer, lambda x, dim: x, by_lengths))
    dirty = flat(call(layer, lambda x, dim: _poison(x, value, dim), by_lengths))
    for a, b in zip(clean, dirty):
        assert not b.isnan().any()
        torch.testing.assert_close(b, a, equal_nan=False)
