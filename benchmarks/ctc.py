"""CTC loss forward + backward: ours (``structures.CTC``, five rules with a lookup by data) against
``torch.nn.functional.ctc_loss`` (a hand-written C++ kernel), in the same process, on the same
log-probabilities, gradients with respect to the logits of a log_softmax; and the same program with
the lookup written in every rule (``logp[t, ext[s]]``, as docs/language.md teaches) instead of
gathered once, which runs in the kernels too.

Run ``python -m benchmarks.ctc`` (``--quick`` for a smoke run). Prints a markdown table of medians
(round-robin, see benchmarks/common.py) and the ratios to ours.
"""

from __future__ import annotations

import math

import torch
from tqdm import tqdm

import semiring
from benchmarks.common import machine_info, markdown_table, side_by_side_options, time_round_robin
from structures import CTC

INLINE = semiring.program("""
    alpha[0, s]  = logp[0, ext[s]]                                 if s < 2
    alpha[t, s] += alpha[t-1, s] * logp[t, ext[s]]
    alpha[t, s] += alpha[t-1, s-1] * logp[t, ext[s]]
    alpha[t, s] += alpha[t-1, s-2] * skip[s] * logp[t, ext[s]]
    goal        += alpha[n-1, 2*m]
    goal        += alpha[n-1, 2*m-1]
""")

SIZES = [(16, 200, 50, 40), (16, 50, 20, 10)]  # B, T, V, target length


def implementations(B: int, T: int, V: int, S: int) -> dict:
    logits = torch.randn(B, T, V, requires_grad=True)
    targets = torch.randint(1, V, (B, S))
    frames, labels = torch.full((B,), T), torch.full((B,), S)

    def ours():
        loss = -CTC(logits.log_softmax(-1), targets).log_partition.sum()
        return torch.autograd.grad(loss, logits)[0]

    ext = torch.zeros(B, 2 * S + 1, dtype=torch.long)  # blanks (0) around the labels
    ext[:, 1::2] = targets
    skip = torch.full(ext.shape, -math.inf)
    skip[:, 2:] = torch.where(ext[:, 2:] != ext[:, :-2], 0.0, -math.inf)

    def inline():
        loss = -INLINE(semiring.Log, logp=logits.log_softmax(-1), ext=ext, skip=skip).sum()  # (every example at T and S)
        return torch.autograd.grad(loss, logits)[0]

    def torch_ctc():
        loss = torch.nn.functional.ctc_loss(logits.log_softmax(-1).transpose(0, 1), targets, frames, labels, reduction="sum")
        return torch.autograd.grad(loss, logits)[0]

    return {"ours": ours, "ours, lookup in every rule": inline, "ctc_loss": torch_ctc}


def main(argv=None) -> None:
    args = side_by_side_options(__doc__, argv, repeat=15, quick="3 rounds, the small size only")
    sizes = SIZES[1:] if args.quick else SIZES
    rows = []
    for B, T, V, S in tqdm(sizes, desc="ctc"):
        impls = implementations(B, T, V, S)
        for name in ("ours, lookup in every rule", "ctc_loss"):
            err = (impls["ours"]() - impls[name]()).abs().max().item()
            assert err < 1e-3, f"{name}'s gradient differs from ours by {err}"
        times = time_round_robin(impls, repeat=3 if args.quick else args.repeat, budget_s=60)
        ours = times["ours"].median
        rows.append([f"loss + gradient B={B} T={T} V={V} S={S}", *(f"{times[k].ms:.1f}" for k in impls),
                     f"**{times['ours, lookup in every rule'].median / ours:.2f}×**", f"**{ours / times['ctc_loss'].median:.2f}×**"])
    print(markdown_table(["", ""], [[k, v] for k, v in machine_info().items()]))
    print()
    print(markdown_table(["benchmark", "ours (ms)", "lookup in every rule (ms)", "ctc_loss (ms)", "lookup in every rule / ours",
                          "ours / ctc_loss"], rows, "lrrrrr"))


if __name__ == "__main__":
    main()
