"""Linear-chain CRF: ours against torch-struct 0.5, pytorch-crf 0.7.2 and a hand-written loop.

    python -m benchmarks.chain [--repeat 15] [--threads 1] [--quick] [--no-rss] [--only ROWS]

Every implementation runs in this process, on the same inputs, round-robin (see
``benchmarks.common``); before a row is timed its implementations are checked to compute the
same thing. Prints the tables, writes ``benchmarks/results/chain.{md,csv}`` and, with
matplotlib, a bar chart of the ratios to ``docs/benchmarks_chain.png``.

Conventions: ours takes ``log_potentials[b, i, y, c]`` with ``y`` the tag at ``i`` ("from") and
``c`` the tag at ``i+1`` ("to"); torch-struct takes ``[b, i, c, y]`` ("to" first), so it gets
the transpose of the last two dimensions (made contiguous outside the timed region).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

import torch

if __package__ in (None, ""):  # run as a script: python benchmarks/chain.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (
    fmt_bytes, fmt_ms, machine_info, markdown_table, peak_rss_bytes, peak_tensor_bytes, seed_all, setup,
    time_round_robin, write_csv,
)
from structures import LinearChainCRF

B, N = 32, 128
SIZES_C = (8, 32)
CRF_C = 32
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------------------- inputs


def chain_inputs(C: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ours [B, N-1, C(from), C(to)], torch-struct's [B, N-1, C(to), C(from)])``."""
    seed_all(seed)
    lp = torch.randn(B, N - 1, C, C)
    return lp, lp.transpose(-1, -2).contiguous()


