"""Where one call of ours spends its GPU time: for the main GPU rows, the first call's time (Triton
compiles its kernels then), a warm call's, and torch.profiler's kernels by total GPU time; then the
same rows' warm time under other settings of the Triton levels (tile ``BI x BK``, warps per program;
a linear chain as a scan or as levels), to choose them on a GPU.

    python -m benchmarks.gpu_profile [--top 12] [--out profile.md]

Complements ``benchmarks.gpu`` (ratios to the peers) with what to speed up next (issue 29).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from benchmarks import chain, constituency, ctc, pcfg, projective
from semiring.language import triton_levels

SETTINGS = [  # overrides of triton_levels' settings; the first: none (the defaults)
    {}, {"ATOMICS": "acq_rel"}, {"CHAIN_SCANS": False}, {"POINTWISE_BI": 0}, {"POINTWISE_BI": 64}, {"POINTWISE_BI": 256}, {"BI": 16, "BK": 16}, {"WARPS": 8},
    {"WARPS": 2}, {"BI": 64, "BK": 16}, {"BI": 16, "BK": 64}, {"WARPS": 2, "POINTWISE_BI": 64}]


def _timed(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def calls() -> dict[str, Callable[[], object]]:
    theta = torch.randn(projective.B, 65, 65)
    spans = torch.randn(constituency.B, 40, 40, constituency.L)
    B, T, V, S = ctc.SIZES[0]
    return {
        "chain marginals B32 N128 C32": chain.make_chain("marginals", "ours", 32),
        f"CTC loss + gradient B{B} T{T} V{V} S{S}": ctc.implementations(B, T, V, S)["ours"],
        "projective marginals B16 n64": lambda: projective.ours(theta),
        "PCFG inside B8 N30 NT30 T60": pcfg.implementations("inside", *pcfg.grammar(*pcfg.SIZES[0]))["ours"],
        "constituency marginals B16 n40 L8": lambda: constituency.ours(spans),
        "CRF nll B32 N128 C32": chain.make_crf("nll", "ours (nn.CRF)", True),
    }


def sweep(rows: dict[str, Callable[[], object]]) -> list[str]:
    """Each row's warm time (median of 9 calls after 3, ms) under each of :data:`SETTINGS`."""
    lines = ["\n## Settings of the Triton levels: warm ms, median of 9 calls\n",
             "| setting | " + " | ".join(rows) + " |", "|:--|" + "--:|" * len(rows)]
    for setting in SETTINGS:
        saved = {name: getattr(triton_levels, name) for name in (*setting, "SPLIT")}
        for name, value in setting.items():
            setattr(triton_levels, name, value)
        triton_levels.SPLIT = 16 * triton_levels.BI * triton_levels.BK
        try:
            cells = []
            for fn in rows.values():
                for _ in range(3):  # (compiles, and lets the allocator and caches settle: a first row was the slowest)
                    fn()
                cells.append(f"{statistics.median(_timed(fn) for _ in range(9)) * 1e3:.2f}")
        finally:
            for name, value in saved.items():
                setattr(triton_levels, name, value)
        lines.append(f"| {setting or 'defaults'} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--out", help="also write the report to this file (as it goes)")
    args = p.parse_args(argv)
    out = open(args.out, "w") if args.out else None

    def say(*lines: str) -> None:
        for line in lines:
            print(line, flush=True)
            if out:
                out.write(line + "\n")
                out.flush()

    say(f"GPU: {torch.cuda.get_device_name()}")
    with torch.device("cuda"):
        rows = calls()
        for label, fn in rows.items():
            first = _timed(fn)
            warm = min(_timed(fn) for _ in range(5))
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            busy = sum(e.device_time for e in kernels) / 1e3
            say(f"\n## {label}\nfirst call {first:.3f} s, warm {warm * 1e3:.2f} ms, {len(kernels)} GPU kernels, "
                f"{busy:.2f} ms of GPU time\n",
                prof.key_averages().table(sort_by="device_time_total", row_limit=args.top, max_name_column_width=60))
        say(*sweep(rows))


if __name__ == "__main__":
    main()
