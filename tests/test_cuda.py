"""Every structure and layer on a CUDA device: the CPU's answers, on the inputs' device, and no host
synchronisation while a program runs or differentiates.

Marked ``cuda``; skipped where no CUDA device exists. The CPU run of the same inputs is the oracle
(the CPU paths are checked against enumeration elsewhere)."""

from __future__ import annotations

import math
from typing import Callable

import pytest
import torch
from torch.testing import assert_close

from brute import FAMILIES, random_lengths, random_potentials
from structures import CTC, HMM, PCFG, TDPCFG, AlignmentCRF, SecondOrderDependencyCRF
from test_nn_padding import CASES as LAYERS, by_lengths, flat

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda")


def _leaves(device: torch.device, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(device).requires_grad_() for t in tensors]


# A builder of a structure takes a device and gives (make, leaves): ``make()`` builds the
# distribution from tensors already on the device (so that building it copies nothing from the
# host), ``leaves`` are its floating inputs, which require grad. Its ``as_inputs`` (default
# ``_leaves``) makes those inputs on the device from random tensors.


def _family_builder(family) -> Callable:
    shape = max(family.shapes, key=lambda s: math.prod(s))

    def build(device: torch.device, as_inputs: Callable = _leaves):
        g = torch.Generator().manual_seed(11)
        (theta,) = as_inputs(device, random_potentials(shape, 3, g, forbid=0.2))
        lengths = random_lengths(3, family.max_length(shape), g).to(device)
        return (lambda: family.cls(theta, lengths)), [theta]
    return build


def _others() -> dict[str, Callable]:
    def inputs(device, as_inputs, *shapes):
        g = torch.Generator().manual_seed(3)
        return as_inputs(device, *(torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes))

    def alignment(device, as_inputs=_leaves):
        (theta,) = leaves = inputs(device, as_inputs, (2, 4, 5))
        lengths = {"n": torch.tensor([4, 2], device=device), "m": torch.tensor([5, 3], device=device)}
        return (lambda: AlignmentCRF(theta, lengths)), leaves

    def ctc(device, as_inputs=_leaves):
        (logits,) = leaves = inputs(device, as_inputs, (2, 9, 4))
        targets = torch.tensor([[1, 2, 2], [3, 1, 0]], device=device)
        lengths = torch.tensor([9, 6], device=device), torch.tensor([3, 2], device=device)
        return (lambda: CTC(logits.log_softmax(-1), targets, *lengths)), leaves

    def hmm(device, as_inputs=_leaves):
        emission, transitions, start = leaves = inputs(device, as_inputs, (3, 6), (3, 3), (3,))
        words = torch.tensor([[0, 5, 2, 2, 1], [4, 3, 0, 0, 0]], device=device)
        lengths = torch.tensor([5, 2], device=device)
        return (lambda: HMM(words, emission.log_softmax(-1), transitions.log_softmax(-1), start.log_softmax(-1), lengths)), leaves

    def pcfg(device, as_inputs=_leaves):
        leaves = inputs(device, as_inputs, (2, 4, 3), (2, 2, 5, 5), (2, 2))
        lengths = torch.tensor([4, 2], device=device)
        return (lambda: PCFG(*leaves, lengths)), leaves

    def tdpcfg(device, as_inputs=_leaves):
        leaves = inputs(device, as_inputs, (2, 4, 3), (2, 2, 3), (2, 5, 3), (2, 5, 3), (2, 2))
        lengths = torch.tensor([4, 3], device=device)
        return (lambda: TDPCFG(*leaves, lengths)), leaves

    def second_order(device, as_inputs=_leaves):
        leaves = inputs(device, as_inputs, (2, 5, 5), (2, 5, 5, 5))
        lengths = torch.tensor([4, 2], device=device)
        return (lambda: SecondOrderDependencyCRF(*leaves, lengths)), leaves

    return {"alignment": alignment, "ctc": ctc, "hmm": hmm, "pcfg": pcfg, "tdpcfg": tdpcfg, "second-order": second_order}


def _built(build, device: torch.device):
    make, leaves = build(device)
    return make(), leaves


BUILDERS = {f.name: _family_builder(f) for f in FAMILIES} | _others()
per_structure = pytest.mark.parametrize("build", BUILDERS.values(), ids=BUILDERS.keys())
CPU = torch.device("cpu")


def _to_cuda(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: t.to(CUDA) for k, t in tensors.items()}


def _on_cuda(t: torch.Tensor) -> torch.Tensor:
    assert t.device.type == "cuda", t.device
    return t.detach().cpu()


