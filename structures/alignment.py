"""Monotone alignments of two sequences of their own lengths (n and m), declared in the language."""

from __future__ import annotations

import torch
from torch import Tensor

import semiring

from .distribution import StructuredDistribution
from .validation import Lengths

# A path through the table from (0, 0) to (n-1, m-1); every cell it visits adds its score.
_ONE_TO_MANY = """
    A[0, 0]  = score[0, 0]
    A[i, j] += A[i, j-1] * score[i, j]       # j advances: i is aligned to one more j
    A[i, j] += A[i-1, j-1] * score[i, j]     # both advance
"""
_MANY_TO_MANY = _ONE_TO_MANY + """
    A[i, j] += A[i-1, j] * score[i, j]       # i advances: j is aligned to one more i
"""
_GOAL = """
    goal     = A[n-1, m-1]
"""
_PROGRAMS = {
    "one_to_many": semiring.program(_ONE_TO_MANY + _GOAL),
    "many_to_many": semiring.program(_MANY_TO_MANY + _GOAL),
}


class AlignmentCRF(StructuredDistribution):
    """A distribution over monotone alignments of a sequence of ``n`` items with one of ``m``.

    ``log_potentials[b, i, j]`` (shape ``[B, N, M]``) scores aligning item ``i`` of the first
    sequence with item ``j`` of the second. An alignment is a path of cells from ``(0, 0)`` to
    ``(n-1, m-1)`` that advances by one step at a time, and its score is the sum of the cells it
    visits (the cells are its parts: marginals and one-hot alignments are ``[B, N, M]``, 0 outside
    ``n × m``). The steps (as SynJax's ``AlignmentCRF``):

    - ``"many_to_many"`` (default): ``(i, j+1)``, ``(i+1, j+1)`` or ``(i+1, j)``; paths of
      ``max(n, m)`` to ``n + m - 1`` cells, ``Delannoy(n-1, m-1)`` of them.
    - ``"one_to_many"``: ``(i, j+1)`` or ``(i+1, j+1)``: every ``j`` is aligned to exactly one ``i``
      and every ``i`` to a run of one or more ``j``; ``C(m-1, n-1)`` paths, none when ``n > m``
      (``log Z = -inf``); with a single column (``M = 1``) ``n`` must be 1.

    ``lengths`` is ``{"n": [B] in 1..N, "m": [B] in 1..M}`` or the tuple ``(n, m)`` (each default:
    the largest). ``mask`` may replace it: ``{"n": [B, N], "m": [B, M]}`` or ``(mask_n, mask_m)``,
    bool, True at the items of each sequence that exist (a prefix of each row); a mask left out is
    full. ``decode()`` gives the cells of the best path in order, ``[B, N+M-1, 2]``.
    """

    shape = "B, N, M"

    def __init__(self, log_potentials: Tensor, lengths: Lengths = None, kind: str = "many_to_many", *,
                 mask: Lengths = None):
        if kind not in _PROGRAMS:
            raise ValueError(f"kind: expected one of {sorted(_PROGRAMS)}, got {kind!r}")
        self.kind = kind
        self.program = _PROGRAMS[kind]  # (an attribute, not a property: the constructor and a query read it 7 times)
        super().__init__(log_potentials, lengths, mask=mask)

    def decode(self) -> Tensor:
        """``[B, N+M-1, 2]`` long: the cells ``(i, j)`` of the best path in order, then rows of -1."""
        return self.path(self.argmax)

    def path(self, parts: Tensor) -> Tensor:
        """The cells ``[..., B, N+M-1, 2]`` (in order, -1 past the end) of alignments given as
        one-hot parts ``[..., B, N, M]``: a monotone path visits its cells in row-major order."""
        N, M = parts.shape[-2:]
        flat = parts.reshape(-1, N * M) > 0
        order = torch.sort((~flat).to(torch.int8), dim=-1, stable=True).indices[:, : N + M - 1]  # visited cells first
        cells = torch.stack([order // M, order % M], -1)
        visited = flat.gather(-1, order).unsqueeze(-1)
        return cells.where(visited, -1).reshape(*parts.shape[:-2], N + M - 1, 2)

    def to_parts(self, cells: Tensor) -> Tensor:
        """One-hot parts ``[..., B, N, M]`` of paths given as cells ``[..., B, K, 2]`` (rows of -1 ignored)."""
        N, M = self._theta.shape[-2:]
        if cells.dim() < 3 or cells.shape[-1] != 2:
            raise ValueError(f"value: expected cells (i, j) of shape [..., B, K, 2], got {list(cells.shape)}")
        on = (cells >= 0).all(-1)
        flat = torch.where(on, cells[..., 0].clamp(0, N - 1) * M + cells[..., 1].clamp(0, M - 1), N * M)
        out = torch.zeros(*cells.shape[:-2], N * M + 1, dtype=self._theta.dtype, device=cells.device)
        return out.scatter(-1, flat, 1.0)[..., : N * M].reshape(*cells.shape[:-2], N, M)
