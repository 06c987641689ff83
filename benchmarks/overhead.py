"""The fixed cost of a query: per-call time and torch operations at sizes where the work is nothing.

At these sizes a call's time is the Python path every query takes, on the CPU as on a GPU
(structure construction and validation, the program's checks, plan look-up, buffers, the
autograd node, the goal read-out, marginals through backward): what is measured here is what a
GPU call pays on the host besides its kernels. Each query builds its structure afresh, as a
training step does. Times are medians of ``--repeat`` calls after a warm-up, in microseconds, of
wall time and of the thread's CPU time (steadier on a shared machine);
``ops`` counts the torch operators one call dispatches (a ``TorchDispatchMode``: the ATen ops
below autograd, each a dispatch on a GPU, kernel or not).

``python -m benchmarks.overhead [--repeat 2000] [--profile QUERY]`` (one thread; pin a core with
``taskset -c 1``). ``--profile`` prints cProfile's top functions of one query instead. The chain of
128 positions shows what each level costs the host (its kernel work is still small).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.common import machine_info, setup


class _Count(TorchDispatchMode):
    """Counts the ATen operators dispatched inside."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def queries() -> dict[str, Callable[[], object]]:
    """name -> one call of the query (fresh structure, fixed inputs)."""
    import structures as st
    from structures.nn.crf import CRF

    g = torch.Generator().manual_seed(0)
    chain = torch.randn(2, 7, 4, 4, generator=g)  # B=2 N=8 C=4
    long_chain = torch.randn(2, 127, 4, 4, generator=g)  # N=128: the host's cost per level
    logits = torch.randn(2, 10, 5, generator=g)  # CTC B=2 T=10 V=5 S=3
    targets = torch.tensor([[1, 2, 3], [4, 4, 0]])
    target_lengths = torch.tensor([3, 2])
    align = torch.randn(2, 8, 8, generator=g)
    arcs = torch.randn(2, 9, 9, generator=g)  # n=8 words and the root
    emissions = torch.randn(2, 8, 4, generator=g)
    transitions = torch.randn(4, 4, generator=g)
    tags = torch.randint(0, 4, (2, 8), generator=g)
    crf = CRF(4, batch_first=True)

    def ctc_loss_grad() -> None:
        x = logits.clone().requires_grad_()
        dist = st.CTC(x.log_softmax(-1), targets, target_lengths=target_lengths)
        (-dist.log_partition).sum().backward()

    def crf_nll() -> None:
        crf.zero_grad(set_to_none=True)
        crf(emissions, tags).neg().backward()

    return {
        "chain marginals B2 N8 C4": lambda: st.LinearChainCRF(chain).marginals,
        "chain log_partition B2 N8 C4": lambda: st.LinearChainCRF(chain).log_partition,
        "chain marginals B2 N128 C4": lambda: st.LinearChainCRF(long_chain).marginals,
        "CTC loss+grad B2 T10 V5 S3": ctc_loss_grad,
        "alignment marginals B2 n=m=8": lambda: st.AlignmentCRF(align).marginals,
        "projective marginals B2 n8": lambda: st.ProjectiveDependencyCRF(arcs).marginals,
        "EmissionCRF log_prob B2 N8 C4": lambda: st.EmissionCRF(emissions, transitions).log_prob(tags),
        "nn.CRF nll+grad B2 N8 C4": crf_nll,
    }


def per_call_us(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median microseconds of one call: wall time, and the thread's CPU time (which a shared
    machine's other processes do not inflate by taking the core away)."""
    for _ in range(20):
        fn()
    wall, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - t)
    return statistics.median(wall) * 1e6, statistics.median(cpu) * 1e6


def ops_per_call(fn: Callable[[], object]) -> int:
    fn()
    with _Count() as count:
        fn()
    return count.ops


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=2000, help="timed calls per query (median)")
    p.add_argument("--profile", help="cProfile one query (a substring of its name) instead")
    p.add_argument("--sort", default="tottime", help="the profile's order (tottime, cumtime)")
    args = p.parse_args(argv)
    setup(1)
    found = queries()
    if args.profile:
        name, fn = next((n, f) for n, f in found.items() if args.profile in n)
        per_call_us(fn, 50)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            fn()
        prof.disable()
        print(f"{name}: 200 calls")
        pstats.Stats(prof).sort_stats(args.sort).print_stats(30)
        return
    info = machine_info()
    print(f"{info['cpu']}; torch {info['torch']}; {info['code']}")
    print(f"{'query':32} {'us/call':>9} {'cpu us':>9} {'ops/call':>9}")
    for name, fn in found.items():
        wall, cpu = per_call_us(fn, args.repeat)
        print(f"{name:32} {wall:9.0f} {cpu:9.0f} {ops_per_call(fn):9d}", flush=True)


if __name__ == "__main__":
    main()
