"""Every structure behaves as a ``torch.distributions.Distribution`` where generic code relies on
it: ``validate_args=`` in every constructor, ``enumerate_support(expand=...)`` a tensor (its
padding slots outside the support, ``log_prob`` -inf there), ``has_enumerate_support``,
``support`` a constraint whose ``check`` tells structures from other values, ``expand``."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from torch.testing import assert_close

import structures
from brute import FAMILIES, random_lengths, random_potentials
from test_cuda import BUILDERS, CPU



def _small() -> dict:
    """BUILDERS with CTC and the PCFGs at sizes whose structures can be listed in a second."""
    def inputs(*shapes):
        g = torch.Generator().manual_seed(3)
        return [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]

    def ctc(device):
        (logits,) = inputs((2, 5, 3))
        return (lambda: structures.CTC(logits.log_softmax(-1), torch.tensor([[1, 2], [2, 0]]), torch.tensor([5, 3]),
                                       torch.tensor([2, 1]))), [logits]

    def pcfg(device):
        leaves = inputs((2, 3, 2), (2, 1, 3, 3), (2, 1))
        return (lambda: structures.PCFG(*leaves, torch.tensor([3, 2]))), leaves

    def tdpcfg(device):
        leaves = inputs((2, 3, 2), (2, 1, 2), (2, 3, 2), (2, 3, 2), (2, 1))
        return (lambda: structures.TDPCFG(*leaves, torch.tensor([3, 2]))), leaves

    return BUILDERS | {"ctc": ctc, "pcfg": pcfg, "tdpcfg": tdpcfg}


SMALL = _small()
per_structure = pytest.mark.parametrize("build", SMALL.values(), ids=SMALL.keys())
per_family = pytest.mark.parametrize("family", FAMILIES, ids=str)
CLASSES = [getattr(structures, name) for name in structures.__all__
           if isinstance(getattr(structures, name), type) and issubclass(getattr(structures, name), structures.Distribution)
           and getattr(structures, name) not in (structures.Distribution, structures.StructuredDistribution)]


def built(build):
    make, _ = build(CPU)
    return make()


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_constructor_takes_validate_args(cls):
    constructors = [cls] + [getattr(cls, name) for name in ("from_torch_struct", "from_emissions", "from_supar", "unary", "binary")
                            if hasattr(cls, name)]
    for constructor in constructors:
        parameter = inspect.signature(constructor).parameters["validate_args"]
        assert parameter.kind is parameter.KEYWORD_ONLY and parameter.default is None


@per_family
@pytest.mark.parametrize("default", [True, False], ids=["default on", "default off"])
def test_validate_args_decides_for_its_distribution_whatever_the_default(family, default, monkeypatch):
    """As in torch.distributions: validate_args=True checks values (NaN potentials, lengths out of
    range, log_prob of what is not a structure) though the default is off; False skips them though
    it is on; None follows the default. Shapes are always checked."""
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", default)
    shape = max(family.shapes, key=math.prod)
    nan = torch.full((2, *shape), math.nan, dtype=torch.float64)
    with pytest.raises(ValueError, match=family.argument):
        family.cls(nan, validate_args=True)
    assert family.cls(nan, validate_args=False)._validate_args is False
    with pytest.raises(ValueError, match=family.argument):
        family.cls(nan[0], validate_args=False)
    too_long = torch.full((2,), family.max_length(shape) + 1)
    with pytest.raises(ValueError, match="lengths"):
        family.cls(torch.zeros(2, *shape, dtype=torch.float64), too_long, validate_args=True)

    theta = torch.zeros(2, *shape, dtype=torch.float64)
    not_a_structure = torch.full((2, *shape), 0.5, dtype=torch.float64)
    checked = family.cls(theta, validate_args=True)
    assert checked._validate_args and torch.isneginf(checked.log_prob(not_a_structure)).all()
    unchecked = family.cls(theta, validate_args=False)
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", True)  # the query follows the instance
    assert torch.isfinite(unchecked.log_prob(not_a_structure)).all()
    assert family.cls(theta)._validate_args is True


@per_structure
def test_enumerate_support_is_a_tensor_whose_padding_is_outside_the_support(build):
    """Generic torch code sums p over enumerate_support(): it is 1 for every example with a
    structure; the slots an example does not fill are not structures of it."""
    d = built(build)
    assert d.has_enumerate_support
    values = d.enumerate_support()
    listed, valid = d.enumerate_structures()
    assert isinstance(values, torch.Tensor) and values.shape == (valid.shape[0], *d.batch_shape, *d.event_shape)
    assert torch.equal(values[valid], listed[valid]) and values[~valid].isnan().all()
    assert torch.equal(d.support.check(values), valid)
    p = d.log_prob(values).detach().exp()
    assert_close(p.sum(0), (d.count > 0).to(p.dtype))
    assert (p[~valid] == 0).all()


@per_family
def test_enumerate_support_without_expand_is_the_one_support_of_a_batch(family):
    """expand=False: [S, 1, *event] when every example has the same structures (no lengths, no
    parts forbidden), as torch's; examples of other lengths have none in common: a ValueError."""
    shape = max(family.shapes, key=math.prod)
    g = torch.Generator().manual_seed(1)
    same = family.cls(random_potentials(shape, 3, g))
    shared = same.enumerate_support(expand=False)
    assert shared.shape == (same.enumerate_support().shape[0], 1, *same.event_shape)
    assert torch.equal(shared.expand_as(same.enumerate_support()), same.enumerate_support())
    assert not shared.isnan().any()
    lengths = random_lengths(3, family.max_length(shape), g)
    if family.max_length(shape) > 1:
        with pytest.raises(ValueError, match="expand=False"):
            family.cls(random_potentials(shape, 3, g), lengths).enumerate_support(expand=False)


@per_structure
def test_support_is_a_constraint_that_checks_structures(build):
    d = built(build)
    support = d.support
    assert isinstance(support, torch.distributions.constraints.Constraint)
    assert support.is_discrete and support.event_dim == len(d.event_shape)
    best = d.argmax
    assert support.check(d.sample((3,), generator=torch.Generator().manual_seed(0)))[:, d.count > 0].all()
    assert torch.equal(support.check(best), d.count > 0)
    assert not support.check(torch.full_like(best, 0.5)).any()
    assert not support.check(best + 1).any()


@per_structure
def test_expand_to_its_own_batch_shape_is_itself_and_to_another_a_clear_refusal(build):
    d = built(build)
    assert d.expand(d.batch_shape) is d
    for other in ((d.batch_shape[0] + 1,), (2, d.batch_shape[0])):
        with pytest.raises(ValueError, match=r"expand: a structure's batch is the first dimension of its potentials"):
            d.expand(other)
