"""Projective dependency CRF marginals: ours (Eisner declared in the language) against torch-struct
0.5 ``DependencyCRF`` and SuPar's ``DependencyCRF``, in the same process, on the same scores.

Run ``python -m benchmarks.projective`` (``--quick`` for a smoke run). Prints a markdown table of
medians (round-robin, see benchmarks/common.py), the ratios peer / ours, and peak tensor bytes. A
peer that is not installed (``pip install -e '.[bench]'``) is skipped, and said so.
"""

from __future__ import annotations

import importlib.util

import torch
from tqdm import tqdm

from benchmarks.common import against_peers, print_against_peers, side_by_side_options
from structures import ProjectiveDependencyCRF

B = 16


def ours(theta: torch.Tensor) -> torch.Tensor:
    return ProjectiveDependencyCRF(theta).marginals


def torch_struct(theta: torch.Tensor) -> torch.Tensor:
    """torch-struct takes ``[B, N, N]`` with [head, modifier] over words and root scores on the
    diagonal; 0.5 needs a non-leaf that requires grad on current torch."""
    import torch_struct

    x = theta[:, 1:, 1:].clone()
    x.diagonal(dim1=-2, dim2=-1).copy_(theta[:, 0, 1:])
    m = torch_struct.DependencyCRF(x.requires_grad_() * 1, multiroot=True).marginals
    out = theta.new_zeros(theta.shape)
    out[:, 1:, 1:] = m
    out[:, 1:, 1:].diagonal(dim1=-2, dim2=-1).zero_()
    out[:, 0, 1:] = m.diagonal(dim1=-2, dim2=-1)
    return out


def supar(theta: torch.Tensor) -> torch.Tensor:
    """SuPar takes ``[B, N+1, N+1]`` indexed [dependent, head]."""
    from supar.structs import DependencyCRF

    return DependencyCRF(theta.transpose(1, 2).clone().requires_grad_(), multiroot=True).marginals.transpose(1, 2)


PEERS = {"torch-struct": ("torch_struct", torch_struct), "supar": ("supar", supar)}  # name: (module, call)


def main(argv=None) -> None:
    args = side_by_side_options(__doc__, argv, repeat=9, quick="3 rounds, n = 32 and 64")
    sizes = (32, 64) if args.quick else (64, 128)
    repeat = 3 if args.quick else args.repeat
    peers = {name: call for name, (module, call) in PEERS.items() if importlib.util.find_spec(module) is not None}
    if len(peers) < len(PEERS):
        print(f"skipped, not installed (pip install -e '.[bench]'): {', '.join(sorted(set(PEERS) - set(peers)))}")
    rows, memory = [], []
    for n in tqdm(sizes, desc="projective"):
        theta = torch.randn(B, n + 1, n + 1)
        impls = {"ours": lambda: ours(theta), **{name: (lambda call=call: call(theta)) for name, call in peers.items()}}
        reference = impls["ours"]()
        for name in peers:
            got = impls[name]()
            err = (got[:, :, 1:] - reference[:, :, 1:]).abs().max().item()
            assert err < 1e-3, f"{name} disagrees with ours by {err}"
        r, m = against_peers(impls, f"marginals B={B} n={n}", f"n={n}", repeat)
        rows += r
        memory += m
    print_against_peers(rows, memory)

if __name__ == "__main__":
    main()
