"""The certified fast path's Triton kernel (:mod:`structures.spanning._certified_triton`: log Z and
the marginals of the non-projective CRF on a GPU, multi-root and single root, one launch) answers
what the torch and LAPACK path answers: the same certificate per example, the same log Z and
marginals to rounding where it certifies (log Z alone: within the tolerance of the exact value), and
through the device path the same as the default path everywhere.

Marked ``triton``; without a CUDA device the kernel runs in Triton's interpreter on CPU tensors
(``TRITON_INTERPRET=1``, which conftest.py sets before torch imports Triton)."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
import torch
from torch.testing import assert_close

from structures.spanning import _certified as cert
from structures.spanning import _certified_triton as kernel
from structures.spanning import _tree_partition as partition

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")

pytestmark = [pytest.mark.triton,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # (the interpreter's numpy: log(0))
              pytest.mark.skipif(not CUDA and os.environ.get("TRITON_INTERPRET") != "1", reason="no CUDA and no interpreter"),
              pytest.mark.skipif(CUDA and os.environ.get("TRITON_INTERPRET") == "1",
                                 reason="TRITON_INTERPRET=1 beside a GPU: the interpreter cannot read device buffers")]


def scores(n: int, scale: float, seed: int, forbid: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(θ [5, n+1, n+1], lengths [5])``; with ``forbid``: -inf arcs, and a word without a head."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(5, n + 1, n + 1, generator=g, dtype=torch.float64) * scale
    if forbid:
        theta[0] = theta[0].masked_fill(torch.rand(n + 1, n + 1, generator=g) < 0.4, -math.inf)
        theta[1, :, n] = -math.inf
    return theta.to(DEVICE), torch.tensor([n, n, max(1, n - 1), max(1, n // 2), 1], device=DEVICE)


ROOTS = pytest.mark.parametrize("single_root", [False, True], ids=["multi", "single"])


@pytest.fixture(autouse=True)
def interpreted():
    with kernel.interpreting.to(not CUDA):
        yield


@ROOTS
@pytest.mark.parametrize("n", [1, 5, 17])
@pytest.mark.parametrize("scale", [1.0, 4.0, 40.0])
@pytest.mark.parametrize("forbid", [False, True], ids=["finite", "forbidden"])
def test_the_kernel_certifies_and_answers_as_lapack(single_root, n, scale, forbid):
    theta, lengths = scores(n, scale, n + int(scale) + single_root, forbid)
    valid, real = partition.masks(n, lengths, theta.device)
    logW = partition._shifted(theta, valid)[0]
    W = logW.exp()
    assert kernel.applies(theta)
    z, mu, ok = kernel.certified(W.clone(), real, single_root)
    z0, mu0, ok0 = cert.marginals(W.clone(), real, single_root)
    assert torch.equal(ok, ok0)
    assert_close(z[ok], z0[ok], rtol=1e-13, atol=1e-13)
    assert_close(mu[ok], mu0[ok], rtol=0, atol=1e-13)
    if scale == 1.0 and not forbid:
        assert ok.all()


@ROOTS
@pytest.mark.parametrize("scale", [1.0, 4.0, 40.0])
def test_log_z_alone_is_certified_where_the_marginals_are_and_within_tol_of_the_exact_value(single_root, scale):
    theta, lengths = scores(12, scale, 7 + single_root, forbid=True)
    valid, real = partition.masks(12, lengths, theta.device)
    logW = partition._shifted(theta, valid)[0]
    z, mu, ok = kernel.certified(logW.exp(), real, single_root, marginals=False)
    assert mu is None
    assert (ok | ~kernel.certified(logW.exp(), real, single_root)[2]).all()
    feasible, connected = partition.feasibility(logW, real, single_root)
    exact = partition.solve(logW, real, single_root, fast=False)[0]
    assert_close(z[ok], exact[ok], rtol=0, atol=cert.TOL)
    assert not ok[~(feasible & connected)].any()


@ROOTS
@pytest.mark.parametrize("marginals", [True, False], ids=["marginals", "logZ"])
@pytest.mark.parametrize("scale", [1.0, 40.0, 1000.0])
@pytest.mark.parametrize("device_path", [False, True], ids=["default", "device"])
def test_the_paths_through_the_kernel_equal_those_without_it(single_root, marginals, scale, device_path, monkeypatch):
    """Certified, exact linear and log-space examples alike (the kernel's uncertified ones move on),
    on the path a GPU takes by default (the C extension set aside) and on the device path."""
    monkeypatch.setattr(partition, "_matrix_tree_c", None)
    theta, lengths = scores(9, scale, 3, forbid=True)
    for n in (None, lengths):
        z, mu = partition.log_partition_and_marginals(theta, n, single_root, marginals=marginals, device_path=device_path)
        with kernel.enabled.to(False):
            z0, mu0 = partition.log_partition_and_marginals(theta, n, single_root, marginals=marginals,
                                                            device_path=device_path)
        assert_close(z, z0, rtol=1e-12, atol=1e-9)
        if marginals:
            assert_close(mu, mu0, rtol=0, atol=1e-9)
        else:
            assert mu is None and mu0 is None


def test_what_the_kernel_does_not_take():
    theta = torch.randn(2, 6, 6, device=DEVICE)
    assert kernel.applies(theta) and kernel.applies(theta.double())
    assert not kernel.applies(torch.randn(1, kernel.MAX_WORDS + 2, kernel.MAX_WORDS + 2, device=DEVICE))
    with kernel.enabled.to(False):
        assert not kernel.applies(theta)
    if not CUDA:
        with kernel.interpreting.to(False):
            assert not kernel.applies(theta)
