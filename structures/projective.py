"""The projective dependency CRF: Eisner's algorithm, declared in the language."""

from __future__ import annotations

import torch
from torch import Tensor

import semiring

from .distribution import StructuredDistribution

# Spans [s, t] of the sentence (position 0 is the root): C complete, I incomplete, headed at the
# R(ight-pointing: head s) or L(eft-pointing: head t) end. arc[h, m] scores head h -> modifier m.
_CHART = """
    C[s, s, d]  = 1
    I[s, t, R] += C[s, u, R] * C[u+1, t, L] * arc[s, t]    for u in s..t-1
    I[s, t, L] += C[s, u, R] * C[u+1, t, L] * arc[t, s]    for u in s..t-1   if s > 0
    C[s, t, R] += I[s, u, R] * C[u, t, R]                  for u in s+1..t
    C[s, t, L] += C[s, u, L] * I[u, t, L]                  for u in s..t-1
"""
_MULTI_ROOT = _CHART + """
    goal        = C[0, n, R]    if n > 0                   # the root may take several children
"""
_SINGLE_ROOT = _CHART + """
    goal       += arc[0, m] * C[1, m, L] * C[m, n, R]      for m in 1..n   # exactly one child of the root
"""


class ProjectiveDependencyCRF(StructuredDistribution):
    """A distribution over projective dependency trees of ``n`` words.

    ``log_potentials[b, h, m]`` (shape ``[B, N+1, N+1]``) scores the arc from head ``h`` to
    modifier ``m``; index 0 is the root symbol, words are ``1..n``. Column 0 (arcs into the root)
    and the diagonal are never used. ``lengths[b]`` in ``1..N`` is the number of words.
    ``single_root=True`` lets the root take exactly one child; otherwise any number (Kim et al.
    2017, Appendix B). Marginals and one-hot trees have the shape of ``log_potentials``;
    ``decode()`` gives heads ``[B, N]`` (``heads[b, m-1]`` is the head of word m, 0 = root; 0 past
    each length).
    """

    shape = "B, N, N"

    def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None, single_root: bool = False):
        self.single_root = single_root
        super().__init__(log_potentials, lengths)

    @property
    def program(self) -> semiring.Program:
        return _SINGLE if self.single_root else _MULTI

    def decode(self) -> Tensor:
        """``[B, N]`` long: the head of every word of the best tree (0 = root; 0 past each length)."""
        return self.heads(self.argmax)

    @staticmethod
    def heads(parts: Tensor) -> Tensor:
        """Heads ``[..., B, N]`` of trees given as one-hot arcs ``[..., B, N+1, N+1]``."""
        return parts[..., 1:].argmax(-2) * (parts[..., 1:].sum(-2) > 0)

    def to_parts(self, heads: Tensor) -> Tensor:
        """One-hot arcs ``[..., B, N+1, N+1]`` of trees given as heads ``[..., B, N]`` (entries past each length ignored)."""
        n1 = self._theta.shape[-1]
        if heads.shape[-1] != n1 - 1:
            raise ValueError(f"value: expected heads of shape [..., B, {n1 - 1}], got {list(heads.shape)}")
        onehot = torch.nn.functional.one_hot(heads, n1).transpose(-1, -2).to(self._theta.dtype)  # [..., N+1(h), N(m)]
        inside = torch.arange(1, n1, device=heads.device) <= self.lengths.to(heads.device).unsqueeze(-1)
        onehot = onehot * inside.unsqueeze(-2)
        return torch.cat([torch.zeros_like(onehot[..., :1]), onehot], -1)


_MULTI = semiring.program(_MULTI_ROOT)
_SINGLE = semiring.program(_SINGLE_ROOT)
