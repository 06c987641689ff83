"""The second-order projective dependency CRF: arcs and adjacent siblings (McDonald & Pereira 2006),
Eisner's chart with a sibling chart, declared in the language."""

from __future__ import annotations

import torch
from torch import Tensor

import semiring

from .base import takes_validate_args
from .distribution import StructuredDistribution
from .trees import DependencyTrees
from .validation import check_shape

# Eisner's spans (projective.py) where a head takes its modifiers on each side from the inside out:
# the first, closest one by arc[h, m] alone, each later one m by arc[h, m] * sib[h, s, m] with s the
# modifier taken before it (the adjacent one between h and m). S[s, t] spans two adjacent siblings
# s < t: s's right half and t's left half.
_CHART = """
    C[s, s, d]  = 1
    S[s, t]    += C[s, u, R] * C[u+1, t, L]                           for u in s..t-1
    I[s, t, R] += C[s+1, t, L] * arc[s, t]
    I[s, t, R] += I[s, u, R] * S[u, t] * arc[s, t] * sib[s, u, t]    for u in s+1..t-1
    I[s, t, L] += C[s, t-1, R] * arc[t, s]                            if s > 0
    I[s, t, L] += S[s, u] * I[u, t, L] * arc[t, s] * sib[t, u, s]    for u in s+1..t-1   if s > 0
    C[s, t, R] += I[s, u, R] * C[u, t, R]                             for u in s+1..t
    C[s, t, L] += C[s, u, L] * I[u, t, L]                             for u in s..t-1
"""
_MULTI = semiring.program(_CHART + """
    goal        = C[0, n, R]    if n > 0                              # the root may take several children
""")
_SINGLE = semiring.program(_CHART + """
    goal       += arc[0, m] * C[1, m, L] * C[m, n, R]                 for m in 1..n   # exactly one child of the root
""")


def adjacent_siblings(arcs: Tensor) -> Tensor:
    """The sibling parts ``[..., N+1, N+1, N+1]`` (head, sibling, modifier) of trees given as one-hot
    arcs ``[..., N+1, N+1]`` (head, modifier): 1 where ``s`` and ``m`` are modifiers of ``h`` on the
    same side with ``s`` between ``h`` and ``m`` and no other modifier of ``h`` between ``s`` and ``m``."""
    k = torch.arange(arcs.shape[-1], device=arcs.device)
    h, s, m = k[:, None, None], k[None, :, None], k[None, None, :]
    inward = ((h < s) & (s < m)) | ((m < s) & (s < h))
    taken = arcs.cumsum(-1)  # [..., h, k]: modifiers of h at or left of k
    adjacent = (taken[..., :, None, :] - taken[..., :, :, None]).abs() == 1
    return arcs[..., :, :, None] * arcs[..., :, None, :] * (adjacent & inward)


class SecondOrderDependencyCRF(DependencyTrees, StructuredDistribution):
    """A distribution over projective dependency trees of ``n`` words scored by arcs and adjacent
    siblings: ``score(z) = Σ_{arcs h→m} arc[h, m] + Σ_{siblings} sib[h, s, m]``.

    ``log_potentials[b, h, m]`` (``[B, N+1, N+1]``) scores the arc from head ``h`` to modifier ``m``
    as in ``ProjectiveDependencyCRF`` (0 is the root; column 0 and the diagonal are never used).
    ``siblings[b, h, s, m]`` (``[B, N+1, N+1, N+1]``) scores ``m`` taken by ``h`` right after ``s``:
    ``s`` and ``m`` are modifiers of ``h`` on the same side, ``s`` the closer one to ``h``, and no
    modifier of ``h`` lies between them. SuPar's ``Dependency2oCRF`` indexes its siblings
    ``[b, m, h, s]``: SuPar's to ours is ``sibs.permute(0, 2, 3, 1)``, ours to SuPar's
    ``siblings.permute(0, 3, 1, 2)`` (:meth:`from_supar` converts). The modifier
    closest to ``h`` on each side has no sibling score; entries with ``s`` not strictly between
    ``h`` and ``m`` are never used.

    The arcs are the parts: marginals, argmax, samples and one-hot trees are ``[B, N+1, N+1]`` and
    ``decode()`` gives heads ``[B, N]``. The sibling scores are shared scores: they score every
    tree (``log_prob``, entropy, KL and gradients count them) and ``sibling_marginals``
    ``[B, N+1, N+1, N+1]`` gives their expected use. ``lengths[b]`` in ``1..N`` (or SuPar's
    ``mask [B, N+1]``: column 0 the root, ignored, then True at the words);
    ``single_root=True`` lets the root take exactly one child.
    """

    shape = "B, N, N"
    potentials = "arc"

    def __init__(self, log_potentials: Tensor, siblings: Tensor, lengths: Tensor | None = None,
                 single_root: bool = False, *, mask: Tensor | None = None):
        check_shape("log_potentials", log_potentials, self.shape)
        check_shape("siblings", siblings, "B, N, N, N")
        if siblings.shape[:2] != log_potentials.shape[:2]:
            B, n1 = log_potentials.shape[:2]
            raise ValueError(f"siblings: expected shape [B, N+1, N+1, N+1] = [{B}, {n1}, {n1}, {n1}], got {list(siblings.shape)}")
        self.single_root = single_root
        self.program = _SINGLE if single_root else _MULTI  # (an attribute: read several times a query)
        super().__init__(log_potentials, lengths, {"sib": siblings}, mask=mask)

    @classmethod
    @takes_validate_args
    def from_supar(cls, scores: tuple[Tensor, Tensor], lengths: Tensor | None = None, multiroot: bool = False, *,
                   mask: Tensor | None = None) -> "SecondOrderDependencyCRF":
        """The distribution of SuPar's ``Dependency2oCRF((arcs, sibs), lens, multiroot)``: ``arcs
        [B, N+1, N+1]`` are ``[b, dependent, head]`` and ``sibs [B, N+1, N+1, N+1]`` are
        ``[b, modifier, head, sibling]``; ours are ``arcs.transpose(1, 2)`` and
        ``sibs.permute(0, 2, 3, 1)`` (SuPar's to ours). The root takes one child unless ``multiroot``."""
        if not isinstance(scores, (tuple, list)) or len(scores) != 2:
            raise ValueError(f"scores: expected SuPar's pair (arcs [B, N+1, N+1], sibs [B, N+1, N+1, N+1]), got {type(scores).__name__}")
        arcs, sibs = scores
        check_shape("arcs", arcs, "B, N, N")
        check_shape("sibs", sibs, "B, N, N, N")
        return cls(arcs.transpose(1, 2), sibs.permute(0, 2, 3, 1), lengths, single_root=not multiroot, mask=mask)

    def shared_counts(self, parts: Tensor) -> dict[str, Tensor]:
        """The sibling parts ``[..., B, N+1, N+1, N+1]`` of trees given as one-hot arcs."""
        return {"sib": adjacent_siblings(parts)}

    @property
    def sibling_marginals(self) -> Tensor:
        """``[B, N+1, N+1, N+1]``: p(``s`` and ``m`` are adjacent modifiers of ``h``, ``s`` the closer)."""
        return self.shared_marginals["sib"]