def crf_inputs(varied: bool, seed: int = 0):
    """A pytorch-crf ``CRF`` and emissions/tags/lengths/mask for it (lengths ``None`` when full)."""
    from torchcrf import CRF

    seed_all(seed)
    crf = CRF(CRF_C, batch_first=True)
    emissions = torch.randn(B, N, CRF_C, requires_grad=True)
    tags = torch.randint(CRF_C, (B, N))
    if varied:
        lengths = torch.randint(N // 4, N + 1, (B,))
        lengths[0] = N
    else:
        lengths = None
    full = torch.full((B,), N) if lengths is None else lengths
    mask = torch.arange(N) < full[:, None]  # bool: pytorch-crf's default uint8 mask warns on torch >= 2
    return crf, emissions, tags, lengths, mask


# ---------------------------------------------------------------------------- implementations

def _loop_log_partition(x: torch.Tensor) -> torch.Tensor:
    """The textbook forward algorithm: a logsumexp per position over x.unbind(1)."""
    a = x.new_zeros(x.shape[0], x.shape[-1])
    for e in x.unbind(1):
        a = torch.logsumexp(a.unsqueeze(-1) + e, dim=1)
    return torch.logsumexp(a, -1)


def _loop_max(x: torch.Tensor) -> torch.Tensor:
    a = x.new_zeros(x.shape[0], x.shape[-1])
    for e in x.unbind(1):
        a = (a.unsqueeze(-1) + e).max(1).values
    return a.max(-1).values


def loop_marginals(lp: torch.Tensor) -> torch.Tensor:
    x = lp.detach().requires_grad_()
    (g,) = torch.autograd.grad(_loop_log_partition(x).sum(), x)
    return g


def loop_argmax(lp: torch.Tensor) -> torch.Tensor:
    x = lp.detach().requires_grad_()
    (g,) = torch.autograd.grad(_loop_max(x).sum(), x)
    return g


def _torch_struct():
    import warnings

    import torch_struct

    warnings.filterwarnings("ignore", message=".*arg_constraints.*")
    return torch_struct


def make_chain(task: str, impl: str, C: int, seed: int = 0) -> Callable[[], torch.Tensor]:
    """A zero-argument call computing ``task`` (logz | marginals | argmax) with ``impl``
    (ours | torch-struct | loop) on B=32, N=128 and C tags; the result in our convention."""
    lp, lp_t = chain_inputs(C, seed)
    if impl == "ours":
        attr = {"logz": "log_partition", "marginals": "marginals", "argmax": "argmax"}[task]
        return lambda: getattr(LinearChainCRF(lp), attr)
    if impl == "torch-struct":
        ts = _torch_struct()
        if task == "logz":
            return lambda: ts.LinearChainCRF(lp_t).partition
        attr = {"marginals": "marginals", "argmax": "argmax"}[task]
        return lambda: getattr(ts.LinearChainCRF(lp_t), attr).transpose(-1, -2)
    if impl == "loop":
        fn = {"logz": lambda: _loop_log_partition(lp), "marginals": lambda: loop_marginals(lp),
              "argmax": lambda: loop_argmax(lp)}[task]
        return fn
    raise ValueError(impl)


def make_crf(task: str, impl: str, varied: bool, seed: int = 0) -> Callable[[], object]:
    """``task`` nll: ∂(−Σ log p(tags))/∂(emissions, transitions, start, end) (forward + backward);
    decode: the best tags, under ``torch.no_grad()``."""
    crf, em, tags, lengths, mask = crf_inputs(varied, seed)
    params = [em, crf.transitions, crf.start_transitions, crf.end_transitions]

    def ours_dist():
        return LinearChainCRF.from_emissions(em, crf.transitions, crf.start_transitions, crf.end_transitions, lengths)

    if impl == "ours (EmissionCRF)":
        from structures.emission import EmissionCRF

        def emission_dist():
            return EmissionCRF(em, crf.transitions, crf.start_transitions, crf.end_transitions, lengths)

        if task == "nll":
            return lambda: torch.autograd.grad(-emission_dist().log_prob(tags).sum(), params)

        def emission_decode():
            with torch.no_grad():
                return emission_dist().decode()
        return emission_decode
    if impl == "ours (nn.CRF)":  # the layer with pytorch-crf's interface, on the same parameters
        from structures.nn import CRF

        layer = CRF(CRF_C, batch_first=True)
        layer.load_state_dict(crf.state_dict())
        params = [em, layer.transitions, layer.start_transitions, layer.end_transitions]
        if task == "nll":
            return lambda: torch.autograd.grad(-layer(em, tags, mask=mask, reduction="sum"), params)

        def layer_decode():
            with torch.no_grad():
                return layer.decode(em, mask)
        return layer_decode
    if task == "nll" and impl == "ours":
        return lambda: torch.autograd.grad(-ours_dist().log_prob(tags).sum(), params)
    if task == "nll" and impl == "pytorch-crf":
        return lambda: torch.autograd.grad(-crf(em, tags, mask=mask, reduction="sum"), params)
    if task == "decode" and impl == "ours":
        def ours_decode():
            with torch.no_grad():
                return ours_dist().decode()
        return ours_decode
    if task == "decode" and impl == "pytorch-crf":
        def peer_decode():
            with torch.no_grad():
                return crf.decode(em, mask)
        return peer_decode
    raise ValueError((task, impl))


# the cases a subprocess can rebuild by name (benchmarks.common.peak_rss_bytes)
CASES: dict[str, Callable[..., Callable[[], object]]] = {"chain": make_chain, "crf": make_crf}


# ---------------------------------------------------------------------------- agreement checks


def check_chain(C: int) -> None:
    lp, _ = chain_inputs(C)
    ours = LinearChainCRF(lp)
    z_ts = make_chain("logz", "torch-struct", C)()
    z_loop = _loop_log_partition(lp)
    torch.testing.assert_close(ours.log_partition, z_ts.detach(), rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(ours.log_partition, z_loop, rtol=1e-5, atol=1e-3)
    m = ours.marginals
    torch.testing.assert_close(m, make_chain("marginals", "torch-struct", C)().detach(), rtol=0, atol=1e-4)
    torch.testing.assert_close(m, loop_marginals(lp), rtol=0, atol=1e-4)
    # argmax: one-hot parts of a best path (ties aside, the same path; compare the scores)
    best = ours.max
    for name, other in (("torch-struct", make_chain("argmax", "torch-struct", C)().detach()), ("loop", loop_argmax(lp))):
        a = ours.argmax
        assert set(a.unique().tolist()) <= {0.0, 1.0} and set(other.unique().tolist()) <= {0.0, 1.0}, name
        torch.testing.assert_close((a * lp).sum((1, 2, 3)), best, rtol=1e-5, atol=1e-3)
        torch.testing.assert_close((other * lp).sum((1, 2, 3)), best, rtol=1e-5, atol=1e-3)
        assert (a == other).float().mean() > 0.999, f"argmax differs from {name}"


def check_crf(varied: bool, emission: bool = False) -> None:
    crf, em, tags, lengths, mask = crf_inputs(varied)
    if emission:
        from structures.emission import EmissionCRF

        ours = EmissionCRF(em, crf.transitions, crf.start_transitions, crf.end_transitions, lengths)
    else:
        ours = LinearChainCRF.from_emissions(em, crf.transitions, crf.start_transitions, crf.end_transitions, lengths)
    nll_ours = -ours.log_prob(tags)
    nll_peer = -crf(em, tags, mask=mask, reduction="none")
    torch.testing.assert_close(nll_ours, nll_peer, rtol=1e-5, atol=1e-3)
    g_ours = torch.autograd.grad(nll_ours.sum(), [em, crf.transitions, crf.start_transitions, crf.end_transitions])
    g_peer = torch.autograd.grad(nll_peer.sum(), [em, crf.transitions, crf.start_transitions, crf.end_transitions])
    for a, b in zip(g_ours, g_peer):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        dec = ours.decode()
        peer = crf.decode(em, mask)
    full = torch.full((B,), N) if lengths is None else lengths
    padded = torch.zeros(B, N, dtype=torch.long)
    for b, seq in enumerate(peer):
        assert len(seq) == int(full[b])
        padded[b, : len(seq)] = torch.tensor(seq)
    # same best score (a float32 near-tie may pick another path of equal score)
    s_ours = crf._compute_score(em.detach().transpose(0, 1), dec.transpose(0, 1), mask.transpose(0, 1))
    s_peer = crf._compute_score(em.detach().transpose(0, 1), padded.transpose(0, 1), mask.transpose(0, 1))
    torch.testing.assert_close(s_ours, s_peer, rtol=1e-5, atol=1e-3)
    assert (dec == padded).all(1).float().mean() >= 0.9


# ---------------------------------------------------------------------------- the run


def run(repeat: int, threads: int, rss: bool, out_dir: str, plot: str | None, only: str | None = None) -> dict:
    from tqdm import tqdm

    setup(threads)
    info = machine_info()
    jobs = []
    for C in SIZES_C:
        for task in ("logz", "marginals", "argmax"):
            jobs.append(("chain", task, C, False))
    for task in ("nll", "decode"):
        for varied in (False, True):
            jobs.append(("crf", task, CRF_C, varied))
    if only:
        jobs = [j for j in jobs if only in f"{j[0]} {j[1]} C={j[2]}{' varied' if j[3] else ''}"]

    rows = []  # (benchmark, size, peer, ours s, peer s)
    bar = tqdm(jobs, desc="timing", unit="row", file=sys.stderr)
    for kind, task, C, varied in bar:
        bar.set_postfix_str(f"{kind} {task} C={C}{' varied' if varied else ''}")
        if kind == "chain":
            if task == "logz":
                check_chain(C)
            fns = {impl: make_chain(task, impl, C) for impl in ("ours", "torch-struct", "loop")}
            size = f"B={B} N={N} C={C}"
            label = {"logz": "log-partition (forward)", "marginals": "marginals (forward + backward)",
                     "argmax": "argmax (Max forward + backward)"}[task]
        else:
            impls = ["ours", "ours (EmissionCRF)", "ours (nn.CRF)", "pytorch-crf"]
            if task == "nll":
                check_crf(varied)
                check_crf(varied, emission=True)
            fns = {impl: make_crf(task, impl, varied) for impl in impls}
            size = f"B={B} N={N} C={C} " + ("lengths N/4..N" if varied else "full length")
            label = {"nll": "CRF NLL (forward + backward)", "decode": "CRF decode (Viterbi)"}[task]
        t = time_round_robin(fns, repeat=repeat, warmup=2, min_repeat=5, budget_s=25.0)
        for ours in ("EmissionCRF", "nn.CRF"):  # the same peer against our other parameterizations
            if f"ours ({ours})" in t:
                rows.append((label + f" [{ours}]", size, "pytorch-crf", t[f"ours ({ours})"], t["pytorch-crf"]))
        for peer in fns:
            if not peer.startswith("ours"):
                rows.append((label, size, peer, t["ours"], t[peer]))

    mem_rows = []  # (C, impl, tensor bytes, rss bytes)
    mem_jobs = [(C, impl) for C in SIZES_C for impl in ("ours", "torch-struct", "loop")]
    if only and "memory" not in only:
        mem_jobs = []
    for C, impl in tqdm(mem_jobs, desc="memory", unit="case", file=sys.stderr):
        tensor = peak_tensor_bytes(make_chain("marginals", impl, C))
        rss_b = peak_rss_bytes("benchmarks.chain", "chain", {"task": "marginals", "impl": impl, "C": C}, threads) if rss else None
        mem_rows.append((C, impl, tensor, rss_b))
    info["load average after"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())

    report = render(info, rows, mem_rows, repeat)
    print(report)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "chain.md"), "w") as f:
        f.write(report + "\n")
    write_csv(os.path.join(out_dir, "chain.csv"),
              ["benchmark", "size", "peer", "ours_ms", "peer_ms", "ratio_peer_over_ours", "ours_q1_ms", "ours_q3_ms",
               "peer_q1_ms", "peer_q3_ms", "ours_min_ms", "peer_min_ms", "ours_runs", "peer_runs"],
              [(b, s, p, f"{o.ms:.3f}", f"{q.ms:.3f}", f"{q.median / o.median:.3f}", f"{o.q1 * 1e3:.3f}", f"{o.q3 * 1e3:.3f}",
                f"{q.q1 * 1e3:.3f}", f"{q.q3 * 1e3:.3f}", f"{o.min * 1e3:.3f}", f"{q.min * 1e3:.3f}", o.runs, q.runs)
               for b, s, p, o, q in rows])
    write_csv(os.path.join(out_dir, "chain_memory.csv"), ["C", "impl", "peak_tensor_bytes", "peak_rss_bytes"], mem_rows)
    if plot:
        save_plot(rows, plot)
    return {"rows": rows, "memory": mem_rows, "info": info}


