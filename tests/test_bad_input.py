"""Bad input gets a correct answer or a ValueError naming the argument (issue 34's fuzz findings):
heads out of range, bool or of another batch for the dependency CRFs' ``log_prob``; lengths of
every integer dtype and as a Python list; empty batches of the tree layers; no positions for the
emission CRFs."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.testing import assert_close

from brute import FAMILIES, crosses, is_tree, random_lengths, random_potentials
from structures import EmissionCRF, LinearChainCRF, NonProjectiveDependencyCRF, ProjectiveDependencyCRF, SecondOrderDependencyCRF
from structures import validation
from structures.nn import CRF, SubtreeAttention, TreeLSTM

N = 4
TREES = {
    "projective": lambda theta, **kw: ProjectiveDependencyCRF(theta, **kw),
    "projective-single-root": lambda theta, **kw: ProjectiveDependencyCRF(theta, single_root=True, **kw),
    "nonprojective": lambda theta, **kw: NonProjectiveDependencyCRF(theta, **kw),
    "nonprojective-single-root": lambda theta, **kw: NonProjectiveDependencyCRF(theta, single_root=True, **kw),
    "second-order": lambda theta, **kw: SecondOrderDependencyCRF(theta, torch.zeros(*theta.shape, theta.shape[-1], dtype=theta.dtype), **kw),
}
per_tree = pytest.mark.parametrize("make", TREES.values(), ids=TREES.keys())


@per_tree
@pytest.mark.parametrize("bad, message", [
    (lambda h: h.masked_fill(torch.arange(N) == 0, -1), r"value: heads must lie in 0\.\.4"),
    (lambda h: h.masked_fill(torch.arange(N) == 0, N + 1), r"value: heads must lie in 0\.\.4"),
    (lambda h: h.bool(), r"value: expected integer heads of shape \[\.\.\., B, N\] = \[\.\.\., 2, 4\], got torch.bool"),
    (lambda h: h.float(), r"value: expected one-hot parts of shape"),
    (lambda h: torch.cat([h, h]), r"value: expected integer heads of shape \[\.\.\., B, N\] = \[\.\.\., 2, 4\], got torch.int64 \[4, 4\]"),
    (lambda h: h[:, :2], r"value: expected integer heads of shape"),
], ids=["head -1", "head n+1", "bool", "float heads", "another batch", "too few words"])
def test_heads_that_cannot_be_a_tree_are_a_value_error_naming_value(make, bad, message):
    """(not a finite log-prob from heads clamped into range, nor a raw error)."""
    d = make(torch.randn(2, N + 1, N + 1, dtype=torch.float64))
    heads = torch.tensor([[0, 1, 2, 3], [2, 0, 2, 3]])
    with pytest.raises(ValueError, match=message):
        d.log_prob(bad(heads))


@per_tree
@settings(max_examples=25, deadline=None)
@given(heads=st.lists(st.integers(-2, N + 2), min_size=N, max_size=N))
def test_log_prob_of_any_heads_is_finite_exactly_for_a_tree_else_minus_inf_or_a_value_error(make, heads):
    theta = torch.randn(1, N + 1, N + 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    d = make(theta)
    value = torch.tensor([heads])
    if not all(0 <= h <= N for h in heads):
        with pytest.raises(ValueError, match="value: heads must lie in"):
            d.log_prob(value)
        return
    tree = is_tree(heads)
    if not isinstance(d, NonProjectiveDependencyCRF):  # Eisner's trees (first and second order) do not cross
        tree = tree and not crosses(heads)
    if getattr(d, "single_root", False):
        tree = tree and heads.count(0) == 1
    assert bool(torch.isfinite(d.log_prob(value))) == tree


@pytest.mark.parametrize("family", FAMILIES, ids=str)
@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8, torch.int32], ids=str)
def test_lengths_of_any_integer_dtype_are_the_long_lengths(family, dtype):
    shape = max(family.shapes, key=math.prod)
    g = torch.Generator().manual_seed(0)
    theta = random_potentials(shape, 3, g)
    lengths = random_lengths(3, family.max_length(shape), g)
    want, got = family.cls(theta, lengths), family.cls(theta, lengths.to(dtype))
    assert got.lengths.dtype == torch.long
    assert_close(got.log_partition, want.log_partition)
    assert_close(got.marginals, want.marginals)
    assert_close(got.log_prob(got.argmax), want.log_prob(want.argmax))
    assert_close(family.cls(theta, lengths.tolist()).log_partition, want.log_partition)  # a Python list


@pytest.mark.parametrize("family", FAMILIES, ids=str)
@pytest.mark.parametrize("lengths, message", [
    ([1.0, 2.0, 1.0], r"lengths: expected an integer tensor of shape \[B\] = \[3\], got torch.float32"),
    ([1, 1], r"lengths: expected an integer tensor of shape \[B\] = \[3\], got torch.int64 \(2,\)"),
], ids=["floats", "too few"])
def test_lengths_as_a_bad_list_are_a_value_error_describing_them(family, lengths, message):
    shape = max(family.shapes, key=math.prod)
    with pytest.raises(ValueError, match=message):
        family.cls(torch.zeros(3, *shape, dtype=torch.float64), lengths)


def test_no_positions_is_a_value_error_naming_emissions():
    for build in (lambda e: LinearChainCRF.from_emissions(e, torch.zeros(3, 3)),
                  lambda e: EmissionCRF(e, torch.zeros(3, 3)),
                  lambda e: CRF(3, batch_first=True)(e, torch.zeros(2, 0, dtype=torch.long))):
        with pytest.raises(ValueError, match=r"^emissions: "):
            build(torch.zeros(2, 0, 3))


def test_the_tree_layers_answer_an_empty_batch_with_empty_outputs():
    states = TreeLSTM(4, 5)(torch.randn(0, 3, 4), torch.zeros(0, 3, dtype=torch.long))
    assert [tuple(s.shape) for s in states] == [(0, 3, 5), (0, 3, 5), (0, 5)]
    out = SubtreeAttention(4, 6)(torch.randn(0, 3, 4), torch.randn(0, 2, 6), torch.zeros(0, 2, dtype=torch.long))
    assert tuple(out[0].shape) == (0, 2, 4) and tuple(out[1].shape) == (0, 2, 3)


SPECIAL = st.sampled_from([math.nan, math.inf, -math.inf, 3e38, -3e38, 1e300, 5e33, 4e33, -4e33, 1e19, 2.5])


@pytest.mark.parametrize("c_pass", [True, False], ids=["C pass", "torch"])
@settings(max_examples=150, deadline=None)
@given(entries=st.lists(st.tuples(st.integers(0, 2 * 3 * 4 * 4 - 1), SPECIAL), max_size=3),
       dtype=st.sampled_from([torch.float32, torch.float64]), transposed=st.booleans())
def test_potentials_are_refused_exactly_for_nan_plus_inf_or_entries_whose_sums_overflow(c_pass, entries, dtype, transposed):
    """The rule, checked plainly against the checks' C pass (contiguous CPU tensors, where it is
    built) and torch's reductions: NaN or +inf anywhere, or a finite entry beyond ``finfo.max /
    (N-1) C²`` (one per part of an example), is a ValueError naming the potentials; anything else
    (-inf included) is accepted."""
    if c_pass and validation._values is None:
        pytest.skip("the C extension structures._values is not built")
    theta = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for i, v in entries:
        theta.view(-1)[i] = v
    theta = theta.to(dtype)  # (1e300 is +inf in float32)
    theta = theta.transpose(-1, -2).contiguous().transpose(-1, -2) if transposed else theta  # not contiguous
    finite = theta[theta.isfinite()].abs()
    limit = torch.finfo(dtype).max / (3 * 4 * 4)
    refused = bool(theta.isnan().any() or (theta == math.inf).any() or (finite.numel() and finite.max() > limit))
    with mock.patch.object(validation, "_values", validation._values if c_pass else None):
        if refused:
            with pytest.raises(ValueError, match="log_potentials"):
                LinearChainCRF(theta)
        else:
            LinearChainCRF(theta)


@pytest.mark.skipif(validation._values is None, reason="the C extension structures._values is not built")
@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(st.floats(width=64), SPECIAL, st.sampled_from([0.0, -0.0, 5e-320, 1e-40])),
                       min_size=1, max_size=70),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_the_c_pass_finds_nan_plus_inf_and_the_largest_finite_magnitude_on_every_instruction_set(values, dtype):
    x = torch.tensor(values, dtype=torch.float64).to(dtype)
    finite = x[x.isfinite()].abs()
    expected = (bool(x.isnan().any()), bool((x == math.inf).any()), float(finite.max()) if finite.numel() else 0.0)
    was = validation._values.isa()
    try:
        for isa in validation._values.isas():
            validation._values.set_isa(isa)
            assert validation._values.scan(x.data_ptr(), x.numel(), dtype == torch.float32) == expected, isa
    finally:
        validation._values.set_isa(was)
