"""Where one call of ours spends its GPU time: for the main GPU rows, the first call's time (Triton
compiles its kernels then), a warm call's, and torch.profiler's kernels by total GPU time.

    python -m benchmarks.gpu_profile [--top 12] [--out profile.md]

Complements ``benchmarks.gpu`` (ratios to the peers) with what to speed up next (issue 29).
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import torch

from benchmarks import chain, ctc, pcfg, projective


def _timed(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def calls() -> dict[str, Callable[[], object]]:
    theta = torch.randn(projective.B, 65, 65)
    B, T, V, S = ctc.SIZES[0]
    return {
        "chain marginals B32 N128 C32": chain.make_chain("marginals", "ours", 32),
        f"CTC loss + gradient B{B} T{T} V{V} S{S}": ctc.implementations(B, T, V, S)["ours"],
        "projective marginals B16 n64": lambda: projective.ours(theta),
        "PCFG inside B8 N30 NT30 T60": pcfg.implementations("inside", *pcfg.grammar(*pcfg.SIZES[0]))["ours"],
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--out")
    args = p.parse_args(argv)
    lines = [f"GPU: {torch.cuda.get_device_name()}"]
    with torch.device("cuda"):
        for label, fn in calls().items():
            first = _timed(fn)
            warm = min(_timed(fn) for _ in range(5))
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            busy = sum(e.device_time for e in kernels) / 1e3
            lines += [f"\n## {label}\nfirst call {first:.3f} s, warm {warm * 1e3:.2f} ms, {len(kernels)} GPU kernels, "
                      f"{busy:.2f} ms of GPU time\n",
                      prof.key_averages().table(sort_by="device_time_total", row_limit=args.top, max_name_column_width=60)]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