def targets(rows, mem_rows) -> list[tuple[str, str, bool]]:
    def ratio(label_start, size_part, peer, variant=None):
        for b, s, p, o, q in rows:
            if b.startswith(label_start) and size_part in s and p == peer and _variant(b) == variant:
                return q.median / o.median
        return float("nan")

    out = []
    r = ratio("marginals", "C=32", "torch-struct")
    out.append(("chain marginals C=32: ≥ 10× faster than torch-struct", f"{r:.1f}×", r >= 10))
    r = ratio("marginals", "C=32", "loop")
    out.append(("chain marginals C=32: no slower than 1.3× the hand-written loop", f"ours = {1 / r:.2f}× the loop", 1 / r <= 1.3))
    for task, lab in (("CRF NLL", "pytorch-crf NLL fwd+bwd"), ("CRF decode", "pytorch-crf decode")):
        for part in ("full length", "lengths"):
            r = ratio(task, part, "pytorch-crf")
            out.append((f"{lab} ({part}): ≥ 2× faster", f"{r:.2f}×", r >= 2))
            for variant in ("EmissionCRF", "nn.CRF"):
                r = ratio(task, part, "pytorch-crf", variant)
                out.append((f"{lab} ({part}): ≥ 2× faster, by {variant}", f"{r:.2f}×", r >= 2))
    mem = {(C, impl): (t, s) for C, impl, t, s in mem_rows}
    if (32, "ours") in mem:
        f = mem[(32, "ours")][0] / mem[(32, "torch-struct")][0]
        out.append(("marginals peak memory C=32 (tensor bytes): < 1/5 of torch-struct", f"{f:.3f} of torch-struct", f < 0.2))
        if mem[(32, "ours")][1] is not None:
            f = mem[(32, "ours")][1] / mem[(32, "torch-struct")][1]
            out.append(("marginals peak memory C=32 (RSS growth): < 1/5 of torch-struct", f"{f:.3f} of torch-struct", f < 0.2))
    return [t for t in out if "nan" not in t[1]]  # rows not run (--only) are left out


