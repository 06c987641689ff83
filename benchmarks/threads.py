"""Two threads against one: each row's query at ``torch.set_num_threads(1)`` and ``(2)``, round-robin
in one process, medians and minimums of ``--repeat`` calls, and their ratio (issue 31's row: at
least 1.7x on two idle cores for B >= 8).

    python -m benchmarks.threads [--repeat 15]

The C kernel, the scans and the matrix-tree theorem split a batch across up to
``torch.get_num_threads()`` threads: OpenMP's, the runtime torch's own operations use (built with
``-fopenmp``). With threads of their own (POSIX threads, before 2026-11-28) they competed for the
cores with torch's OpenMP workers, which spin for a while after each parallel operation
(libgomp's default, ``OMP_WAIT_POLICY`` unset), so the environment is printed with the results.
Run it on idle cores: each thread needs one.

Two cores of a VM may be one physical core's two hyperthreads, or share it otherwise: then no split
of throughput-bound work gets near 2x. So the script first measures the machine's **two-core
ceiling**: a fixed amount of one-thread work (``--ceiling-work``: 512 x 512 matrix products, or our
alignment log Z), timed in a process pinned to each core alone, then in two such processes at once;
the ceiling is their combined throughput over one process's alone (2.0 for two free physical cores),
from the medians of three rounds.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time
from typing import Callable

import torch

from benchmarks.common import machine_info


def rows() -> dict[str, Callable[[], object]]:
    """name -> one query (a fresh structure, fixed inputs), every batch of at least 16."""
    import structures as st

    g = torch.Generator().manual_seed(0)
    chain = torch.randn(32, 127, 32, 32, generator=g)
    arcs = torch.randn(16, 65, 65, generator=g)
    scores = torch.randn(16, 64, 64, generator=g)
    trees = torch.randn(16, 129, 129, generator=g, dtype=torch.float64)
    spans = torch.randn(16, 40, 40, 8, generator=g)
    logits = torch.randn(16, 200, 50, generator=g)
    targets = torch.randint(1, 50, (16, 40), generator=g)

    def ctc() -> None:
        x = logits.clone().requires_grad_()
        torch.autograd.grad(-st.CTC(x.log_softmax(-1), targets).log_partition.sum(), x)

    return {
        "chain marginals B32 N128 C32": lambda: st.LinearChainCRF(chain).marginals,
        "projective marginals B16 n64": lambda: st.ProjectiveDependencyCRF(arcs).marginals,
        "constituency marginals B16 n40 L8": lambda: st.ConstituencyCRF(spans).marginals,
        "alignment log Z B16 n=m=64": lambda: st.AlignmentCRF(scores).log_partition,
        "alignment marginals B16 n=m=64": lambda: st.AlignmentCRF(scores).marginals,
        "non-projective marginals B16 n128 (float64)": lambda: st.NonProjectiveDependencyCRF(trees).marginals,
        "CTC loss + grad B16 T200 V50 S40": ctc,
    }


def measure(queries: dict[str, Callable[[], object]], repeat: int) -> dict[tuple[str, int], list[float]]:
    """Seconds of each query at 1 and 2 threads, ``repeat`` rounds of every query at both counts."""
    times: dict[tuple[str, int], list[float]] = {(name, t): [] for name in queries for t in (1, 2)}
    for fn in queries.values():
        for t in (1, 2):
            torch.set_num_threads(t)
            fn()
            fn()
    for _ in range(repeat):
        for name, fn in queries.items():
            for t in (1, 2):
                torch.set_num_threads(t)
                gc.collect()
                start = time.perf_counter()
                fn()
                times[name, t].append(time.perf_counter() - start)
    return times


CEILING_WORK = {"matmul": 400, "alignment": 300}
"""Calls of each ceiling workload a process times (~0.3-1 s on one core)."""


def burn(kind: str, core: int) -> float:
    """Seconds of ``CEILING_WORK[kind]`` one-thread calls on ``core``, after a warm-up."""
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    if kind == "matmul":
        a, b = torch.randn(512, 512), torch.randn(512, 512)
        fn = lambda: a @ b  # noqa: E731
    else:
        import structures as st

        scores = torch.randn(16, 64, 64)
        fn = lambda: st.AlignmentCRF(scores).log_partition  # noqa: E731
    for _ in range(10):
        fn()
    start = time.perf_counter()
    for _ in range(CEILING_WORK[kind]):
        fn()
    return time.perf_counter() - start


def two_core_ceiling(kind: str, cores: tuple[int, int], rounds: int = 3) -> tuple[float, list[float], list[float]]:
    """(ceiling, median seconds alone per core, median seconds together per core) of the ``kind``
    workload over ``rounds`` rounds (each: one process on each core in turn, then both at once)."""
    def start(core: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "benchmarks.threads", "--burn", kind, "--core", str(core)],
                                stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def seconds(proc: subprocess.Popen) -> float:
        out, _ = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"the {kind} workload failed (exit {proc.returncode})")
        return float(out.split()[-1])

    alone: list[list[float]] = [[], []]
    together: list[list[float]] = [[], []]
    for _ in range(rounds):
        for i, c in enumerate(cores):
            alone[i].append(seconds(start(c)))
        for i, proc in enumerate([start(c) for c in cores]):
            together[i].append(seconds(proc))
    alone_s = [statistics.median(xs) for xs in alone]
    together_s = [statistics.median(xs) for xs in together]
    ceiling = sum(1 / t for t in together_s) / statistics.mean(1 / t for t in alone_s)
    return ceiling, alone_s, together_s


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=15, help="rounds (each query once at each thread count)")
    p.add_argument("--ceiling-work", nargs="*", default=["matmul", "alignment"], choices=sorted(CEILING_WORK),
                   help="workloads of the two-core ceiling (none: skip it)")
    p.add_argument("--burn", choices=sorted(CEILING_WORK), help=argparse.SUPPRESS)  # a ceiling's worker process
    p.add_argument("--core", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.burn:
        print(burn(args.burn, args.core))
        return
    cores = tuple(sorted(os.sched_getaffinity(0)))[:2]
    ceilings = {kind: two_core_ceiling(kind, cores) for kind in args.ceiling_work} if len(cores) == 2 else {}
    queries = rows()
    times = measure(queries, args.repeat)
    info = machine_info()
    print(f"{info['cpu']}; {info['cores']} cores; torch {info['torch']}; {info.get('code', '')}; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; load {info['load average (1, 5, 15 min)']}")
    for kind, (ceiling, alone, together) in ceilings.items():
        print(f"two-core ceiling ({kind}, cores {cores[0]} and {cores[1]}, medians of 3 rounds): {ceiling:.2f}x "
              f"(s alone {alone[0]:.3f} / {alone[1]:.3f}, together {together[0]:.3f} / {together[1]:.3f})")
    print(f"| query | 1 thread (ms) | 2 threads (ms) | 1 / 2 threads |\n|:--|--:|--:|--:|")
    for name in queries:
        one, two = times[name, 1], times[name, 2]
        print(f"| {name} | {1e3 * statistics.median(one):.2f} | {1e3 * statistics.median(two):.2f} | "
              f"{statistics.median(one) / statistics.median(two):.2f}x ({min(one) / min(two):.2f}x) |")
    torch.set_num_threads(1)


if __name__ == "__main__":
    main()