@per_structure
def test_every_query_on_cuda_equals_the_cpu(build):
    (cpu, _), (gpu, _) = _built(build, CPU), _built(build, CUDA)
    for query in ("log_partition", "marginals", "max", "argmax", "count"):
        assert_close(_on_cuda(getattr(gpu, query)), getattr(cpu, query).detach(), msg=query)
    assert_close(_on_cuda(gpu.entropy()), cpu.entropy().detach())
    # the k best scores; the structures themselves may differ where two tie (a PCFG's left- and
    # right-branching trees over the same rules do), so each must have its score
    scores = _on_cuda(gpu.topk_scores(2))
    assert_close(scores, cpu.topk_scores(2).detach())
    assert_close(_on_cuda(gpu.log_prob(gpu.topk(2)) + gpu.log_partition), scores)
    assert_close(_on_cuda(gpu.log_prob(gpu.argmax)), cpu.log_prob(cpu.argmax).detach())
    assert_close(_on_cuda(gpu.kl(gpu)), cpu.kl(cpu).detach(), atol=1e-9, rtol=0)


@per_structure
def test_first_and_second_derivatives_on_cuda_equal_the_cpu(build):
    """The gradient of log Z + <w, marginals>: the marginals' backward is the second derivative."""
    grads = []
    for device in (CPU, CUDA):
        d, leaves = _built(build, device)
        mu = d.marginals
        w = torch.linspace(-1, 1, mu.numel(), dtype=mu.dtype, device=device).reshape(mu.shape)
        grads.append(torch.autograd.grad(d.log_partition.sum() + (mu * w).sum(), leaves))
    for a, b in zip(*grads):
        assert_close(_on_cuda(b), a)


@per_structure
def test_samples_on_cuda_are_structures_drawn_by_a_cuda_generator(build):
    d, _ = _built(build, CUDA)
    g = torch.Generator(device=CUDA).manual_seed(0)
    samples = d.sample((64,), generator=g)
    assert samples.device.type == "cuda"
    possible = torch.isfinite(d.log_partition)  # an example with every structure forbidden has none to draw
    assert torch.isfinite(d.log_prob(samples)[:, possible]).all()
    again = d.sample((64,), generator=torch.Generator(device=CUDA).manual_seed(0))
    assert torch.equal(samples, again)


@pytest.mark.parametrize("case", LAYERS, ids=[c[0] for c in LAYERS])
def test_every_layer_on_cuda_equals_the_cpu(case):
    _, make, call = case
    torch.manual_seed(0)
    layer = make()
    on_cpu = flat(call(layer, lambda x, dim: x, by_lengths))
    on_gpu = flat(call(layer.to(CUDA), lambda x, dim: x.to(CUDA), lambda prefix="": _to_cuda(by_lengths(prefix))))
    assert len(on_gpu) == len(on_cpu) > 0
    for a, b in zip(on_cpu, on_gpu):
        assert_close(_on_cuda(b), a.detach(), atol=1e-5, rtol=1e-4)


PROGRAMS = {name: build for name, build in BUILDERS.items() if not name.startswith("nonprojective")}


@pytest.mark.parametrize("build", PROGRAMS.values(), ids=PROGRAMS.keys())
def test_no_host_synchronisation_while_a_program_runs_and_differentiates(build, monkeypatch):
    """With validation off (it reads values, so it must synchronise), building a structure, running
    its program in every semiring its queries use and differentiating never waits for the device:
    the second run at a shape (the first builds the plans) is under torch's sync debug mode set to
    raise. (The non-projective CRF's maximum spanning trees are found on the host: not here.)"""
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", False)

    make, leaves = build(CUDA)
    generator = torch.Generator(CUDA)

    def run():
        d = make()
        mu = d.marginals
        torch.autograd.grad(d.log_partition.sum() + (mu * mu).sum() + d.entropy().sum(), leaves)
        d.argmax, d.max, d.topk(2), d.sample((2,), generator=generator)

    run()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("build", PROGRAMS.values(), ids=PROGRAMS.keys())
def test_a_structure_is_captured_by_a_cuda_graph_and_replays_on_new_values(build, monkeypatch):
    """The recipe of docs/benchmarks.md: with validation off, a query is captured once as a CUDA graph;
    a replay after new values are written into the same input tensors gives the eager answers."""
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", False)
    make, leaves = build(CUDA)

    def run():
        d = make()
        return d.log_partition, d.marginals

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    with torch.no_grad():
        for x in leaves:
            x.mul_(0.5).add_(0.25)
    graph.replay()
    for got, expected in zip(captured, run()):
        assert_close(got, expected.detach())