def render(info, rows, mem_rows, repeat) -> str:
    parts = ["### Machine", "", markdown_table(["", ""], list(info.items()), "ll"), ""]
    parts += [f"### Times (median of up to {repeat} round-robin runs after 2 warm-ups; ratio > 1: ours is faster;"
              " the ratio of the fastest runs is shown too, being the least disturbed by other load)", ""]
    parts.append(markdown_table(
        ["benchmark", "size", "ours (ms)", "peer", "peer (ms)", "peer / ours", "(of minimums)", "runs"],
        [(b, s, fmt_ms(o.median), p, fmt_ms(q.median), f"**{q.median / o.median:.2f}×**", f"{q.min / o.min:.2f}×",
          f"{o.runs}/{q.runs}") for b, s, p, o, q in rows], "llrlrrrr"))
    parts += ["", f"### Peak memory of marginals (B={B}, N={N}; forward + backward, result included)", ""]
    mem = {(C, impl): (t, s) for C, impl, t, s in mem_rows}
    mrows = []
    for C, impl, t, s in mem_rows:
        o_t, o_s = mem[(C, "ours")]
        mrows.append((f"C={C}", impl, fmt_bytes(t), f"{o_t / t:.3f}" if t else "",
                      fmt_bytes(s), f"{o_s / s:.3f}" if s and o_s is not None else ""))
    parts.append(markdown_table(["size", "impl", "peak tensor bytes", "ours / this", "peak RSS growth", "ours / this"],
                                mrows, "llrrrr"))
    parts += ["", "### Targets", ""]
    parts.append(markdown_table(["target", "measured", "met"],
                                [(t, m, "yes" if ok else "**no**") for t, m, ok in targets(rows, mem_rows)], "lll"))
    return "\n".join(parts)


