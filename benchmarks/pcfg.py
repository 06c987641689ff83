"""PCFG inside (log-partition) and marginals: ours (``structures.PCFG``, three rules and a split
chart in the language) against torch-struct 0.5 ``SentCFG``, in the same process, on the same
grammar; and ``TDPCFG`` (rank R) beside them for scale.

Run ``python -m benchmarks.pcfg`` (``--quick`` for a smoke run). Prints a markdown table of medians
(round-robin, see benchmarks/common.py) and the ratios peer / ours.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from benchmarks.common import machine_info, markdown_table, side_by_side_options, time_round_robin
from structures import PCFG, TDPCFG

SIZES = [(8, 30, 30, 60), (8, 20, 16, 32)]  # B, N, NT, T
RANK = 64


def grammar(B: int, N: int, NT: int, T: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Normalized log-probabilities: tags per word, rules per parent, roots."""
    terms = torch.randn(B, N, T).log_softmax(-1)
    rules = torch.randn(B, NT, (NT + T) ** 2).log_softmax(-1).reshape(B, NT, NT + T, NT + T)
    roots = torch.randn(B, NT).log_softmax(-1)
    return terms, rules, roots


def implementations(task: str, terms, rules, roots) -> dict:
    import torch_struct

    B, _, T = terms.shape
    NT = rules.shape[1]
    U, V, W = (torch.randn(B, k, RANK) for k in (NT, NT + T, NT + T))

    def leaf(x):  # torch-struct 0.5 needs non-leaf inputs that require grad on current torch
        return x.detach().requires_grad_() * 1

    def ours():
        d = PCFG(terms, leaf(rules), roots)
        return d.log_partition if task == "inside" else d.marginals

    def td():
        d = TDPCFG(terms, leaf(U), V, W, roots)
        return d.log_partition if task == "inside" else d.marginals

    def theirs():
        d = torch_struct.SentCFG((leaf(terms), leaf(rules), leaf(roots)))
        return d.partition if task == "inside" else d.marginals

    return {"ours": ours, "torch-struct": theirs, f"ours TDPCFG R={RANK}": td}


def main(argv=None) -> None:
    args = side_by_side_options(__doc__, argv, repeat=9, quick="3 rounds, the small size only")
    sizes = SIZES[1:] if args.quick else SIZES
    repeat = 3 if args.quick else args.repeat
    rows = []
    for (B, N, NT, T), task in tqdm([(s, t) for s in sizes for t in ("inside", "marginals")], desc="pcfg"):
        terms, rules, roots = grammar(B, N, NT, T)
        impls = implementations(task, terms, rules, roots)
        if task == "inside":
            err = (impls["ours"]() - impls["torch-struct"]()).abs().max().item()
            assert err < 1e-3, f"torch-struct's log-partition differs from ours by {err}"
        times = time_round_robin(impls, repeat=repeat, budget_s=90)
        size = f"B={B} N={N} NT={NT} T={T}"
        for name in impls:
            if name != "ours":
                rows.append([f"{task} {size}", f"{times['ours'].ms:.1f}", name, f"{times[name].ms:.1f}",
                             f"**{times[name].median / times['ours'].median:.2f}×**"])
    print(markdown_table(["", ""], [[k, v] for k, v in machine_info().items()]))
    print()
    print(markdown_table(["benchmark", "ours (ms)", "other", "other (ms)", "other / ours"], rows, "lllrr"))


if __name__ == "__main__":
    main()
