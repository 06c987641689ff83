"""A CRF tagging layer with pytorch-crf's interface, on :class:`~structures.EmissionCRF`."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..emission import EmissionCRF

_REDUCTIONS = ("none", "sum", "mean", "token_mean")


class CRF(nn.Module):
    """A linear-chain CRF over ``num_tags`` tags that owns its transition scores: a drop-in for
    pytorch-crf's ``torchcrf.CRF`` (same constructor, parameters, ``forward`` and ``decode``).

    Parameters: ``transitions [num_tags, num_tags]`` (from, to), ``start_transitions [num_tags]``
    and ``end_transitions [num_tags]``, initialised uniformly in ``[-0.1, 0.1]``. Tensors are
    ``[seq_len, batch, ...]``, or ``[batch, seq_len, ...]`` with ``batch_first=True``; ``mask``
    (bool or uint8, the shape of ``tags``) marks each sequence's positions, a prefix that includes
    the first timestep (checked as every structure's ``mask``, see
    :class:`~structures.base.Distribution`). The score of tags ``t`` is ``start[t_0] +
    Σ_i emissions[i, t_i] + Σ_i transitions[t_i, t_{i+1}] + end[t_last]``; the distribution is an :class:`EmissionCRF`
    (``distribution``), so marginals, samples and k-best come with it.
    """

    def __init__(self, num_tags: int, batch_first: bool = False) -> None:
        if num_tags <= 0:
            raise ValueError(f"num_tags: expected a positive number of tags, got {num_tags}")
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
        return f"num_tags={self.num_tags}, batch_first={self.batch_first}"

    def distribution(self, emissions: Tensor, mask: Tensor | None = None) -> EmissionCRF:
        """The distribution over tag sequences of ``emissions`` (laid out as the layer's tensors)."""
        emissions, mask = self._batch_first("emissions", emissions, mask)
        return EmissionCRF(emissions, self.transitions, self.start_transitions, self.end_transitions, mask=mask)

    def forward(self, emissions: Tensor, tags: Tensor, mask: Tensor | None = None, reduction: str = "sum") -> Tensor:
        """The log-likelihood of ``tags`` given ``emissions``: ``[batch]`` with ``reduction="none"``,
        else a scalar: its ``sum``, ``mean`` over the batch, or ``token_mean`` (the sum over the
        number of unmasked positions)."""
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction: expected one of {', '.join(_REDUCTIONS)}, got {reduction!r}")
        dist = self.distribution(emissions, mask)
        if not isinstance(tags, Tensor) or tags.dtype.is_floating_point or tags.dtype == torch.bool:
            raise ValueError(f"tags: expected an integer tensor, got {getattr(tags, 'dtype', type(tags).__name__)}")
        if tags.shape != emissions.shape[:2]:
            raise ValueError(f"tags: expected the shape of emissions without num_tags, {list(emissions.shape[:2])}, got {list(tags.shape)}")
        tags = tags.transpose(0, 1) if not self.batch_first else tags
        on = torch.arange(tags.shape[1], device=tags.device) < dist.lengths.unsqueeze(-1)
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
        return [row[:n] for row, n in zip(dist.decode().tolist(), dist.lengths.tolist())]

    def _batch_first(self, name: str, emissions: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """``emissions [batch, seq_len, num_tags]`` and ``mask [batch, seq_len]`` bool, checked."""
        layout = "[batch, seq_len" if self.batch_first else "[seq_len, batch"
        if not isinstance(emissions, Tensor) or emissions.dim() != 3 or emissions.shape[-1] != self.num_tags:
            got = list(emissions.shape) if isinstance(emissions, Tensor) else type(emissions).__name__
            raise ValueError(f"{name}: expected shape {layout}, num_tags={self.num_tags}], got {got}")
        if mask is not None:
            if not isinstance(mask, Tensor) or mask.dtype not in (torch.bool, torch.uint8):
                raise ValueError(f"mask: expected a bool or uint8 tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
            if mask.shape != emissions.shape[:2]:
                raise ValueError(f"mask: expected shape {layout}] = {list(emissions.shape[:2])}, got {list(mask.shape)}")
        if not self.batch_first:
            emissions = emissions.transpose(0, 1)
            mask = None if mask is None else mask.transpose(0, 1)
        # the rest of the checks (a prefix of each row, one position at least: the first timestep
        # on) are every structure's mask checks, in EmissionCRF (the values', while validating)
        return emissions, None if mask is None else mask.bool()
