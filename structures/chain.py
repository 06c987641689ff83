"""The linear-chain CRF."""

from __future__ import annotations

import torch
from torch import Tensor

import semiring

from .base import takes_validate_args
from .distribution import StructuredDistribution
from .validation import check_emission_scores, check_shape, check_tags, given_lengths, lengths_checked, prefix_mask


class LinearChainCRF(StructuredDistribution):
    """A distribution over tag sequences of length ``n`` with ``C`` tags.

    ``log_potentials[b, i, y, c]`` (shape ``[B, N-1, C, C]``) scores tag ``y`` at position ``i``
    followed by tag ``c`` at position ``i+1`` ("from" first, "to" second). ``lengths[b]`` in
    ``1..N`` is the number of tags of example b (default N); or ``mask [B, N]`` (bool, True at
    each sequence's tags: a prefix). Marginals and one-hot structures have the shape of
    ``log_potentials``; ``decode()`` gives tags ``[B, N]`` (0 past each length).

    Use :meth:`from_emissions` for the emission + transition parameterization of pytorch-crf.
    """

    program = semiring.program("""
        alpha[0, c]  = 1
        alpha[i, c] += alpha[i-1, y] * edge[i-1, y, c]
        goal        += alpha[n-1, c]
    """)
    every_decoded_value_is_a_structure = True  # any tags in range
    shape = "B, N-1, C, C"

    def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None, *, mask: Tensor | None = None):
        super().__init__(log_potentials, lengths, mask=mask)
        self._bos = False  # True when tag 0 at position 0 is a start symbol (from_emissions)
        self._emission_parts: tuple[Tensor, Tensor] | None = None  # (emissions with start/end folded in, transitions)

    @classmethod
    @takes_validate_args
    def from_torch_struct(cls, log_potentials: Tensor, lengths: Tensor | None = None, *,
                          mask: Tensor | None = None) -> "LinearChainCRF":
        """The distribution of torch-struct's ``LinearChainCRF(log_potentials, lengths)``, whose
        ``log_potentials [B, N-1, C, C]`` are ``[b, i, to, from]`` (ours: ``[b, i, from, to]``)."""
        check_shape("log_potentials", log_potentials, "B, N-1, C, C")
        return cls(log_potentials.transpose(-1, -2), lengths, mask=mask)

    @classmethod
    @takes_validate_args
    def from_emissions(cls, emissions: Tensor, transitions: Tensor, start: Tensor | None = None,
                       end: Tensor | None = None, lengths: Tensor | None = None, *,
                       mask: Tensor | None = None) -> "LinearChainCRF":
        """The CRF ``score(tags) = start[t_0] + Σ_i emissions[i, t_i] + Σ_i transitions[t_i, t_{i+1}] + end[t_{n-1}]``.

        ``emissions [B, N, C]``, ``transitions [C, C]`` (from, to), ``start [C]``, ``end [C]``,
        ``lengths [B]`` in ``1..N`` or ``mask [B, N]`` (bool, True at each sequence's tags). Built
        as a chain over ``N+1`` positions whose first is a start symbol, so that sequences of
        length 1 are scored like any other; ``decode()`` and ``to_parts`` speak of the ``N`` real
        tags.
        """
        check_emission_scores(emissions, transitions, start, end)
        B, N, C = emissions.shape
        if N == 0 or C == 0:
            raise ValueError(f"emissions: expected shape [B, N, C] with N >= 1 positions and C >= 1 tags, got {list(emissions.shape)}")
        lengths = given_lengths(lengths, mask, B, 1, N, emissions.device)
        # start and end only touch the "to" tag of one position each: fold them into the emissions
        # ([B, N, C]) and build the edge potentials with a single broadcast add.
        em = emissions
        if start is not None:
            em = torch.cat([em[:, :1] + start, em[:, 1:]], 1)
        if end is not None:
            last = (torch.full((B,), N, device=em.device) if lengths is None else lengths.to(em.device)) - 1
            at_last = torch.arange(N, device=em.device) == last[:, None]  # [B, N]
            em = torch.where(at_last[:, :, None], em + end, em)  # not a product: end may be -inf
        # position 0 leaves the start symbol (row 0) only; the others move by the transitions
        first = torch.full((1, C, C), float("-inf"), dtype=transitions.dtype, device=transitions.device)
        first[:, 0] = 0
        moves = torch.cat([first, transitions.unsqueeze(0).expand(N - 1, C, C)], 0)  # [N, C, C]
        edge = moves + em.unsqueeze(2)  # [B, N, C(from), C(to)]
        with lengths_checked():  # in 1..N above: the chain's lengths + 1 are in its 2..N+1
            crf = cls(edge, None if lengths is None else lengths + 1)
        crf._emission_parts = (em, transitions)
        crf._bos = True
        return crf

    def decode(self) -> Tensor:
        """``[B, N]`` long: the best tag sequence (0 past each length). Works under ``torch.no_grad()``."""
        return self.tags(self.argmax)

    def tags(self, parts: Tensor) -> Tensor:
        """Tags ``[..., B, N]`` of structures given as one-hot parts ``[..., B, N-1, C, C]``."""
        if parts.shape[-3] == 0:
            return torch.zeros(*parts.shape[:-3], 1, dtype=torch.long, device=parts.device)
        first = parts[..., :1, :, :].sum(-1).argmax(-1)
        rest = parts.sum(-2).argmax(-1)
        on = parts.flatten(-2).sum(-1) > 0
        tags = torch.cat([first, rest * on], -1)
        return tags[..., 1:] if self._bos else tags

    def to_parts(self, tags: Tensor) -> Tensor:
        """One-hot parts ``[..., B, N-1, C, C]`` of tag sequences ``[..., B, N]`` (entries past each length ignored)."""
        if self._bos:
            tags = torch.cat([torch.zeros_like(tags[..., :1]), tags], -1)
        C = self._theta.shape[-1]
        n = self._theta.shape[1] + 1
        if tags.shape[-1] != n:
            raise ValueError(f"value: expected tags of shape [..., B, {n - 1 if self._bos else n}], got {list(tags.shape)}")
        pairs = tags[..., :-1] * C + tags[..., 1:]
        onehot = torch.nn.functional.one_hot(pairs, C * C).reshape(*pairs.shape, C, C).to(self._theta.dtype)
        inside = prefix_mask(self.lengths.to(tags.device) - 1, n - 1)
        return onehot * inside[..., None, None]

    def score(self, value: Tensor) -> Tensor:
        """``[..., B]``: ⟨θ, z⟩ for tag sequences ``[..., B, N]`` (or one-hot parts).

        Tags are scored by gathering the potentials of the chosen transitions, never through the
        ``[..., B, N-1, C, C]`` one-hot parts; entries past each length are ignored (any value).
        A CRF built by :meth:`from_emissions` gathers from its emissions and transitions directly.
        """
        if value.dtype.is_floating_point:
            return super().score(value)
        B, C = self._batch, self._theta.shape[-1]
        n = self._theta.shape[1] + (0 if self._bos else 1)  # tags per example
        tag_lengths = self.lengths.to(value.device) - (1 if self._bos else 0)
        tags = check_tags(value, B, n, C, tag_lengths)
        inside = prefix_mask(tag_lengths, n)  # [B, n]
        lead = tags.shape[:-2]
        if self._emission_parts is not None:
            em, trans = self._emission_parts
            em, trans = em.to(self._theta.dtype), trans.to(self._theta.dtype)
            e = em.expand(*lead, *em.shape).gather(-1, tags.unsqueeze(-1)).squeeze(-1)  # [..., B, n]
            t = trans[tags[..., :-1], tags[..., 1:]]  # [..., B, n-1]
            return torch.where(inside, e, 0).sum(-1) + torch.where(inside[:, 1:], t, 0).sum(-1)
        if self._bos:  # the start symbol, tag 0, before the first tag
            tags = torch.cat([torch.zeros_like(tags[..., :1]), tags], -1)
            inside = torch.cat([torch.ones_like(inside[:, :1]), inside], -1)
        pairs = tags[..., :-1] * C + tags[..., 1:]  # [..., B, N-1]
        flat = self._theta.flatten(-2)
        g = flat.expand(*lead, *flat.shape).gather(-1, pairs.unsqueeze(-1)).squeeze(-1)
        return torch.where(inside[:, 1:], g, 0).sum(-1)

    @property
    def tag_marginals(self) -> Tensor:
        """``[B, N, C]``: p(tag at position i is c) (0 past each length)."""
        m = self.marginals
        first = m[:, :1].sum(-1) if m.shape[1] else m.new_zeros(m.shape[0], 1, m.shape[-1])
        tags = torch.cat([first, m.sum(-2)], 1)
        if self._bos:
            return tags[:, 1:]
        # a length-1 example has no edge to read its tag from: its C tags are equally likely
        alone = (self.lengths.to(m.device) == 1).to(m.dtype) / m.shape[-1]
        return torch.cat([tags[:, :1] + alone[:, None, None], tags[:, 1:]], 1)
