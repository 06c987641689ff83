"""Constituency tree CRF marginals: ours (CKY declared in the language) against torch-struct 0.5
``TreeCRF`` and SuPar's ``ConstituencyCRF``, in the same process, on the same scores.

Run ``python -m benchmarks.constituency`` (``--quick`` for a smoke run). Prints a markdown table of
medians (round-robin, see benchmarks/common.py), the ratios peer / ours, and peak tensor bytes.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from benchmarks.common import against_peers, print_against_peers, side_by_side_options
from structures import ConstituencyCRF

B, L = 16, 8


def ours(theta: torch.Tensor) -> torch.Tensor:
    return ConstituencyCRF(theta).marginals


def torch_struct(theta: torch.Tensor) -> torch.Tensor:
    """torch-struct takes the same ``[B, N, N, NT]`` (span i..j inclusive, label last); 0.5 needs a
    non-leaf that requires grad on current torch."""
    import torch_struct

    return torch_struct.TreeCRF(theta.detach().requires_grad_() * 1).marginals


def supar(theta: torch.Tensor) -> torch.Tensor:
    """SuPar scores unlabelled spans on fenceposts ``[B, N+1, N+1]``: it gets the labels summed out
    (inside the timed region, as ours sums them) and gives span marginals ``[B, N+1, N+1]``."""
    from supar.structs import ConstituencyCRF as SuparCRF

    n = theta.shape[1]
    fence = theta.new_zeros(theta.shape[0], n + 1, n + 1)
    fence[:, :-1, 1:] = theta.logsumexp(-1)
    return SuparCRF(fence.requires_grad_()).marginals


def main(argv=None) -> None:
    args = side_by_side_options(__doc__, argv, repeat=15, quick="3 rounds, n = 20 and 40")
    sizes = (20, 40) if args.quick else (20, 40, 80)
    repeat = 3 if args.quick else args.repeat
    rows, memory = [], []
    for n in tqdm(sizes, desc="constituency"):
        theta = torch.randn(B, n, n, L)
        impls = {"ours": lambda: ours(theta), "torch-struct": lambda: torch_struct(theta),
                 "supar": lambda: supar(theta)}
        reference = impls["ours"]()
        err = (impls["torch-struct"]() - reference).abs().max().item()
        assert err < 1e-3, f"torch-struct disagrees with ours by {err}"
        err = (impls["supar"]()[:, :-1, 1:].triu() - reference.sum(-1)).abs().max().item()
        assert err < 1e-3, f"supar disagrees with ours by {err}"
        r, m = against_peers(impls, f"marginals B={B} n={n} L={L}", f"n={n}", repeat)
        rows += r
        memory += m
    print_against_peers(rows, memory)

if __name__ == "__main__":
    main()
