"""The compiler's cost model (issue "The compiler, second generation"): first calls at new shapes,
memory over many shapes, a PCFG against its hand-factored program, chain marginals against a
hand-written loop, compile time in the number of rules.

    python -m benchmarks.compile [--repeat 9] [--threads 1] [--timeout 120] [--rows 1,3 | lengths,pcfg] [--quick]

Rows (``--rows`` takes numbers or names):

1. ``lengths``: ProjectiveDependencyCRF marginals at never-seen padded lengths, first call / warm call.
2. ``rss``: resident-set growth over 50 distinct padded lengths (the compile cache included).
3. ``pcfg``: PCFG inside (Log, forward only) as one rule, and hand-factored through ``P[s, t, b, c]``.
4. ``chain``: LinearChainCRF marginals / the hand-written loop of ``benchmarks.chain``.
5. ``rules``: ``semiring.program(text)`` + the first call for a chain of R charts.
6. ``long``: the same for one rule of T pairwise terms (its variables eliminated one at a time).

Every measurement runs in its own subprocess (``python -m benchmarks.compile --job ...``), killed
after ``--timeout`` seconds and printed as "timeout": compile caches start empty, so a first call
is a first call, and memory is measured apart from the other rows. ``--quick`` runs small sizes in
this process (a smoke run of a few seconds). Timings are medians of ``time.perf_counter`` laps,
``gc.collect()`` before each, with one torch thread by default (see ``benchmarks/common.py``).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Callable

import torch

if __package__ in (None, ""):  # run as a script: python benchmarks/compile.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import semiring
from benchmarks.common import (
    _status_kb, fmt_ms, machine_info, markdown_table, peak_tensor_bytes, seed_all, setup, time_round_robin,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = ("lengths", "rss", "pcfg", "chain", "rules", "long")

FULL = {
    "lengths": {"B": 16, "ns": list(range(100, 110)), "big": 256, "warmup_n": 10},
    "rss": {"B": 4, "ns": list(range(20, 70)), "warmup_n": 10},
    "pcfg": {"B": 4, "N": 64, "NT": 8},
    "chain": [{"B": 32, "N": 128, "C": 32}, {"B": 4, "N": 256, "C": 16}],
    "rules": [100, 400, 800, 1600, 3200],
    "long": [400, 1000, 2000, 5000],
}
QUICK = {
    "lengths": {"B": 2, "ns": [20, 21, 22], "big": 40, "warmup_n": 5},
    "rss": {"B": 2, "ns": list(range(10, 15)), "warmup_n": 5},
    "pcfg": {"B": 2, "N": 12, "NT": 4},
    "chain": [{"B": 4, "N": 16, "C": 4}, {"B": 2, "N": 32, "C": 4}],
    "rules": [10, 40],
    "long": [10, 40],
}
CHAIN_TARGETS = (1.1, 1.5)  # ours / loop, per entry of "chain"

PCFG = """
    X[s, s, a]  = term[s, a]
    X[s, t, a] += X[s, u, b] * X[u+1, t, c] * rule[a, b, c]    for u in s..t-1
    goal        = X[0, n-1, 0]
"""
PCFG_FACTORED = """
    X[s, s, a]     = term[s, a]
    P[s, t, b, c] += X[s, u, b] * X[u+1, t, c]    for u in s..t-1
    X[s, t, a]    += P[s, t, b, c] * rule[a, b, c]
    goal           = X[0, n-1, 0]