def _variant(label: str) -> str | None:
    """The parameterization a row's label names in brackets ("... [EmissionCRF]"), if any."""
    return label[label.rindex("[") + 1: -1] if label.endswith("]") else None


def save_plot(rows, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    labels = [f"{b.split(' (')[0]}{f' [{_variant(b)}]' if _variant(b) else ''}\n{s.replace('B=32 N=128 ', '')}\nvs {p}"
              for b, s, p, _, _ in rows]
    ratios = [q.median / o.median for _, _, _, o, q in rows]
    colors = {"torch-struct": "tab:blue", "loop": "tab:gray", "pytorch-crf": "tab:orange"}
    fig, ax = plt.subplots(figsize=(max(8, 0.75 * len(rows)), 5.5))
    ax.bar(range(len(rows)), ratios, color=[colors.get(p, "tab:green") for _, _, p, _, _ in rows],
           hatch=[{"EmissionCRF": "//", "nn.CRF": ".."}.get(_variant(b), "") for b, _, _, _, _ in rows], edgecolor="white")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.set_ylabel("peer time / our time (log scale; > 1: ours faster)")
    for i, r in enumerate(ratios):
        ax.text(i, r, f"{r:.2g}", ha="center", va="bottom", fontsize=7)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=p) for p, c in colors.items()], fontsize=8)
    threads = torch.get_num_threads()
    ax.set_title(f"LinearChainCRF (hatched: EmissionCRF, dotted: nn.CRF) vs peers (B={B}, N={N}; CPU, {threads} thread{'s' * (threads > 1)})")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=15, help="timed rounds per row (slow peers stop after ~25 s, at least 5)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on a small machine shared with other jobs, 2 threads on 2 cores "
                        "make OpenMP wait for a descheduled worker at every op; see docs/benchmarks.md)")
    p.add_argument("--quick", action="store_true", help="3 rounds, no RSS subprocesses (a smoke run)")
    p.add_argument("--no-rss", action="store_true", help="skip the subprocess RSS measurement")
    p.add_argument("--only", help="run the rows whose 'kind task C=..' contains this (e.g. 'chain marginals C=32', 'crf', 'memory')")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--plot", default=os.path.join(ROOT, "docs", "benchmarks_chain.png"), help="'' for none")
    a = p.parse_args(argv)
    run(3 if a.quick else a.repeat, a.threads, not (a.quick or a.no_rss), a.out, a.plot or None, a.only)


if __name__ == "__main__":
    main()
