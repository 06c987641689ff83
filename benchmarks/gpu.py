"""Every side-by-side benchmark's main row on a CUDA device: ours against the peers, same process,
same inputs.

    python -m benchmarks.gpu [--repeat 25] [--quick]

The rows reuse the CPU benchmarks' implementations (benchmarks/chain.py, projective.py, ...): their
inputs are made under ``torch.device("cuda")``, so every tensor they create lives on the GPU. A lap
is one call followed by ``torch.cuda.synchronize()``, so it counts the kernels' time and the
launches' (which dominate at these sizes); medians are round-robin as on the CPU
(benchmarks/common.py). Peak memory is ``torch.cuda.max_memory_allocated`` above the memory in use
before the call. A last table captures each call once as a CUDA graph (``torch.cuda.CUDAGraph``,
inputs fixed, ``validate_args`` off: the checks read values on the host) and times its replays: what a training loop gets that captures the call (or uses
``torch.cuda.make_graphed_callables``), where the launches, not the kernels, take the time.
Each row also runs our implementation with the Triton kernels off ("ours, torch calls": the
launch-bound path they replace, semiring.language.triton_levels and structures.spanning._certified_triton), and counts the GPU kernels one call
of each of ours launches (torch.profiler). Prints markdown tables; ``--out`` writes them to a file as well.
"""

from __future__ import annotations

import argparse
import gc
import os
import warnings
from typing import Callable, Iterator

import torch
from tqdm import tqdm

from benchmarks import attention, chain, constituency, ctc, nonprojective, pcfg, projective
from benchmarks.common import fmt_bytes, machine_info, markdown_table, seed_all, time_round_robin
from semiring.language import triton_levels
from structures import NonProjectiveDependencyCRF
from structures.spanning import _certified_triton, _tree_partition

Impls = dict[str, Callable[[], object]]


def _synchronized(fn: Callable[[], object]) -> Callable[[], object]:
    def call():
        out = fn()
        torch.cuda.synchronize()
        return out
    return call


def peak_cuda_bytes(fn: Callable[[], object]) -> int:
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak


def rows(quick: bool) -> Iterator[tuple[str, Impls]]:
    """(label, implementations) for each row; inputs are made on the current default device."""
    for C in (8,) if quick else (8, 32):
        yield f"chain marginals B={chain.B} N={chain.N} C={C}", {
            impl: chain.make_chain("marginals", impl, C) for impl in ("ours", "torch-struct", "loop")}
    for task in ("nll",) if quick else ("nll", "decode"):
        yield f"CRF {task} B={chain.B} N={chain.N} C={chain.CRF_C} (lengths vary)", {
            impl: chain.make_crf(task, impl, True) for impl in ("ours (nn.CRF)", "pytorch-crf")}
    for n in (32,) if quick else (64, 128):
        theta = torch.randn(projective.B, n + 1, n + 1)
        yield f"projective marginals B={projective.B} n={n}", {
            "ours": lambda theta=theta: projective.ours(theta), "torch-struct": lambda theta=theta: projective.torch_struct(theta)}
    for n in (32,) if quick else (64, 128):
        theta = torch.randn(nonprojective.B, n + 1, n + 1)
        x = nonprojective.to_ts(theta)
        yield f"non-projective marginals B={nonprojective.B} n={n}", {
            "ours": lambda theta=theta: NonProjectiveDependencyCRF(theta).marginals,
            "ours, device path": lambda theta=theta: _device_path(lambda: NonProjectiveDependencyCRF(theta).marginals),
            "torch-struct": lambda x=x: nonprojective.ts_marginals(x, False)}
    for n in (20,) if quick else (40, 80):
        theta = torch.randn(constituency.B, n, n, constituency.L)
        yield f"constituency marginals B={constituency.B} n={n} L={constituency.L}", {
            "ours": lambda theta=theta: constituency.ours(theta), "torch-struct": lambda theta=theta: constituency.torch_struct(theta)}
    for B, N, NT, T in pcfg.SIZES[1:] if quick else pcfg.SIZES:
        impls = pcfg.implementations("inside", *pcfg.grammar(B, N, NT, T))
        yield f"PCFG inside B={B} N={N} NT={NT} T={T}", {k: impls[k] for k in ("ours", "torch-struct")}
    for B, T, V, S in ctc.SIZES[1:] if quick else ctc.SIZES:
        yield f"CTC loss + gradient B={B} T={T} V={V} S={S}", ctc.implementations(B, T, V, S)
    for label in ("chain B16 N50 C2",) if quick else ("chain B16 N50 C2", "projective B20 n32"):
        shape, ours, peer = attention.ROWS[label]  # (a Hessian-vector product: the passes on pairs)
        scores, v = torch.randn(shape), torch.randn(shape)
        yield f"attention step (a loss on the marginals) {label}", {
            "ours": lambda f=ours, s=scores, v=v: attention.step(f, s, v),
            "torch-struct": lambda f=peer, s=scores, v=v: attention.step(f, s, v)}


