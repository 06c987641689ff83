"""CTC loss forward + backward: ours (``structures.CTC``, five rules with a lookup by data) against
``torch.nn.functional.ctc_loss`` (a hand-written C++ kernel), in the same process, on the same
log-probabilities, gradients with respect to the logits of a log_softmax.

Run ``python -m benchmarks.ctc`` (``--quick`` for a smoke run). Prints a markdown table of medians
(round-robin, see benchmarks/common.py) and the ratio ours / ctc_loss.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from benchmarks.common import machine_info, markdown_table, side_by_side_options, time_round_robin
from structures import CTC

SIZES = [(16, 200, 50, 40), (16, 50, 20, 10)]  # B, T, V, target length


def implementations(B: int, T: int, V: int, S: int) -> dict:
    logits = torch.randn(B, T, V, requires_grad=True)
    targets = torch.randint(1, V, (B, S))
    frames, labels = torch.full((B,), T), torch.full((B,), S)

    def ours():
        loss = -CTC(logits.log_softmax(-1), targets).log_partition.sum()
        return torch.autograd.grad(loss, logits)[0]

    def torch_ctc():
        loss = torch.nn.functional.ctc_loss(logits.log_softmax(-1).transpose(0, 1), targets, frames, labels, reduction="sum")
        return torch.autograd.grad(loss, logits)[0]

    return {"ours": ours, "ctc_loss": torch_ctc}


def main(argv=None) -> None:
    args = side_by_side_options(__doc__, argv, repeat=15, quick="3 rounds, the small size only")
    sizes = SIZES[1:] if args.quick else SIZES
    rows = []
    for B, T, V, S in tqdm(sizes, desc="ctc"):
        impls = implementations(B, T, V, S)
        err = (impls["ours"]() - impls["ctc_loss"]()).abs().max().item()
        assert err < 1e-3, f"ctc_loss's gradient differs from ours by {err}"
        times = time_round_robin(impls, repeat=3 if args.quick else args.repeat, budget_s=60)
        rows.append([f"loss + gradient B={B} T={T} V={V} S={S}", f"{times['ours'].ms:.1f}", f"{times['ctc_loss'].ms:.1f}",
                     f"**{times['ours'].median / times['ctc_loss'].median:.2f}×**"])
    print(markdown_table(["", ""], [[k, v] for k, v in machine_info().items()]))
    print()
    print(markdown_table(["benchmark", "ours (ms)", "ctc_loss (ms)", "ours / ctc_loss"], rows, "lrrr"))


if __name__ == "__main__":
    main()
