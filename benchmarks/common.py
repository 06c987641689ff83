"""Shared helpers of the benchmarks: timing, peak memory, tables.

Timing: every implementation of a row is warmed up, then the implementations are run
*round-robin* (ours, peer, ours, peer, ...) and each one's median of ``time.perf_counter`` laps is
reported. Round-robin matters on a small shared machine: background load hits every
implementation of a row alike, so the ratios are steadier than the absolute times.

Peak memory of one call, two ways (docs/benchmarks.md explains both):

* ``peak_tensor_bytes``: the high-water mark of live bytes allocated through torch's CPU
  allocator during the call, from the allocation/free events of ``torch.profiler`` with
  ``profile_memory=True`` (forward, autograd's saved tensors, backward, outputs). Deterministic;
  it does not see memory malloc'ed outside torch (negligible here).
* ``peak_rss_bytes``: the growth of the process's resident set, in a fresh subprocess: the
  kernel's high-water mark (``VmHWM``) is reset through ``/proc/self/clear_refs`` just before
  the call, and the peak minus the resident size at that moment is reported. glibc's dynamic mmap
  threshold is pinned (``MALLOC_MMAP_THRESHOLD_``) so that freed large blocks go back to the
  kernel and the warm-up call cannot hide the measured one's growth.
"""

from __future__ import annotations

import argparse
import csv
import gc
import importlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

DEFAULT_THREADS = 1
DEFAULT_SEED = 0


def setup(threads: int = DEFAULT_THREADS, seed: int = DEFAULT_SEED) -> None:
    """Fix the thread count and seed every generator."""
    torch.set_num_threads(threads)
    seed_all(seed)


def side_by_side_options(doc: str, argv, repeat: int, quick: str) -> argparse.Namespace:
    """The options of a side-by-side benchmark (``--repeat``, ``--threads``, ``--quick``: ``quick``
    says what it runs), parsed from ``argv``; then ``setup`` at those threads, peers' warnings off."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--repeat", type=int, default=repeat, help="round-robin rounds")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="torch threads")
    p.add_argument("--quick", action="store_true", help=quick)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    setup(args.threads)
    return args


def pin_one_core(core: int | None = None) -> int:
    """Keep this process (and the processes it starts) on one core, by default the last it may
    use; returns the core. Peers in other processes (SynJax) then share the CPU with ours."""
    core = max(os.sched_getaffinity(0)) if core is None else core
    os.sched_setaffinity(0, {core})
    return core


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Lap:
    """What a call that times itself returns (a peer timed in its own process): its seconds, used
    by :func:`time_round_robin` instead of the wall time around the call."""

    seconds: float


@dataclass
class Timing:
    median: float  # seconds
    q1: float
    q3: float
    runs: int
    min: float = 0.0

    @property
    def ms(self) -> float:
        return self.median * 1e3


def time_round_robin(fns: Mapping[str, Callable[[], object]], repeat: int = 11, warmup: int = 2,
                     min_repeat: int = 3, budget_s: float | None = None) -> dict[str, Timing]:
    """Median wall time of each zero-argument function, run round-robin after ``warmup`` calls each.

    With ``budget_s``, stop early (after at least ``min_repeat`` rounds) once the rounds so far
    have taken that long: slow peers (seconds per call) get fewer, still median-of-several, runs.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    laps: dict[str, list[float]] = {name: [] for name in fns}
    start = time.perf_counter()
    for r in range(repeat):
        for name, fn in fns.items():
            gc.collect()
            t = time.perf_counter()
            out = fn()
            laps[name].append(out.seconds if isinstance(out, Lap) else time.perf_counter() - t)
            del out
        if budget_s is not None and r + 1 >= min_repeat and time.perf_counter() - start > budget_s:
            break
    out = {}
    for name, xs in laps.items():
        qs = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
        out[name] = Timing(statistics.median(xs), qs[0], qs[2], len(xs), min(xs))
    return out


# ---------------------------------------------------------------------------- memory


