"""Structured attention's training step: a loss on the marginals, backpropagated (a Hessian-vector
product of the log-partition), ours against torch-struct 0.5 in the same process, on the same scores.

Run ``python -m benchmarks.attention`` (``--quick`` for a smoke run). Each call builds the
distribution on scores that require grad, takes the marginals (which autograd must differentiate
again) and backpropagates ``⟨marginals, v⟩`` to the scores: what a structured attention layer costs
per training step, beside its encoder. Rows:

* segmentation attention's CRF (Kim et al. 2017 §4.1: two states), as ``SegmentationAttention``
  builds it: ``EmissionCRF`` of emissions ``[B, N, 2]`` and learned transitions ``[2, 2]``;
* a linear-chain CRF of edge potentials ``[B, N-1, C, C]``, C = 2 and C = 8;
* a projective dependency CRF as syntactic attention (the transduction experiment's size: B = 20,
  n = 32), ``ProjectiveDependencyCRF [B, n+1, n+1]``;
* the hop chain of memory networks with structure (Kim et al. §4.3: K = 3 hops over 50 facts),
  ``HopChainCRF [B, K, F, F]`` (no peer ships it).

Every peer's gradient is checked against ours before timing. Prints markdown tables of medians
(round-robin, see benchmarks/common.py), the ratios peer / ours and peak tensor bytes. A peer that is
not installed (``pip install -e '.[bench]'``) is skipped, and said so.
"""

from __future__ import annotations

import importlib.util
from typing import Callable

import torch
from tqdm import tqdm

from benchmarks.common import against_peers, print_against_peers, side_by_side_options, time_round_robin
from benchmarks.projective import torch_struct as torch_struct_projective
from structures import EmissionCRF, HopChainCRF, LinearChainCRF, ProjectiveDependencyCRF


def step(marginals: Callable[[torch.Tensor], torch.Tensor], scores: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The gradient of ``⟨marginals(scores), v⟩`` with respect to the scores."""
    x = scores.clone().requires_grad_()
    (grad,) = torch.autograd.grad((marginals(x) * v).sum(), x)
    return grad


def torch_struct_chain(x: torch.Tensor) -> torch.Tensor:
    """torch-struct's chain reads ``[B, N-1, C, C]`` as [to, from]: ours transposed."""
    import torch_struct

    return torch_struct.LinearChainCRF(x.transpose(-1, -2)).marginals.transpose(-1, -2)


def torch_struct_emission(x: torch.Tensor, transitions: torch.Tensor) -> torch.Tensor:
    """Tag marginals ``[B, N, C]`` of emissions and transitions [from, to] by torch-struct's chain
    of edge potentials [to, from], the first emissions folded into the first edge."""
    import torch_struct

    edge = transitions.transpose(0, 1) + x[:, 1:, :, None]
    edge = torch.cat([edge[:, :1] + x[:, :1, None, :], edge[:, 1:]], 1)
    m = torch_struct.LinearChainCRF(edge).marginals
    return torch.cat([m[:, :1].sum(-2), m.sum(-1)], 1)


TRANSITIONS = torch.randn(2, 2, generator=torch.Generator().manual_seed(1)).requires_grad_()  # learned, as the layer's

ROWS = {  # label: (shape, ours, torch-struct's or None)
    "EmissionCRF B16 N50 C2, learned transitions (SegmentationAttention)": (
        (16, 50, 2), lambda x: EmissionCRF(x, TRANSITIONS).marginals, lambda x: torch_struct_emission(x, TRANSITIONS)),
    "chain B16 N50 C2": ((16, 49, 2, 2), lambda x: LinearChainCRF(x).marginals, torch_struct_chain),
    "chain B8 N20 C8": ((8, 19, 8, 8), lambda x: LinearChainCRF(x).marginals, torch_struct_chain),
    "projective B20 n32": ((20, 33, 33), lambda x: ProjectiveDependencyCRF(x).marginals, torch_struct_projective),
    "hop chain B32 K3 F50": ((32, 3, 50, 50), lambda x: HopChainCRF(x).marginals, None),
}
QUICK = ("chain B8 N20 C8", "hop chain B32 K3 F50")


def main(argv=None) -> None:
    args = side_by_side_options(__doc__, argv, repeat=11, quick="3 rounds, two rows")
    has_peer = importlib.util.find_spec("torch_struct") is not None
    if not has_peer:
        print("skipped, not installed (pip install -e '.[bench]'): torch-struct")
    rows, memory = [], []
    for label in tqdm(QUICK if args.quick else ROWS, desc="attention"):
        shape, ours, peer = ROWS[label]
        g = torch.Generator().manual_seed(0)
        scores, v = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
        repeat = 3 if args.quick else args.repeat
        impls = {"ours": lambda: step(ours, scores, v)}
        if peer is None or not has_peer:
            ms = time_round_robin(impls, repeat=repeat)["ours"].ms
            rows.append([f"loss on the marginals, {label}", f"{ms:.1f}", "(no peer)", "", "", ""])
            continue
        impls["torch-struct"] = lambda: step(peer, scores, v)
        err = (impls["torch-struct"]() - impls["ours"]()).abs().max().item()
        assert err < 1e-3, f"torch-struct disagrees with ours by {err}"
        r, m = against_peers(impls, f"loss on the marginals, {label}", label, repeat)
        rows += r
        memory += m
    print_against_peers(rows, memory)


if __name__ == "__main__":
    main()