def _device_path(fn: Callable[[], object]) -> object:
    """``fn()`` with the non-projective CRF's device path (no host read: rare examples NaN)."""
    saved = _tree_partition.DEVICE_PATH, _tree_partition.RARE_SYNC
    _tree_partition.DEVICE_PATH, _tree_partition.RARE_SYNC = True, False
    try:
        return fn()
    finally:
        _tree_partition.DEVICE_PATH, _tree_partition.RARE_SYNC = saved


def graphed(fn: Callable[[], object]) -> Callable[[], object] | None:
    """``fn`` captured once as a CUDA graph (its inputs are fixed: what it closes over), then each
    call a replay; None where the capture fails (an operation that synchronizes or is not
    capturable)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture stream, as torch.cuda.graphs asks
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            out = fn()
    except Exception:  # noqa: BLE001 - reported as "not capturable"
        torch.cuda.synchronize()
        return None

    def replay():
        graph.replay()
        return out
    return replay


def _torch_calls(fn: Callable[[], object]) -> Callable[[], object]:
    def call():
        with triton_levels.disabled(), _certified_triton.enabled.to(False):
            return fn()
    return call


def launches(fn: Callable[[], object]) -> int:
    """The GPU kernels (and copies) one call of ``fn`` launches."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _same(a, b) -> bool:
    flat = [(x, y) for x, y in zip(*(o if isinstance(o, (tuple, list)) else (o,) for o in (a, b))) if isinstance(x, torch.Tensor)]
    return all(torch.allclose(x.float(), y.float(), atol=1e-4, rtol=1e-4) for x, y in flat)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--repeat", type=int, default=25, help="round-robin rounds")
    p.add_argument("--quick", action="store_true", help="3 rounds, one small size per structure")
    p.add_argument("--out", help="also write the tables to this markdown file")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.gpu: no CUDA device")
    warnings.filterwarnings("ignore")
    seed_all(0)
    repeat = 3 if args.quick else args.repeat
    table, memory, graphs, counts = [], [], [], []
    with torch.device("cuda"):
        for label, calls in tqdm(list(rows(args.quick)), desc="gpu"):
            ours = next(name for name in calls if name.startswith("ours"))
            calls = {ours: calls[ours], "ours, torch calls": _torch_calls(calls[ours])} | {k: v for k, v in calls.items() if k != ours}
            impls = {name: _synchronized(fn) for name, fn in calls.items()}
            for name in ("ours", "ours, torch calls"):
                counts.append([label, name, str(launches(calls[ours if name == "ours" else name]))])
            times = time_round_robin(impls, repeat=repeat, warmup=3, budget_s=60)
            peaks = {name: peak_cuda_bytes(fn) for name, fn in impls.items()}
            for peer in impls:
                if peer != ours:
                    table.append([label, f"{times[ours].ms:.2f}", peer, f"{times[peer].ms:.2f}",
                                  f"**{times[peer].median / times[ours].median:.2f}×**"])
                    memory.append([label, fmt_bytes(peaks[ours]), peer, fmt_bytes(peaks[peer]), f"{peaks[ours] / max(peaks[peer], 1):.2f}"])
            torch.distributions.Distribution.set_default_validate_args(False)  # checks read values: not capturable
            replays = {name: graphed(fn) for name, fn in calls.items()}
            ok = {name: r for name, r in replays.items() if r is not None and _same(r(), impls[name]())}
            replay_times = time_round_robin({k: _synchronized(r) for k, r in ok.items()}, repeat=repeat, warmup=3, budget_s=60) if ok else {}
            torch.distributions.Distribution.set_default_validate_args(True)
            for name in impls:
                got = replay_times.get(name)
                graphs.append([label, name, f"{times[name].ms:.2f}", f"{got.ms:.2f}" if got else "not capturable",
                               f"{times[name].median / got.median:.1f}×" if got else ""])
    info = machine_info() | {"gpu": torch.cuda.get_device_name(), "cuda": str(torch.version.cuda)}
    text = "\n\n".join([
        markdown_table(["", ""], [[k, v] for k, v in info.items()]),
        markdown_table(["benchmark", "ours (ms)", "peer", "peer (ms)", "peer / ours"], table, "lrlrr"),
        markdown_table(["benchmark", "ours peak", "peer", "peer peak", "ours / peer"], memory, "lrlrr"),
        markdown_table(["benchmark", "implementation", "GPU kernels per call"], counts, "llr"),
        markdown_table(["benchmark", "implementation", "eager (ms)", "CUDA graph replay (ms)", "eager / replay"], graphs, "llrrr"),
    ])
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
