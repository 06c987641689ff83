"""Every structure's queries whatever the caller's autograd state: under ``torch.no_grad()`` and
``torch.inference_mode()`` (where the queries that are gradients, argmax and marginals, still
differentiate), and on a view of a tensor that starts requiring grad after the structure is built
(torch-struct's algorithms set it on their input). Each answers as a structure built and queried plainly."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from test_cuda import BUILDERS, CPU

per_structure = pytest.mark.parametrize("build", BUILDERS.values(), ids=BUILDERS.keys())

QUERIES = {
    "log_partition": lambda d: d.log_partition,
    "decode": lambda d: d.decode(),
    "argmax": lambda d: d.argmax,
    "marginals": lambda d: d.marginals,
    "entropy": lambda d: d.entropy(),
    "kl": lambda d: d.kl(d),
    "topk": lambda d: d.topk(2),
    "sample": lambda d: d.sample((2,), generator=torch.Generator().manual_seed(0)),
}


def plain(build, query: str) -> torch.Tensor:
    make, _ = build(CPU)
    return QUERIES[query](make())


@per_structure
@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"])
@pytest.mark.parametrize("built_inside", [False, True], ids=["built outside", "built inside"])
def test_a_query_under_no_grad_or_inference_mode_is_the_plain_one(build, query, mode, built_inside):
    """Built inside the mode, every input is made in it (an inference tensor in inference mode);
    the plain answer comes after, so that nothing the mode left behind spoils it."""
    make, _ = (None, None) if built_inside else build(CPU)
    with mode():
        if built_inside:
            make, _ = build(CPU)
        got = QUERIES[query](make())
    assert_close(got, plain(build, query))


def views(device: torch.device, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """Inputs that are views of tensors that require no grad (yet)."""
    return [t.to(device).view(t.shape) for t in tensors]


@per_structure
@pytest.mark.parametrize("query", ["marginals", "entropy", "kl"])
def test_a_structure_on_a_view_whose_base_then_requires_grad_answers_as_before(build, query):
    """Such a view requires grad with no graph behind it: the queries that differentiate by the
    potentials must not take it for them."""
    make, inputs = build(CPU, views)
    d = make()
    for view in inputs:
        view._base.requires_grad_(True)
    assert_close(QUERIES[query](d), plain(build, query))
