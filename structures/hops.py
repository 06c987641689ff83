"""The n-state K-step chain over facts of Kim et al. 2017 §4.3 (memory networks with structure)."""

from __future__ import annotations

import torch
from torch import Tensor

import semiring

from .base import takes_validate_args
from .distribution import StructuredDistribution
from .validation import check_shape, check_tags, prefix_mask


class HopChainCRF(StructuredDistribution):
    """A distribution over the fact ``z_k`` chosen at each of K hops among F facts.

    ``log_potentials[b, k, g, f]`` (shape ``[B, K, F, F]``) scores choosing fact ``f`` at hop ``k``
    after fact ``g`` at hop ``k-1``; hop 0 has no predecessor and reads ``g = 0``. Build it from
    per-hop unary scores θ_k(i) or pairwise scores θ_{k,k+1}(i, j) with :meth:`unary` and
    :meth:`binary`, which take a mask of real facts and the option that no fact is chosen twice in
    a row. ``lengths [B]`` in ``1..K`` counts the hops of each example (or ``mask [B, K]``, bool,
    True at its hops: a prefix; not the facts' ``fact_mask``). ``decode()`` gives the fact per
    hop ``[B, K]``; ``hop_marginals`` gives p(z_k = i) ``[B, K, F]``.
    """

    program = semiring.program("""
        alpha[0, f]  = theta[0, 0, f]
        alpha[k, f] += alpha[k-1, g] * theta[k, g, f]
        goal        += alpha[n-1, f]
    """)
    shape = "B, K, F, F"

    @classmethod
    @takes_validate_args
    def unary(cls, scores: Tensor, fact_mask: Tensor | None = None, no_repeat: bool = False) -> "HopChainCRF":
        """Independent hops ``θ_k(i)``: ``scores [B, K, F]``; ``fact_mask [B, F]`` (True = a real fact)."""
        check_shape("scores", scores, "B, K, F")
        return cls._build(scores.unsqueeze(2).expand(-1, -1, scores.shape[-1], -1), fact_mask, no_repeat)

    @classmethod
    @takes_validate_args
    def binary(cls, first: Tensor, pairwise: Tensor, fact_mask: Tensor | None = None, no_repeat: bool = False) -> "HopChainCRF":
        """``first [B, F]`` = θ_1(i) and ``pairwise [B, K-1, F, F]`` = θ_{k,k+1}(i, j), one matrix per hop."""
        check_shape("first", first, "B, F")
        check_shape("pairwise", pairwise, "B, K, F, F")
        B, F = first.shape
        if pairwise.shape[0] != B or pairwise.shape[-1] != F:
            raise ValueError(f"pairwise: expected shape [B, K-1, F, F] = [{B}, K-1, {F}, {F}], got {list(pairwise.shape)}")
        hop0 = first.unsqueeze(1).unsqueeze(1).expand(B, 1, F, F)
        return cls._build(torch.cat([hop0, pairwise], 1), fact_mask, no_repeat)

    @classmethod
    def _build(cls, theta: Tensor, fact_mask: Tensor | None, no_repeat: bool) -> "HopChainCRF":
        B, K, F, _ = theta.shape
        forbid = torch.zeros(B, K, F, F, dtype=torch.bool, device=theta.device)
        if fact_mask is not None:
            if fact_mask.shape != (B, F) or fact_mask.dtype != torch.bool:
                raise ValueError(f"fact_mask: expected a bool tensor of shape [B, F] = [{B}, {F}], got {fact_mask.dtype} {list(fact_mask.shape)}")
            forbid |= ~fact_mask[:, None, None, :]
        if no_repeat:
            eye = torch.eye(F, dtype=torch.bool, device=theta.device)
            forbid[:, 1:] |= eye
        return cls(theta.masked_fill(forbid, float("-inf")))

    def decode(self) -> Tensor:
        """``[B, K]`` long: the fact chosen at each hop by the best chain."""
        return self.argmax.sum(-2).argmax(-1)

    def to_parts(self, facts: Tensor) -> Tensor:
        """One-hot parts ``[..., B, K, F, F]`` of fact sequences ``[..., B, K]`` (hops past each length ignored)."""
        K, F = self._theta.shape[1], self._theta.shape[-1]
        facts = check_tags(facts, self._batch, K, F, self.lengths)
        prev = torch.cat([torch.zeros_like(facts[..., :1]), facts[..., :-1]], -1)
        onehot = torch.nn.functional.one_hot(prev * F + facts, F * F).reshape(*facts.shape, F, F).to(self._theta.dtype)
        inside = prefix_mask(self.lengths.to(facts.device), K)
        return onehot * inside[..., None, None]

    @property
    def hop_marginals(self) -> Tensor:
        """``[B, K, F]``: p(z_k = i)."""
        return self.marginals.sum(-2)
