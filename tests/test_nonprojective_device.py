"""The device path of the non-projective CRF's matrix-tree numerics (``device_path`` of
:func:`structures.spanning._tree_partition.log_partition_and_marginals`, the path off the CPU), run here on
the CPU: the same answers as the default path, and no host decision (checked under torch's
``FakeTensorMode``, where every read of a value or shape that depends on one raises)."""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode
from torch.testing import assert_close

import structures.spanning._tree_partition as partition
from structures.spanning._tree_partition import log_partition_and_marginals

ROOTS = pytest.mark.parametrize("single_root", [False, True], ids=["multi", "single"])
QUERIES = pytest.mark.parametrize("marginals", [True, False], ids=["marginals", "logZ"])


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def batch(scale: float, seed: int, forbid: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(θ [6, 11, 11], lengths [6])`` at score scale ``scale``; with ``forbid``: -inf arcs, one
    example with no tree (a word without a head), one whose words' graph is not strongly connected."""
    g = gen(seed)
    theta = torch.randn(6, 11, 11, generator=g, dtype=torch.float64) * scale
    if forbid:
        theta[0] = theta[0].masked_fill(torch.rand(11, 11, generator=g) < 0.4, -math.inf)
        theta[1, :, 4] = -math.inf
        theta[2, 1:4, 4:] = -math.inf  # words 1-3 reach no later word
    return theta, torch.tensor([10, 10, 10, 1, 7, 4])


def assert_same(a, b, marginals: bool) -> None:
    assert_close(a[0], b[0], rtol=1e-12, atol=1e-9)
    if marginals:
        assert_close(a[1], b[1], rtol=0, atol=1e-9)
    else:
        assert a[1] is None and b[1] is None


@ROOTS
@QUERIES
@pytest.mark.parametrize("forbid", [False, True], ids=["finite", "forbidden"])
@pytest.mark.parametrize("scale", [1.0, 3.0, 40.0, 1000.0])
def test_device_path_equals_the_default_path(single_root, marginals, forbid, scale):
    """Every path is met: certified, exact linear (std 40), log space (std 1000: the rare examples,
    after the device path's one read), conditioning on the root's child, no tree; with and without
    lengths, float32 too."""
    theta, lengths = batch(scale, int(scale) + 2 * forbid + single_root, forbid)
    for x in (theta, theta.float()):
        for n in (None, lengths):
            expected = log_partition_and_marginals(x, n, single_root, marginals=marginals)
            assert_same(log_partition_and_marginals(x, n, single_root, marginals=marginals, device_path=True),
                        expected, marginals)


@ROOTS
def test_certified_tells_where_the_fast_path_answered(single_root):
    theta, lengths = batch(40.0, 5, True)
    info: dict = {}
    log_partition_and_marginals(theta, lengths, single_root, info=info, device_path=True)
    reference: dict = {}
    log_partition_and_marginals(theta, lengths, single_root, info=reference, device_path=False)
    assert torch.equal(info["certified"], reference["certified"])
    assert reference["certified"].tolist() == [m == "fast" for m in reference["method"]]


@ROOTS
def test_without_rare_sync_the_rare_examples_are_nan_and_the_others_equal(single_root, monkeypatch):
    """The rare examples are exactly those the default path sends to log space or conditioning."""
    theta, lengths = batch(1000.0, 9, True)
    theta[3:] /= 100.0  # std 10: certified or exact linear
    info: dict = {}
    z, mu = log_partition_and_marginals(theta, lengths, single_root, info=info)
    monkeypatch.setattr(partition, "RARE_SYNC", False)
    zd, mud = log_partition_and_marginals(theta, lengths, single_root, device_path=True)
    rare = torch.isnan(zd)
    assert rare.tolist() == [m in ("log", "conditioned") for m in info["method"]] and bool(rare.any())
    assert bool(torch.isnan(mud[rare]).all())
    assert_close(zd[~rare], z[~rare], rtol=1e-12, atol=1e-9)
    assert_close(mud[~rare], mu[~rare], rtol=0, atol=1e-9)


def on_fake_tensors(single_root: bool, marginals: bool, lengths: bool, device_path: bool):
    """The query's results on fake tensors (no value exists: any host decision raises)."""
    theta, n = batch(40.0, 3, False)
    with FakeTensorMode() as mode:
        x = mode.from_tensor(theta)
        n = mode.from_tensor(n) if lengths else None
        info: dict = {}
        z, mu = log_partition_and_marginals(x, n, single_root, info=info, marginals=marginals, device_path=device_path)
    return z, mu, info["certified"]


@ROOTS
@QUERIES
@pytest.mark.parametrize("lengths", [False, True], ids=["full", "lengths"])
def test_no_host_decision_without_rare_sync(single_root, marginals, lengths, monkeypatch):
    """Finite scores at std 40 (where most examples fail the certificate), with RARE_SYNC off."""
    monkeypatch.setattr(partition, "RARE_SYNC", False)
    z, mu, certified = on_fake_tensors(single_root, marginals, lengths, device_path=True)
    assert z.shape == (6,) and certified.shape == (6,) and (mu is None) != marginals


@ROOTS
def test_the_guard_catches_the_host_decisions_of_the_default_path(single_root, monkeypatch):
    """The guard of the test above can fail: the default path (torch, the C extension off) reads
    the device, and so does the device path's one read of the rare examples."""
    monkeypatch.setattr(partition, "_matrix_tree_c", None)
    with pytest.raises((DataDependentOutputException, DynamicOutputShapeException)):
        on_fake_tensors(single_root, True, True, device_path=False)
    with pytest.raises(DynamicOutputShapeException):
        on_fake_tensors(single_root, True, True, device_path=True)  # RARE_SYNC on


@ROOTS
def test_the_rare_examples_are_the_one_read(single_root, monkeypatch):
    """With RARE_SYNC on, finite scores read the device once: ``rare.nonzero()`` (empty here)."""
    theta, lengths = batch(3.0, 4, False)
    calls = []
    nonzero = torch.Tensor.nonzero

    def counted(self, *args, **kwargs):
        calls.append(self.shape)
        return nonzero(self, *args, **kwargs)

    def refuse(self, *args, **kwargs):
        raise AssertionError("a host read")

    monkeypatch.setattr(torch.Tensor, "nonzero", counted)
    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    log_partition_and_marginals(theta, lengths, single_root, device_path=True)
    assert calls == [(6,)]
    monkeypatch.setattr(partition, "_matrix_tree_c", None)  # the torch path off the device path decides on the host
    with pytest.raises(AssertionError, match="a host read"):
        log_partition_and_marginals(theta, lengths, single_root, device_path=False)



@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@ROOTS
def test_on_cuda_equals_the_cpu_and_never_synchronises_without_rare_sync(single_root, monkeypatch):
    theta, lengths = batch(40.0, 7, False)
    expected = log_partition_and_marginals(theta, lengths, single_root)
    x, n = theta.cuda(), lengths.cuda()
    monkeypatch.setattr(partition, "DEVICE_PATH", True)
    got = log_partition_and_marginals(x, n, single_root)  # the device path; its one read
    assert_same((got[0].cpu(), got[1].cpu()), expected, True)
    monkeypatch.setattr(partition, "RARE_SYNC", False)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = log_partition_and_marginals(x, n, single_root)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_same((got[0].cpu(), got[1].cpu()), expected, True)


@ROOTS
def test_the_distribution_and_its_gradients_on_the_device_path(single_root, monkeypatch):
    """``NonProjectiveDependencyCRF`` through the device path: the same log Z, marginals, first and
    second derivatives (std 40 and padding: certified and exact examples side by side)."""
    import functools

    import structures.spanning.nonprojective as nonprojective
    from structures import NonProjectiveDependencyCRF

    theta, lengths = batch(40.0, 6, True)
    theta[3:] /= 10.0
    results = []
    for device_path in (False, True):
        call = functools.partial(partition.log_partition_and_marginals, device_path=device_path)
        monkeypatch.setattr(nonprojective, "log_partition_and_marginals", call)
        leaf = theta.clone().requires_grad_()
        d = NonProjectiveDependencyCRF(leaf, lengths, single_root=single_root)
        w = torch.linspace(-1, 1, theta.numel(), dtype=theta.dtype).reshape(theta.shape)
        (grad,) = torch.autograd.grad(d.log_partition.sum() + (d.marginals * w).sum(), leaf)
        results.append((d.log_partition.detach(), d.marginals.detach(), grad))
    for a, b in zip(*results):
        assert_close(a, b, rtol=1e-12, atol=1e-9)