"""
PCFGS = {"one rule": PCFG, "hand-factored": PCFG_FACTORED}


def chain_of_charts(R: int) -> str:
    """``x0[i] = a[i]``, ``x{k}[i] += x{k-1}[i] * a[i]`` for k < R, ``goal += x{R-1}[n-1]``."""
    lines = ["x0[i] = a[i]"] + [f"x{k}[i] += x{k - 1}[i] * a[i]" for k in range(1, R)] + [f"goal += x{R - 1}[n-1]"]
    return "\n".join(lines)


def long_rule(T: int) -> str:
    """``goal += a[x0, x1] * a[x1, x2] * ... * a[x{T-1}, xT]``: one rule summing T+1 variables."""
    return "goal += " + " * ".join(f"a[x{k}, x{k + 1}]" for k in range(T))


# ---------------------------------------------------------------------------- measurements


def _lap(fn: Callable[[], object]) -> float:
    gc.collect()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _warm_up_process() -> None:
    """One call of a tiny unrelated program: the process's one-time costs (lazy imports, first
    kernels, the allocator's first pages) are not the compiler's."""
    semiring.program(chain_of_charts(2))(a=torch.zeros(1, 4))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark (VmHWM) to the current resident set."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _projective_marginals(theta: torch.Tensor) -> torch.Tensor:
    from structures import ProjectiveDependencyCRF

    return ProjectiveDependencyCRF(theta).marginals  # a fresh object: marginals are cached per object


def job_lengths(B: int, ns: list[int], big: int, warmup_n: int, repeat: int) -> dict:
    # a warm-up at a length measured nowhere: the process's one-time costs are not the compiler's
    _projective_marginals(torch.randn(B, warmup_n + 1, warmup_n + 1))
    out = []
    for n in [*ns, big]:
        theta = torch.randn(B, n + 1, n + 1)
        first = _lap(lambda: _projective_marginals(theta))
        warm = [_lap(lambda: _projective_marginals(theta)) for _ in range(min(repeat, 5) if n == big else repeat)]
        out.append({"n": n, "first": first, "warm": statistics.median(warm)})
    return {"per_n": out}


def job_rss(B: int, ns: list[int], warmup_n: int) -> dict:
    _projective_marginals(torch.randn(B, warmup_n + 1, warmup_n + 1))
    gc.collect()
    before = _rss_bytes()
    for n in ns:
        _projective_marginals(torch.randn(B, n + 1, n + 1))
    gc.collect()
    return {"before": before, "after": _rss_bytes()}


def job_pcfg(which: str, B: int, N: int, NT: int, repeat: int) -> dict:
    _warm_up_process()
    term, rule = torch.randn(B, N, NT), torch.randn(1, NT, NT, NT)
    text = PCFGS[which]
    # Peak memory of the first call (compile + forward): the kernel's high-water mark of the
    # resident set, reset just before it, minus the resident set then. It sees everything (torch's
    # tensors, the compiler's Python objects, malloc'ed buffers); tracemalloc would miss torch's
    # allocations. The warm forward's peak is measured in torch tensor bytes (profiler events):
    # its RSS would hide behind the pages the first call left in the heap.
    gc.collect()
    rss0 = _status_kb("VmRSS")
    has_peak = _reset_peak_rss()
    with torch.no_grad():
        t0 = time.perf_counter()
        prog = semiring.program(text)
        t1 = time.perf_counter()
        logz = prog(semiring.Log, term=term, rule=rule)
        t2 = time.perf_counter()
    peak = (_status_kb("VmHWM") - rss0) * 1024 if has_peak else None

    def forward():
        with torch.no_grad():
            return prog(semiring.Log, term=term, rule=rule)

    warm = [_lap(forward) for _ in range(repeat)]
    return {"program": t1 - t0, "first_call": t2 - t1, "warm": statistics.median(warm), "peak_rss_first": peak,
            "peak_tensor_warm": peak_tensor_bytes(forward), "logz": logz.tolist()}


def job_pcfg_warm(B: int, N: int, NT: int, repeat: int) -> dict:
    """The warm forwards of both programs, round-robin in one process (the ratio's measurement)."""
    term, rule = torch.randn(B, N, NT), torch.randn(1, NT, NT, NT)
    progs = {which: semiring.program(text) for which, text in PCFGS.items()}

    def forward(prog):
        with torch.no_grad():
            return prog(semiring.Log, term=term, rule=rule)

    t = time_round_robin({which: functools.partial(forward, p) for which, p in progs.items()}, repeat=repeat, warmup=2)
    return {which: x.median for which, x in t.items()}


def job_chain(B: int, N: int, C: int, repeat: int) -> dict:
    from benchmarks.chain import loop_marginals
    from structures import LinearChainCRF

    lp = torch.randn(B, N - 1, C, C)
    torch.testing.assert_close(LinearChainCRF(lp).marginals, loop_marginals(lp), rtol=0, atol=1e-4)
    t = time_round_robin({"ours": lambda: LinearChainCRF(lp).marginals, "loop": lambda: loop_marginals(lp)},
                         repeat=repeat, warmup=2, min_repeat=5, budget_s=25.0)
    return {name: {"median": x.median, "min": x.min, "runs": x.runs} for name, x in t.items()}


def _compile_and_call(text: str, a: torch.Tensor) -> dict:
    """Seconds of ``semiring.program(text)`` and of its first call on input ``a``."""
    _warm_up_process()
    t0 = time.perf_counter()
    prog = semiring.program(text)
    t1 = time.perf_counter()
    prog(a=a)
    t2 = time.perf_counter()
    return {"program": t1 - t0, "first_call": t2 - t1}


def job_rules(R: int) -> dict:
    return _compile_and_call(chain_of_charts(R), torch.zeros(1, 8))


def job_long(T: int) -> dict:
    return _compile_and_call(long_rule(T), torch.zeros(1, 2, 2))


JOBS: dict[str, Callable[..., dict]] = {"lengths": job_lengths, "rss": job_rss, "pcfg": job_pcfg,
                                        "pcfg_warm": job_pcfg_warm, "chain": job_chain,
                                        "rules": job_rules, "long": job_long}


def run_job(name: str, kwargs: dict, *, threads: int, seed: int, timeout: float, in_process: bool) -> dict:
    """``JOBS[name](**kwargs)`` in a fresh subprocess (or here); ``{"timeout": s}`` or ``{"error": ...}`` on failure."""
    if in_process:
        seed_all(seed)
        return JOBS[name](**kwargs)
    arg = json.dumps({"job": name, "kwargs": kwargs, "threads": threads, "seed": seed})
    try:
        res = subprocess.run([sys.executable, "-m", "benchmarks.compile", "--job", arg], cwd=ROOT,
                             capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"timeout": timeout}
    if res.returncode != 0:
        lines = res.stderr.strip().splitlines() or [f"exit status {res.returncode}"]
        return {"error": lines[-1][:200]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def _child(arg: str) -> None:
    spec = json.loads(arg)
    setup(spec["threads"], spec["seed"])
    print(json.dumps(JOBS[spec["job"]](**spec["kwargs"])))


# ---------------------------------------------------------------------------- rows


def failed(result: dict) -> str | None:
    if "timeout" in result:
        return f"timeout (> {result['timeout']:g} s)"
    if "error" in result:
        return f"error: {result['error']}"
    return result.get("skipped")


def mb(nbytes: float | None) -> str:
    return "n/a" if nbytes is None else f"{nbytes / 1e6:.1f}"


def row_lengths(sizes: dict, repeat: int, run: Callable) -> tuple[str, list]:
    res = run("lengths", {**sizes, "repeat": repeat})
    title = (f"### 1. New padded lengths: ProjectiveDependencyCRF marginals, B={sizes['B']} (first call at a "
             f"never-seen length vs the median of warm calls at it)")
    if failed(res):
        return f"{title}\n\n{failed(res)}", [("first / warm at new lengths", failed(res), False)]
    rows, ratios = [], []
    for r in res["per_n"]:
        ratio = r["first"] / r["warm"]
        if r["n"] != sizes["big"]:
            ratios.append(ratio)
        rows.append((f"n={r['n']}", fmt_ms(r["first"]), fmt_ms(r["warm"]), f"{ratio:.2f}×"))
    med = statistics.median(ratios)
    ns = sizes["ns"]
    rows.insert(len(ns), (f"**median, n={ns[0]}..{ns[-1]}**", "", "", f"**{med:.2f}×**"))
    big = res["per_n"][-1]["first"] / res["per_n"][-1]["warm"]
    table = markdown_table(["length", "first call (ms)", "warm (ms)", "first / warm"], rows)
    targets = [(f"first / warm at new lengths n={ns[0]}..{ns[-1]} (median) ≤ 1.5×", f"{med:.2f}×", med <= 1.5),
               (f"first / warm at n={sizes['big']} ≤ 2×", f"{big:.2f}×", big <= 2)]
    return f"{title}\n\n{table}", targets


def row_rss(sizes: dict, repeat: int, run: Callable) -> tuple[str, list]:
    ns = sizes["ns"]
    res = run("rss", sizes)
    title = (f"### 2. Resident set over {len(ns)} distinct padded lengths: ProjectiveDependencyCRF marginals, "
             f"B={sizes['B']}, n={ns[0]}..{ns[-1]} after a warm-up at n={sizes['warmup_n']} (MB = 10⁶ bytes)")
    if failed(res):
        return f"{title}\n\n{failed(res)}", [("RSS growth", failed(res), False)]
    growth = res["after"] - res["before"]
    table = markdown_table(["RSS after warm-up (MB)", "RSS after the lengths (MB)", "growth (MB)", "per length (MB)"],
                           [(mb(res["before"]), mb(res["after"]), f"**{mb(growth)}**", f"{growth / len(ns) / 1e6:.2f}")],
                           "rrrr")
    return f"{title}\n\n{table}", [(f"RSS growth over {len(ns)} lengths ≤ 50 MB", f"{mb(growth)} MB", growth <= 50e6)]


def row_pcfg(sizes: dict, repeat: int, run: Callable) -> tuple[str, list]:
    res = {which: run("pcfg", {"which": which, **sizes, "repeat": repeat}) for which in PCFGS}
    title = (f"### 3. PCFG inside (Log, forward only), NT={sizes['NT']}, N={sizes['N']}, B={sizes['B']}: one rule vs "
             "hand-factored through P[s, t, b, c]")
    rows = []
    for which, r in res.items():
        if failed(r):
            rows.append((which, failed(r), "", "", "", "", ""))
            continue
        rows.append((which, fmt_ms(r["program"]), fmt_ms(r["first_call"]), f"**{r['program'] + r['first_call']:.3f}**",
                     fmt_ms(r["warm"]), mb(r["peak_rss_first"]), mb(r["peak_tensor_warm"])))
    table = markdown_table(["program", "program() (ms)", "first call (ms)", "program() + first call (s)",
                            "warm forward, own process (ms)", "peak RSS growth, first call (MB)",
                            "peak tensor bytes, warm forward (MB)"],
                           rows)
    ours, peer = res["one rule"], res["hand-factored"]
    if failed(ours):
        return f"{title}\n\n{table}", [("PCFG one rule", failed(ours), False)]
    first = ours["program"] + ours["first_call"]
    targets = [("PCFG one rule: program() + first call ≤ 0.3 s", f"{first:.3f} s", first <= 0.3)]
    notes = ""
    if failed(peer):
        targets.append(("PCFG: forward vs hand-factored", f"hand-factored: {failed(peer)}", False))
        return f"{title}\n\n{table}", targets
    a, b = torch.tensor(ours["logz"], dtype=torch.float64), torch.tensor(peer["logz"], dtype=torch.float64)
    rel = float(((a - b).abs() / b.abs()).max())
    targets.append(("PCFG: both programs give the same log Z (1e-4 relative)", f"{rel:.1e}", rel <= 1e-4))
    notes = f"\n\nlog Z of the two programs: largest relative difference {rel:.1e}."
    # the ratio from round-robin laps in one process (background load hits both alike), run once
    # both programs are known to finish
    both = run("pcfg_warm", {**sizes, "repeat": repeat})
    if failed(both):
        notes += f" Warm forwards round-robin: {failed(both)}."
        targets.append(("PCFG one rule: forward no slower than hand-factored", failed(both), False))
    else:
        ratio = both["one rule"] / both["hand-factored"]
        notes += (f" Warm forwards round-robin in one process: one rule {fmt_ms(both['one rule'])} ms, hand-factored "
                  f"{fmt_ms(both['hand-factored'])} ms, one rule / hand-factored **{ratio:.2f}×**.")
        targets.append(("PCFG one rule: forward no slower than hand-factored", f"{ratio:.2f}×", ratio <= 1.0))
    return f"{title}\n\n{table}{notes}", targets


def row_chain(sizes: list, repeat: int, run: Callable) -> tuple[str, list]:
    title = ("### 4. LinearChainCRF marginals (forward + backward) vs the hand-written loop of benchmarks/chain.py "
             "(round-robin medians)")
    rows, targets = [], []
    for s, target in zip(sizes, CHAIN_TARGETS):
        size = f"B={s['B']} N={s['N']} C={s['C']}"
        r = run("chain", {**s, "repeat": repeat})
        if failed(r):
            rows.append((size, failed(r), "", "", "", ""))
            targets.append((f"chain marginals {size}: ours / loop ≤ {target}×", failed(r), False))
            continue
        o, lp = r["ours"], r["loop"]
        ratio = o["median"] / lp["median"]
        rows.append((size, fmt_ms(o["median"]), fmt_ms(lp["median"]), f"**{ratio:.2f}×**", f"{o['min'] / lp['min']:.2f}×",
                     f"{o['runs']}/{lp['runs']}"))
        targets.append((f"chain marginals {size}: ours / loop ≤ {target}×", f"{ratio:.2f}×", ratio <= target))
    table = markdown_table(["size", "ours (ms)", "loop (ms)", "ours / loop", "(of minimums)", "runs"], rows)
    return f"{title}\n\n{table}", targets


def row_rules(sizes: list, repeat: int, run: Callable) -> tuple[str, list]:
    title = ("### 5. Compile time in the number of rules: `semiring.program(text)` + the first call on "
             "a = zeros(1, 8), for the chain of charts x0..x{R-1}")
    rows, done, stopped = [], [], None
    for R in sizes:
        # the program for R contains the one for any smaller R: past a timeout, a larger R would time out too
        r = {"skipped": f"not run (R={stopped} did not finish)"} if stopped else run("rules", {"R": R})
        if failed(r):
            stopped = stopped or R
            rows.append((R, failed(r), "", "", "", ""))
            continue
        total = r["program"] + r["first_call"]
        slope = f"{math.log(total / done[-1][1]) / math.log(R / done[-1][0]):.2f}" if done else ""
        done.append((R, total))
        rows.append((R, f"{r['program']:.3f}", f"{r['first_call']:.3f}", f"**{total:.3f}**", f"{total / R * 1e3:.2f}", slope))
    table = markdown_table(["rules R", "program() (s)", "first call (s)", "total (s)", "per rule (ms)",
                            "log-log slope vs previous R"], rows)
    top = sizes[-1]
    top_done = [t for R, t in done if R == top]
    targets = [(f"{top} rules: program() + first call ≤ 2 s", f"{top_done[0]:.2f} s" if top_done else rows[-1][1],
                bool(top_done) and top_done[0] <= 2)]
    if len(done) >= 2:  # least-squares slope of log time against log R: 1 for linear
        xs, ys = [math.log(R) for R, _ in done], [math.log(t) for _, t in done]
        mx, my = statistics.mean(xs), statistics.mean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        targets.append((f"time linear in R (log-log slope over R={done[0][0]}..{done[-1][0]} ≤ 1.2)", f"{slope:.2f}",
                        slope <= 1.2))
    return f"{title}\n\n{table}", targets


def row_long(sizes: list, repeat: int, run: Callable) -> tuple[str, list]:
    title = ("### 6. Compile time in the length of a rule: `semiring.program(text)` and the first call on "
             "a = zeros(1, 2, 2), for the one rule goal += a[x0, x1] * ... * a[x{T-1}, xT]")
    rows, done = [], []
    for T in sizes:
        r = run("long", {"T": T})
        if failed(r):
            rows.append((T, failed(r), "", "", ""))
            continue
        slope = f"{math.log(r['program'] / done[-1][1]) / math.log(T / done[-1][0]):.2f}" if done else ""
        done.append((T, r["program"]))
        rows.append((T, f"**{r['program']:.3f}**", f"{r['first_call']:.3f}", f"{r['program'] / T * 1e3:.2f}", slope))
    table = markdown_table(["terms T", "program() (s)", "first call (s)", "program() per term (ms)",
                            "log-log slope of program() vs previous T"], rows)
    if len(done) < 2:
        return f"{title}\n\n{table}", [("program() linear in a rule's terms", rows[-1][1], False)]
    slope = math.log(done[-1][1] / done[0][1]) / math.log(done[-1][0] / done[0][0])
    return f"{title}\n\n{table}", [(f"program() linear in a rule's terms (log-log slope over T={done[0][0]}..{done[-1][0]} "
                                     "≤ 1.2)", f"{slope:.2f}", slope <= 1.2)]


ROW_FNS = {"lengths": row_lengths, "rss": row_rss, "pcfg": row_pcfg, "chain": row_chain, "rules": row_rules,
           "long": row_long}


def parse_rows(text: str | None) -> list[str]:
    if not text:
        return list(ROWS)
    chosen = set()
    for part in text.split(","):
        part = part.strip()
        name = ROWS[int(part) - 1] if part.isdigit() and 1 <= int(part) <= len(ROWS) else part
        if name not in ROWS:
            raise SystemExit(f"--rows: unknown row {part!r}; rows are 1..{len(ROWS)} or {', '.join(ROWS)}")
        chosen.add(name)
    return [r for r in ROWS if r in chosen]  # in order: row 1's first calls come before any other use


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=9, help="warm calls per median (5 at most at n=256)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per subprocess before it is killed (printed as timeout)")
    p.add_argument("--rows", help="comma-separated rows, by number or name (" + ", ".join(ROWS) + "); default all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="small sizes, 3 rounds, in this process: a smoke run")
    p.add_argument("--job", help=argparse.SUPPRESS)  # internal: one measurement in a subprocess
    a = p.parse_args(argv)
    if a.job:
        _child(a.job)
        return
    start = time.perf_counter()
    setup(a.threads, a.seed)
    sizes = QUICK if a.quick else FULL
    repeat = 3 if a.quick else a.repeat

    def run(name: str, kwargs: dict) -> dict:
        return run_job(name, kwargs, threads=a.threads, seed=a.seed, timeout=a.timeout, in_process=a.quick)

    info = {k: v for k, v in machine_info().items() if k not in ("torch-struct", "pytorch-crf")}
    parts, targets = [], []
    for name in parse_rows(a.rows):
        text, ts = ROW_FNS[name](sizes[name], repeat, run)
        print(text + "\n", file=sys.stderr, flush=True)  # progress; the report goes to stdout at the end
        parts.append(text)
        targets += ts
    info["load average after"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    info["wall time"] = f"{time.perf_counter() - start:.0f} s"
    if a.quick:
        info["wall time"] += " (--quick: small sizes, in this process; the targets are for the full sizes)"
    report = ["### Machine", "", markdown_table(["", ""], list(info.items()), "ll"), ""]
    for text in parts:
        report += [text, ""]
    report += ["### Targets", "", markdown_table(["target", "measured", "met"],
                                                 [(t, m, "yes" if ok else "**no**") for t, m, ok in targets], "lll")]
    print("\n".join(report))


if __name__ == "__main__":
    main()