def peak_tensor_bytes(fn: Callable[[], object]) -> int:
    """High-water mark of live torch CPU allocations during ``fn()`` (bytes above the start)."""
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    del out
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def peak_rss_bytes(module: str, case: str, kwargs: Mapping[str, object], threads: int = DEFAULT_THREADS,
                   seed: int = DEFAULT_SEED) -> int | None:
    """Peak growth of the resident set during one call of ``module.CASES[case](**kwargs)()`` in a
    fresh subprocess (after one warm-up call). ``None`` where /proc cannot reset the peak."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
    arg = json.dumps({"module": module, "case": case, "kwargs": dict(kwargs), "threads": threads, "seed": seed})
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, "-m", "benchmarks.common", "--rss", arg], cwd=root, env=env,
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"rss subprocess failed for {case} {kwargs}:\n{res.stderr[-2000:]}")
    value = json.loads(res.stdout.strip().splitlines()[-1])
    return None if value is None else int(value)


def _rss_child(arg: str) -> None:
    spec = json.loads(arg)
    setup(spec["threads"], spec["seed"])
    case = importlib.import_module(spec["module"]).CASES[spec["case"]](**spec["kwargs"])
    out = case()  # warm-up: lazy initialisation, compiled schedules
    del out
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
    except OSError:
        print(json.dumps(None))
        return
    before = _status_kb("VmRSS")
    out = case()
    peak = _status_kb("VmHWM")
    del out
    print(json.dumps((peak - before) * 1024))


# ---------------------------------------------------------------------------- reporting


SIMD_FLAGS = ("sse2", "avx", "avx2", "fma", "avx512f", "avx512vl", "avx512bw", "avx512dq", "neon", "asimd")


def cpu_model_and_flags() -> tuple[str, str]:
    """The CPU's model name and which of :data:`SIMD_FLAGS` it has (from /proc/cpuinfo; "?" elsewhere)."""
    cpu, flags = platform.processor() or "?", "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and cpu in ("?", platform.processor()):
                    cpu = value.strip()
                elif key.strip() in ("flags", "Features") and flags == "?":
                    have = set(value.split())
                    flags = " ".join(x for x in SIMD_FLAGS if x in have)
    except OSError:
        pass
    return cpu, flags


def kernel_info() -> str:
    """The compiler's C kernel as it runs here: its instruction set and whether it is threaded."""
    from semiring.language import kernel

    if kernel._kernel is None:
        return "not built (torch calls)"
    threads = "up to torch's threads" if kernel._kernel.threaded else "one thread (built without threads)"
    return f"{kernel._kernel.isa()} of {', '.join(kernel._kernel.isas())}; {threads}"


def machine_info() -> dict[str, str]:
    cpu, flags = cpu_model_and_flags()
    info = {
        "cpu": cpu,
        "cpu flags (SIMD)": flags,
        "C kernel": kernel_info(),
        "cores": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load average (1, 5, 15 min)": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "semiring", "structures"], cwd=root,
                               capture_output=True, text=True).stdout.split("\n")
        dirty = sorted({line[3:] for line in dirty if line.strip()})
        info["code"] = f"git {head}" + (f" + uncommitted changes in {', '.join(dirty)}" if dirty else " (clean)")
    except OSError:
        pass
    for name in ("torch-struct", "pytorch-crf"):
        try:
            from importlib.metadata import version

            info[name] = version(name)
        except Exception:  # noqa: BLE001 - reporting only
            info[name] = "not installed"
    return info


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    return f"{n / 2**20:.1f} MiB"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """A GitHub markdown table; ``align`` is one letter per column (l, r, c), default left then right."""
    align = align or "l" + "r" * (len(headers) - 1)
    sep = {"l": ":--", "r": "--:", "c": ":-:"}
    lines = ["| " + " | ".join(map(str, headers)) + " |", "|" + "|".join(sep[a] for a in align) + "|"]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(path: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(headers)
        w.writerows(rows)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rss":
        _rss_child(sys.argv[2])
    else:
        sys.exit("usage: python -m benchmarks.common --rss JSON  (internal: see peak_rss_bytes)")


def against_peers(impls: Mapping[str, Callable[[], object]], label: str, size: str, repeat: int) -> tuple[list, list]:
    """One size of a side-by-side benchmark: ``impls`` are ``"ours"`` and the peers, zero-argument
    calls on the same inputs. Returns a row per peer of times (round-robin medians, peer / ours, and
    the ratio of the minimums) and a row per peer of peak tensor bytes (ours / peer)."""
    times = time_round_robin(impls, repeat=repeat, budget_s=60)
    peaks = {name: peak_tensor_bytes(fn) for name, fn in impls.items()}
    peers = [name for name in impls if name != "ours"]
    ours, mine = times["ours"], peaks["ours"]
    rows = [[label, f"{ours.ms:.1f}", p, f"{times[p].ms:.1f}", f"**{times[p].median / ours.median:.2f}×**",
             f"{times[p].min / ours.min:.2f}×"] for p in peers]
    memory = [[size, fmt_bytes(mine), p, fmt_bytes(peaks[p]), f"{mine / peaks[p]:.3f}"] for p in peers]
    return rows, memory


def print_against_peers(rows: list, memory: list) -> None:
    """The machine, then the tables of :func:`against_peers`' rows, in markdown."""
    print(markdown_table(["", ""], [[k, v] for k, v in machine_info().items()]))
    print()
    print(markdown_table(["benchmark", "ours (ms)", "peer", "peer (ms)", "peer / ours", "ratio of minimums"], rows, "lllrrr"))
    print()
    print(markdown_table(["size", "ours peak", "peer", "peer peak", "ours / peer"], memory, "llllr"))

