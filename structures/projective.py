"""The projective dependency CRF: Eisner's algorithm, declared in the language."""

from __future__ import annotations

from torch import Tensor

import semiring

from .distribution import StructuredDistribution
from .trees import DependencyTrees

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


class ProjectiveDependencyCRF(DependencyTrees, StructuredDistribution):
    """A distribution over projective dependency trees of ``n`` words.

    ``log_potentials[b, h, m]`` (shape ``[B, N+1, N+1]``) scores the arc from head ``h`` to
    modifier ``m``; index 0 is the root symbol, words are ``1..n``. Column 0 (arcs into the root)
    and the diagonal are never used. ``lengths[b]`` in ``1..N`` is the number of words; or
    ``mask [B, N+1]`` (SuPar's): column 0 the root (ignored), then True at each sentence's words.
    ``single_root=True`` lets the root take exactly one child; otherwise any number (Kim et al.
    2017, Appendix B). Marginals and one-hot trees have the shape of ``log_potentials``;
    ``decode()`` gives heads ``[B, N]`` (``heads[b, m-1]`` is the head of word m, 0 = root; 0 past
    each length).
    """

    shape = "B, N, N"

    def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None, single_root: bool = False, *,
                 mask: Tensor | None = None):
        self.single_root = single_root
        self.program = _SINGLE if single_root else _MULTI  # (an attribute: read several times a query)
        super().__init__(log_potentials, lengths, mask=mask)


_MULTI = semiring.program(_MULTI_ROOT)
_SINGLE = semiring.program(_SINGLE_ROOT)
