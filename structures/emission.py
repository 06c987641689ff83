"""The linear-chain CRF in the emission + transition parameterization of pytorch-crf."""

from __future__ import annotations

import torch
from torch import Tensor

import semiring

from .base import takes_validate_args
from .distribution import StructuredDistribution
from .validation import check_emission_scores, check_shape, check_tags, prefix_mask


class EmissionCRF(StructuredDistribution):
    """A distribution over tag sequences scored by per-position emissions and shared transitions:

    ``score(t) = start[t_0] + Σ_i emissions[i, t_i] + Σ_i transitions[t_i, t_{i+1}] + end[t_{n-1}]``

    ``emissions [B, N, C]`` are the potentials: marginals are p(tag at i is c) ``[B, N, C]`` and
    structures are one-hot tags ``[B, N, C]`` (0 past each length). ``transitions [C, C]`` (from,
    to), ``start [C]`` and ``end [C]`` are scores shared by the batch (default 0); gradients reach
    them through ``log_prob``/``log_partition`` as through the emissions. ``lengths[b]`` in ``1..N``,
    or ``mask [B, N]`` (bool, True at each sequence's positions: a prefix, as pytorch-crf's).
    ``decode()`` gives tags ``[B, N]`` (0 past each length); ``log_prob`` takes tags or one-hot tags.

    Because the transition matrix is shared, each step of the forward algorithm is one matrix
    product with ``exp(transitions)`` (exact, see ``semiring.Log.dot``), not a ``[B, C, C]`` logsumexp.
    """

    program = semiring.program("""
        alpha[0, c]  = start[c] * emit[0, c]
        alpha[i, c] += alpha[i-1, y] * trans[y, c] * emit[i, c]
        goal        += alpha[n-1, c] * end[c]
    """)
    every_decoded_value_is_a_structure = True  # any tags in range
    shape = "B, N, C"
    potentials = "emit"
    argument = "emissions"

    def __init__(self, emissions: Tensor, transitions: Tensor, start: Tensor | None = None,
                 end: Tensor | None = None, lengths: Tensor | None = None, *, mask: Tensor | None = None):
        check_emission_scores(emissions, transitions, start, end)
        C = emissions.shape[-1]
        shared = {"trans": transitions.unsqueeze(0)}
        for name, v in (("start", start), ("end", end)):
            shared[name] = emissions.new_zeros(1, C) if v is None else v.unsqueeze(0)
        super().__init__(emissions, lengths, shared, mask=mask)

    def _check_potentials(self, log_potentials: Tensor) -> None:
        check_shape(self.argument, log_potentials, self.shape, values=False)  # (their values: checked by __init__)

    @classmethod
    @takes_validate_args
    def from_supar(cls, scores: Tensor, trans: Tensor | None = None, lengths: Tensor | None = None, *,
                   mask: Tensor | None = None) -> "EmissionCRF":
        """The distribution of SuPar's ``LinearChainCRF(scores, trans, lens)`` (``CRFLinearChain``):
        ``scores [B, N, T]`` the emissions and ``trans [T+1, T+1]`` (from, to; default 0) the
        transitions with a start/end symbol last: ``trans[-1, :T]`` starts, ``trans[:T, -1]`` ends,
        so ``EmissionCRF(scores, trans[:T, :T], start=trans[-1, :T], end=trans[:T, -1])``."""
        check_shape("scores", scores, "B, N, T")
        T = scores.shape[-1]
        if trans is None:
            trans = scores.new_zeros(T + 1, T + 1)
        check_shape("trans", trans, "T, T")
        if trans.shape[0] != T + 1:
            raise ValueError(f"trans: expected shape [T+1, T+1] = [{T + 1}, {T + 1}] (start/end last), got {list(trans.shape)}")
        return cls(scores, trans[:T, :T], trans[-1, :T], trans[:T, -1], lengths, mask=mask)

    def decode(self) -> Tensor:
        """``[B, N]`` long: the best tag sequence (0 past each length)."""
        return self.argmax.argmax(-1)

    def to_parts(self, tags: Tensor) -> Tensor:
        """One-hot tags ``[..., B, N, C]`` of tag sequences ``[..., B, N]`` (entries past each length ignored)."""
        N, C = self._theta.shape[-2:]
        tags = check_tags(tags, self._batch, N, C, self.lengths)
        inside = prefix_mask(self.lengths.to(tags.device), N)
        return torch.nn.functional.one_hot(tags, C).to(self._theta.dtype) * inside.unsqueeze(-1)

    def shared_counts(self, parts: Tensor) -> dict[str, Tensor]:
        """Transitions taken ``[..., B, C, C]``, and the first and last tags ``[..., B, C]``."""
        last = (self.lengths.to(parts.device) - 1).reshape(-1, 1, 1).expand(-1, 1, parts.shape[-1])
        return {
            "trans": parts[..., :-1, :].transpose(-1, -2) @ parts[..., 1:, :],
            "start": parts[..., 0, :],
            "end": parts.gather(-2, last.expand(*parts.shape[:-2], 1, parts.shape[-1])).squeeze(-2),
        }

    @property
    def tag_marginals(self) -> Tensor:
        """``[B, N, C]``: p(tag at position i is c) — the marginals (as ``LinearChainCRF.tag_marginals``)."""
        return self.marginals
