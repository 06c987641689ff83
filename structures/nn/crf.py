"""A CRF tagging layer with pytorch-crf's interface, on :class:`~structures.EmissionCRF`."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..emission import EmissionCRF
from ..validation import prefix_mask, validating

_REDUCTIONS = ("none", "sum", "mean", "token_mean")


class CRF(nn.Module):
    """A linear-chain CRF over ``num_tags`` tags that owns its transition scores: a drop-in for
    pytorch-crf's ``torchcrf.CRF`` (same constructor, parameters, ``forward`` and ``decode``).

    Parameters: ``transitions [num_tags, num_tags]`` (from, to), ``start_transitions [num_tags]``
    and ``end_transitions [num_tags]``, initialised uniformly in ``[-0.1, 0.1]``. Tensors are
    ``[seq_len, batch, ...]``, or ``[batch, seq_len, ...]`` with ``batch_first=True``; ``mask``
    (bool or uint8, the shape of ``tags``) marks each sequence's positions, a prefix that includes
    the first timestep (checked as every structure's ``mask``, see
    :class:`~structures.base.Distribution`). Errors are ``ValueError`` s that name the argument and
    carry pytorch-crf's own words (``invalid number of tags: 0``, ``mask of the first timestep must
    all be on``, ...), and the layer's repr is pytorch-crf's, ``CRF(num_tags=10)``. The score of tags ``t`` is ``start[t_0] +
    Σ_i emissions[i, t_i] + Σ_i transitions[t_i, t_{i+1}] + end[t_last]``; the distribution is an :class:`EmissionCRF`
    (``distribution``), so marginals, samples and k-best come with it.
    """

    def __init__(self, num_tags: int, batch_first: bool = False) -> None:
        if num_tags <= 0:
            raise ValueError(f"num_tags: invalid number of tags: {num_tags} (expected a positive number)")
        super().__init__()
        self.num_tags = num_tags
        self.batch_first = batch_first
        self.start_transitions = nn.Parameter(torch.empty(num_tags))
        self.end_transitions = nn.Parameter(torch.empty(num_tags))
        self.transitions = nn.Parameter(torch.empty(num_tags, num_tags))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in (self.start_transitions, self.end_transitions, self.transitions):
            nn.init.uniform_(p, -0.1, 0.1)

    def extra_repr(self) -> str:
        """pytorch-crf's ``CRF(num_tags=10)``, with ``batch_first=True`` where it is."""
        return f"num_tags={self.num_tags}" + (", batch_first=True" if self.batch_first else "")

    def distribution(self, emissions: Tensor, mask: Tensor | None = None) -> EmissionCRF:
        """The distribution over tag sequences of ``emissions`` (laid out as the layer's tensors)."""
        emissions, mask = self._batch_first(emissions, mask)
        return EmissionCRF(emissions, self.transitions, self.start_transitions, self.end_transitions, mask=mask)

    def forward(self, emissions: Tensor, tags: Tensor, mask: Tensor | None = None, reduction: str = "sum") -> Tensor:
        """The log-likelihood of ``tags`` given ``emissions``: ``[batch]`` with ``reduction="none"``,
        else a scalar: its ``sum``, ``mean`` over the batch, or ``token_mean`` (the sum over the
        number of unmasked positions)."""
        self._check_emissions(emissions)
        if not isinstance(tags, Tensor) or tags.dtype.is_floating_point or tags.dtype == torch.bool:
            raise ValueError(f"tags: expected an integer tensor, got {getattr(tags, 'dtype', type(tags).__name__)}")
        if tags.shape != emissions.shape[:2]:
            raise ValueError(f"tags: the first two dimensions of emissions and tags must match, got "
                             f"{tuple(emissions.shape[:2])} and {tuple(tags.shape)}")
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction: invalid reduction: {reduction} (expected one of {', '.join(_REDUCTIONS)})")
        dist = self.distribution(emissions, mask)
        tags = tags.transpose(0, 1) if not self.batch_first else tags
        on = prefix_mask(dist.lengths.to(tags.device), tags.shape[1])
        if bool(((tags < 0) | (tags >= self.num_tags))[on].any()):
            raise ValueError(f"tags: expected tags in 0..{self.num_tags - 1} at unmasked positions")
        llh = dist.log_prob(tags.masked_fill(~on, 0))
        if reduction == "none":
            return llh
        if reduction == "sum":
            return llh.sum()
        if reduction == "mean":
            return llh.mean()
        return llh.sum() / dist.lengths.sum()

    def decode(self, emissions: Tensor, mask: Tensor | None = None) -> list[list[int]]:
        """The best tag sequence of every example, as lists of each one's own length."""
        dist = self.distribution(emissions, mask)
        rows = torch.cat([dist.decode(), dist.lengths.to(emissions.device).unsqueeze(-1)], -1).tolist()  # (one read)
        return [row[:row[-1]] for row in rows]

    def _check_emissions(self, emissions: Tensor) -> None:
        """``ValueError`` unless ``emissions`` is ``[seq_len, batch, num_tags]`` (batch first with
        ``batch_first``) with ``seq_len >= 1``."""
        layout = f"[{'batch, seq_len' if self.batch_first else 'seq_len, batch'}, num_tags={self.num_tags}]"
        if not isinstance(emissions, Tensor):
            raise ValueError(f"emissions: expected a tensor {layout}, got {type(emissions).__name__}")
        if emissions.dim() != 3:
            raise ValueError(f"emissions: emissions must have dimension of 3, got {emissions.dim()} (expected {layout})")
        if emissions.shape[-1] != self.num_tags:
            raise ValueError(f"emissions: expected last dimension of emissions is {self.num_tags}, got {emissions.shape[-1]} "
                             f"(expected {layout})")
        if emissions.shape[1 if self.batch_first else 0] == 0:
            raise ValueError(f"emissions: expected seq_len >= 1 (every sequence has a first tag), got shape {list(emissions.shape)} "
                             f"(expected {layout})")

    def _batch_first(self, emissions: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """``emissions [batch, seq_len, num_tags]`` and ``mask [batch, seq_len]`` bool, checked."""
        self._check_emissions(emissions)
        if mask is not None:
            if not isinstance(mask, Tensor) or mask.dtype not in (torch.bool, torch.uint8):
                raise ValueError(f"mask: expected a bool or uint8 tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
            if mask.shape != emissions.shape[:2]:
                raise ValueError(f"mask: the first two dimensions of emissions and mask must match, got "
                                 f"{tuple(emissions.shape[:2])} and {tuple(mask.shape)}")
        if not self.batch_first:
            emissions = emissions.transpose(0, 1)
            mask = None if mask is None else mask.transpose(0, 1)
        if mask is not None and validating() and not bool(mask[:, 0].all()):
            raise ValueError("mask: mask of the first timestep must all be on (every sequence has a first tag)")
        # the rest of the checks (a prefix of each row) are every structure's mask checks, in
        # EmissionCRF (the values', while validating)
        return emissions, None if mask is None else mask.bool()
