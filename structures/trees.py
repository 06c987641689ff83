"""What every dependency-tree structure shares: heads <-> one-hot arcs, decoding, networkx."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from .base import takes_validate_args
from .optional import require
from .validation import check_shape, check_tags, prefix_mask


def arcs(heads: Tensor, lengths: Tensor, n1: int, dtype: torch.dtype) -> Tensor:
    """One-hot arcs ``[..., B, N+1, N+1]`` (``[h, m]``, 0 the root) of heads ``[..., B, N]``
    (``heads[..., m-1]`` the head of word m); words past each example's length get no arc."""
    onehot = torch.nn.functional.one_hot(heads.long().clamp(0, n1 - 1), n1).transpose(-1, -2).to(dtype)
    onehot = onehot * prefix_mask(lengths.to(heads.device), n1 - 1).unsqueeze(-2)
    return torch.cat([torch.zeros_like(onehot[..., :1]), onehot], -1)


def root_row(arc_scores: Tensor) -> Tensor:
    """``[B, N+1, N+1]`` potentials (row 0 the root) of arc scores ``[B, N, N]`` with the root's
    arcs on the diagonal (torch-struct's layout); column 0 and the diagonal, never used, hold 0."""
    B, N, _ = arc_scores.shape
    eye = torch.eye(N, dtype=torch.bool, device=arc_scores.device)
    root = arc_scores.diagonal(0, 1, 2).unsqueeze(1)  # [B, 1, N]: root -> m
    rows = torch.cat([root, arc_scores.masked_fill(eye, 0.0)], 1)  # [B, N+1, N]
    return torch.cat([rows.new_zeros(B, N + 1, 1), rows], 2)


class DependencyTrees:
    """Mixin of the dependency-tree distributions (potentials ``[B, N+1, N+1]``, ``[b, h, m]``).

    Their ``mask`` is SuPar's, over the potentials' ``N+1`` positions: ``[B, N+1]`` bool, column 0
    the root symbol (ignored: SuPar sets it False, ``tokens != pad`` leaves it True), then True at
    each sentence's words, a prefix; the lengths are ``mask[:, 1:].sum(-1)``."""

    mask_root = True
    # from_torch_struct's default: torch-struct 0.5's DependencyCRF's (several root children; it has no second-order CRF)
    torch_struct_multiroot: ClassVar[bool] = True

    @classmethod
    @takes_validate_args
    def from_torch_struct(cls, arc_scores: Tensor, *args, multiroot: bool | None = None, **kwargs):
        """The distribution of torch-struct's ``DependencyCRF(arc_scores, lengths, multiroot=...)``
        (of its ``NonProjectiveDependencyCRF`` for the non-projective trees): ``arc_scores [B, N, N]``
        scores head ``h`` -> modifier ``m`` among words ``0..N-1`` with the root's arcs on the
        diagonal (``[b, m, m]``: root -> m). ``multiroot`` (in place of ``single_root``) lets the root
        take several children; its default is torch-struct's, so that a ported call keeps its
        distribution: True for projective trees, False for non-projective ones. The other arguments
        are the constructor's."""
        check_shape("arc_scores", arc_scores, "B, N, N")
        multiroot = cls.torch_struct_multiroot if multiroot is None else multiroot
        return cls(root_row(arc_scores), *args, single_root=not multiroot, **kwargs)

    @classmethod
    @takes_validate_args
    def from_supar(cls, scores: Tensor, *args, multiroot: bool = False, **kwargs):
        """The distribution of SuPar's ``DependencyCRF(scores, lens, multiroot)`` (``MatrixTree`` for
        the non-projective trees): ``scores [B, N+1, N+1]`` are ``[b, dependent, head]``, 0 the root
        (ours: ``[b, head, dependent]``), and the root takes one child unless ``multiroot``, as in
        SuPar. The other arguments are the constructor's (SuPar's mask ``[B, N+1]`` as ``mask=``)."""
        check_shape("scores", scores, "B, N, N")
        return cls(scores.transpose(1, 2), *args, single_root=not multiroot, **kwargs)

    def _support_flags(self) -> tuple:
        return (self.single_root,)

    def decode(self) -> Tensor:
        """``[B, N]`` long: the head of every word of the best tree (0 = root; 0 past each length)."""
        return self.heads(self.argmax)

    @staticmethod
    def heads(parts: Tensor) -> Tensor:
        """Heads ``[..., B, N]`` of trees given as one-hot arcs ``[..., B, N+1, N+1]``."""
        return parts[..., 1:].argmax(-2) * (parts[..., 1:].sum(-2) > 0)

    def to_parts(self, heads: Tensor) -> Tensor:
        """One-hot arcs ``[..., B, N+1, N+1]`` of trees given as heads ``[..., B, N]`` in ``0..N``
        (entries past each length ignored; ``ValueError`` naming ``value`` otherwise)."""
        n1 = self._theta.shape[-1]
        heads = check_tags(heads, self._batch, n1 - 1, n1, self.lengths, what="heads")
        return arcs(heads, self.lengths, n1, self._theta.dtype)

    def to_networkx(self, value: Tensor | None = None) -> list:
        """The trees as ``networkx.DiGraph`` s, one per example: nodes ``0..n`` (0 = root), an edge
        ``h -> m`` per arc with its ``score``. ``value``: heads ``[B, N]`` or one-hot arcs (default:
        the best trees)."""
        nx = require("networkx", "graphs", "to_networkx")

        heads = self.decode() if value is None else (self.heads(value) if value.dtype.is_floating_point else value)
        theta = self.log_potentials.detach()
        out = []
        for b in range(theta.shape[0]):
            n = int(self.lengths[b])
            g = nx.DiGraph()
            g.add_nodes_from(range(n + 1))
            for m in range(1, n + 1):
                h = int(heads[b, m - 1])
                g.add_edge(h, m, score=float(theta[b, h, m]))
            out.append(g)
        return out
