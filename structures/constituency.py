"""The constituency tree CRF: binary trees with labelled spans, CKY declared in the language."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

import semiring

from .base import takes_validate_args
from .distribution import StructuredDistribution


class ConstituencyCRF(StructuredDistribution):
    """A distribution over binary constituency trees of ``n`` words with a label on every span.

    ``log_potentials[b, i, j, l]`` (shape ``[B, N, N, L]``) scores a constituent covering words
    ``i..j`` (**both ends inclusive**, ``i <= j``) labelled ``l``; entries with ``i > j`` are never
    used. A tree has ``2n - 1`` constituents — every word (``i == j``), every internal node and the
    whole sentence ``0..n-1`` — each with one label, and its score is the sum of their potentials
    (Stern et al. 2017; Finkel et al. 2008). ``lengths[b]`` in ``1..N`` (default ``N``), or
    ``mask [B, N]`` (bool, True at each sentence's words: a prefix).

    Conventions of the peers: torch-struct 0.5 ``TreeCRF`` and SynJax ``TreeCRF`` take the same
    tensor ``[B, N, N, NT]`` (inclusive spans, label last) and define the same distribution. SuPar's
    ``CRFConstituency``/``ConstituencyCRF`` scores unlabelled spans on *fenceposts*, ``[B, N+1, N+1]``
    with ``[i, j]`` covering words ``i..j-1``: its ``scores[b, i, j+1]`` is our
    ``logsumexp_l log_potentials[b, i, j, l]``.

    Marginals, ``argmax``, samples and ``topk`` are ``[..., B, N, N, L]``. ``decode()`` gives the
    best tree as spans ``[B, 2N-1, 3]`` long: rows ``(start, end, label)`` in pre-order (a parent
    before its children, the left child before the right), ``-1`` past the ``2n - 1`` rows of each
    example; ``spans(parts)`` does the same for any one-hot trees, ``to_parts`` is its inverse (so
    ``log_prob`` takes spans too) and ``brackets`` writes trees as bracketed strings.
    """

    # span[s, t] sums the labels first, so the labels cost O(N^2 L), not O(N^3 L), in the split rule.
    program = semiring.program("""
        span[s, t] += score[s, t, l]                                    # a constituent s..t, any label
        S[s, s]     = span[s, s]                                        # a single word
        S[s, t]    += S[s, u] * S[u+1, t] * span[s, t]   for u in s..t-1   # split s..t after word u
        goal        = S[0, n-1]                                         # the sentence
    """)
    shape = "B, N, N, L"

    @classmethod
    @takes_validate_args
    def from_supar(cls, scores: Tensor, lengths: Tensor | None = None, *, mask: Tensor | None = None) -> "ConstituencyCRF":
        """The distribution of SuPar's ``ConstituencyCRF(scores, lens)``: spans on fenceposts,
        ``scores [B, N+1, N+1]`` (``[i, j]`` covers words ``i..j-1``; or ``[B, N+1, N+1, L]``
        labelled), ``lens`` the number of words: ours ``scores[:, :-1, 1:]`` (with ``L = 1``)."""
        if not isinstance(scores, Tensor) or scores.dim() not in (3, 4) or scores.shape[1] != scores.shape[2] or scores.shape[1] < 2:
            got = list(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
            raise ValueError(f"scores: expected SuPar's fencepost spans [B, N+1, N+1] (or [B, N+1, N+1, L]) with N >= 1, got {got}")
        spans = scores[:, :-1, 1:]
        return cls(spans if spans.dim() == 4 else spans[..., None], lengths, mask=mask)

    def decode(self) -> Tensor:
        """``[B, 2N-1, 3]`` long: the best tree's constituents ``(start, end, label)`` in pre-order,
        ``-1`` past each example's ``2n - 1`` rows."""
        return self.spans(self.argmax)

    @staticmethod
    def spans(parts: Tensor) -> Tensor:
        """``[..., B, 2N-1, 3]`` long: the constituents ``(start, end, label)`` of trees given as one-hot
        parts ``[..., B, N, N, L]``, in pre-order, ``-1`` past each tree's constituents."""
        N = parts.shape[-2]
        # Read with the end reversed, the flat order of the cells is pre-order: start up, end down.
        cells = parts.flip(-2).flatten(-3, -2)  # [..., N*N, L]
        on = cells.sum(-1) > 0
        order = on.to(torch.int8).argsort(dim=-1, descending=True, stable=True)[..., : 2 * N - 1]
        label = cells.argmax(-1).gather(-1, order)
        out = torch.stack([order // N, N - 1 - order % N, label], -1)
        return out.masked_fill(~on.gather(-1, order).unsqueeze(-1), -1)

    def to_parts(self, spans: Tensor) -> Tensor:
        """One-hot parts ``[..., B, N, N, L]`` of trees given as spans ``[..., B, S, 3]`` long (rows
        ``(start, end, label)``; rows of ``-1`` are ignored)."""
        N, L = self._theta.shape[-2:]
        if spans.dtype.is_floating_point or spans.dim() < 3 or spans.shape[-1] != 3 or spans.shape[-3] != self._batch:
            raise ValueError(f"value: expected integer spans of shape [..., {self._batch}, S, 3], got {spans.dtype} {list(spans.shape)}")
        start, end, label = spans.unbind(-1)
        real = start >= 0
        if bool((real & ((end < start) | (end >= N) | (label < 0) | (label >= L))).any()):
            raise ValueError(f"value: spans need 0 <= start <= end < {N} and labels in 0..{L - 1}")
        cell = torch.where(real, (start * N + end) * L + label, N * N * L)  # the ignored rows: one spare cell
        parts = torch.zeros(*spans.shape[:-2], N * N * L + 1, dtype=self._theta.dtype, device=spans.device)
        parts.scatter_(-1, cell, 1.0)
        return parts[..., :-1].reshape(*spans.shape[:-2], N, N, L)

    def brackets(self, spans: Tensor | None = None, words: Sequence[Sequence[str]] | None = None,
                 labels: Sequence[str] | None = None) -> list[str]:
        """One bracketed string per example, e.g. ``(S (NP (D the) (N dog)) (V barks))``, of trees given
        as spans ``[B, S, 3]`` in pre-order (default: the best trees). ``words[b]`` names example b's
        words (default: their positions), ``labels`` the labels (default: their numbers)."""
        rows = (self.decode() if spans is None else spans).tolist()
        out = []
        for b, tree in enumerate(rows):
            it = iter(tree)

            def build() -> str:
                start, end, label = next(it)
                name = labels[label] if labels else str(label)
                if start == end:
                    return f"({name} {words[b][start] if words else start})"
                return f"({name} {build()} {build()})"

            out.append(build())
        return out
