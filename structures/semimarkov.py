"""The semi-Markov CRF: labelled segmentations with segments of length up to K."""

from __future__ import annotations

import math

import torch
from torch import Tensor

import semiring

from .base import takes_validate_args
from .distribution import StructuredDistribution
from .validation import check_shape, given_lengths, lengths_checked


class SemiMarkovCRF(StructuredDistribution):
    """A distribution over segmentations of ``n`` positions into labelled segments of length ``1..K``.

    ``log_potentials[b, j, k-1, y, c]`` (shape ``[B, N, K, C, C]``) scores a segment of length ``k``
    that *ends* at position ``j`` (covers ``j-k+1..j``), labelled ``c``, following a segment labelled
    ``y``. The first segment has no predecessor and reads ``y = 0``. ``lengths[b]`` in ``1..N``
    (or ``mask [B, N]``, bool, True at each example's positions: a prefix).
    ``decode()`` gives the label of every position ``[B, N]`` (0 past each length, as every structure pads) and
    ``segments()`` the best segmentation as ``(first, last, label)`` triples per example. Values for
    ``log_prob`` are one-hot parts.
    """

    program = semiring.program("""
        alpha[j+1, c] += seg[j, j, 0, c]                          # the first segment: 0..j
        alpha[j+1, c] += alpha[j+1-k, y] * seg[j, k-1, y, c]      # a segment j-k+1..j after one labelled y
        goal          += alpha[n, c]
    """)
    shape = "B, N, K, C, C"

    @classmethod
    @takes_validate_args
    def from_torch_struct(cls, log_potentials: Tensor, lengths: Tensor | None = None, *,
                          mask: Tensor | None = None) -> "SemiMarkovCRF":
        """The distribution of torch-struct's ``SemiMarkovCRF(log_potentials, lengths)``.

        torch-struct's ``log_potentials [B, N-1, K, C, C]`` are ``[b, start, k, label, previous
        label]`` over fenceposts ``0..N-1``: a segment from fencepost ``start`` to ``start + k``
        (``k`` in ``1..K-1``; slot ``k = 0`` is never used), and its ``lengths`` count fenceposts
        (default N). Its first segment's previous label is free: a structure of it is a
        segmentation and a label for fencepost 0, so the first segment's score is summed over
        that label here (its log Z is ours; the previous label of the first segment, given the
        segment, is distributed as ``softmax`` of those scores). Ours: ``[B, N-1, K-1, C, C]``,
        segments of ``1..K-1`` positions, ``lengths - 1`` positions (``mask`` is ours, over them)."""
        check_shape("log_potentials", log_potentials, "B, N, K, C, C")
        B, N1, K, C, _ = log_potentials.shape
        if K < 2 or N1 < 1:
            raise ValueError(f"log_potentials: expected torch-struct's shape [B, N-1, K, C, C] with N-1 >= 1 and K >= 2 "
                             f"(segments of 1..K-1), got {list(log_potentials.shape)}")
        end = torch.arange(N1, device=log_potentials.device)[:, None]  # our position j: the segment's last
        size = torch.arange(1, K, device=log_potentials.device)[None, :]  # its length k
        start = end - size + 1
        ours = log_potentials[:, start.clamp(min=0), size.expand(N1, K - 1)].transpose(-1, -2)  # [B, j, k-1, y, c]
        ours = ours.masked_fill((start < 0)[..., None, None], -math.inf)
        first = log_potentials[:, 0, 1:].logsumexp(-1)  # [B, K-1, C]: from fencepost 0, any previous label
        at_first = (start == 0)[..., None, None] & (torch.arange(C, device=ours.device) == 0)[:, None]  # y = 0 reads it
        ours = torch.where(at_first, first[:, None, :, None, :], ours)
        if mask is not None:  # (ours: the base reads it)
            return cls(ours, lengths, mask=mask)
        lengths = given_lengths(lengths, None, B, 2, N1 + 1, log_potentials.device)
        with lengths_checked():  # fenceposts in 2..N: ours, lengths - 1, in 1..N-1
            return cls(ours, None if lengths is None else lengths - 1)

    @classmethod
    @takes_validate_args
    def from_supar(cls, scores: Tensor, trans: Tensor | None = None, lengths: Tensor | None = None, *,
                   mask: Tensor | None = None) -> "SemiMarkovCRF":
        """The distribution of SuPar's ``SemiMarkovCRF(scores, trans, lens)``: ``scores [B, N, N, T]``
        scores a segment of words ``i..j`` (both inclusive) labelled ``t`` as ``scores[b, i, j, t]``,
        and ``trans [T, T]`` (previous, next; default 0) every pair of consecutive segments; there
        are no start or end scores and segments have any length ``1..N``. Ours: ``[B, N, N, T, T]``,
        a segment's score plus the transition from the segment before it (none for the first)."""
        check_shape("scores", scores, "B, N, N, T")
        B, N, _, T = scores.shape
        if trans is None:
            trans = scores.new_zeros(T, T)
        check_shape("trans", trans, "T, T")
        if trans.shape[0] != T:
            raise ValueError(f"trans: expected shape [T, T] = [{T}, {T}], got {list(trans.shape)}")
        end = torch.arange(N, device=scores.device)[:, None]  # our position j: the segment's last word
        size = torch.arange(1, N + 1, device=scores.device)[None, :]  # its length k
        start = end - size + 1
        span = scores[:, start.clamp(min=0), end.expand(N, N)]  # [B, j, k-1, t]
        ours = (span[:, :, :, None, :] + trans).masked_fill((start < 0)[..., None, None], -math.inf)
        at_first = (start == 0)[..., None, None] & (torch.arange(T, device=scores.device) == 0)[:, None]  # y = 0: no transition
        return cls(torch.where(at_first, span[:, :, :, None, :], ours), lengths, mask=mask)

    def decode(self) -> Tensor:
        """``[B, N]`` long: the label of every position in the best segmentation (0 past each length)."""
        return self.labels(self.argmax)

    def segments(self, parts: Tensor | None = None) -> list[list[tuple[int, int, int]]]:
        """``(first, last, label)`` of every segment, per example, of one-hot parts ``[B, N, K, C, C]``
        (default: the best segmentation)."""
        parts = self.argmax if parts is None else parts
        ends = parts.sum(-2).nonzero().tolist()  # (b, last, length - 1, label)
        out: list[list[tuple[int, int, int]]] = [[] for _ in range(parts.shape[0])]
        for b, last, k, label in sorted(ends):
            out[b].append((last - k, last, label))
        return out

    def labels(self, parts: Tensor) -> Tensor:
        """Per-position labels ``[..., B, N]`` of segmentations given as one-hot parts (0 where no
        segment covers a position: past each length)."""
        N, K = parts.shape[-4], parts.shape[-3]
        on = parts.sum(-2)  # [..., N, K, C]: segment ending at j of length k labelled c
        out = torch.zeros(parts.shape[:-4] + (N,), dtype=torch.long, device=parts.device)
        ends = on.flatten(-2).sum(-1) > 0  # [..., N]
        length = on.sum(-1).argmax(-1) + 1  # [..., N]
        label = on.sum(-2).argmax(-1)
        pos = torch.arange(N, device=parts.device)
        for k in range(1, K + 1):
            for back in range(k):
                hit = ends & (length == k) & (pos >= back)
                shifted = torch.where(hit, label, torch.full_like(label, -1))
                target = torch.roll(shifted, -back, -1)
                target[..., N - back:] = -1
                out = torch.where(target >= 0, target, out)
        return out
