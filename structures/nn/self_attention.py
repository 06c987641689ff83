"""Structured self-attention over non-projective dependency trees (Liu & Lapata 2018, §3.2;
Bisk & Tran 2018, §4.1 and §4.3).

Every word attends to its soft parent and its soft children, the arc marginals of a
non-projective dependency CRF over the words (the matrix-tree theorem,
:class:`structures.NonProjectiveDependencyCRF`, single root by default). The arc scores come from
the words' structure vectors ``d`` (``states``), in one of the papers' two forms:

- ``scores="bilinear"`` (Liu & Lapata, eqs. 8-11): ``t_p = tanh(W_p d_i)``, ``t_c = tanh(W_c d_j)``,
  ``f_ij = t_pᵀ W_a t_c`` (word i the parent of word j) and the root scores ``f_j^r = W_r d_j``;
- ``scores="dot"`` (Bisk & Tran, eqs. 5-7): ``φ_ij = (W_q s_i)ᵀ (W_k s_j) / √d``, whose diagonal
  ``φ_jj`` is the root score of word j.

With ``a_ij = p(z_ij = 1)`` and ``a_j^r = p(root → j)`` (Liu & Lapata, eqs. 15-17, with the root
embedding ``e_root`` for the word whose parent is the root):

    p_j = Σ_i a_ij e_i + a_j^r e_root         (parent context)
    c_i = Σ_k a_ik e_k                         (children context)
    r_i = tanh(W_r [e_i; p_i; c_i])            (eq. 18, ``output="update"``)

over the words' semantic vectors ``e`` (``values``). ``hard=True`` is the straight-through
estimator of Bisk & Tran §4.3, with the maximum spanning tree as the hard structure: the forward
pass uses the one-hot arcs of the best tree (Chu-Liu-Edmonds, ``distribution.argmax``), the
backward pass is that of the marginals.

``structure="projective"`` puts the attention over projective trees instead
(:class:`structures.ProjectiveDependencyCRF`, Eisner's inside-outside), the syntactic attention
of Kim et al. 2017 (§3.3); everything else is the same.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..spanning import NonProjectiveDependencyCRF
from ..projective import ProjectiveDependencyCRF
from .attention import check_lengths, position_mask, zero_padding
from .output import AttentionOutput

SCORES = ("bilinear", "dot")
OUTPUTS = ("parent", "parent_children", "update")
STRUCTURES = {"nonprojective": NonProjectiveDependencyCRF, "projective": ProjectiveDependencyCRF}


class StructuredSelfAttention(nn.Module):
    """Matrix-tree self-attention over the ``N`` words of each sequence (no root position in the input).

    ``StructuredSelfAttention(state_dim, value_dim=None, scores="bilinear", output="parent_children",
    single_root=True, hard=False, structure="nonprojective")``; ``value_dim`` defaults to
    ``state_dim``; ``structure="projective"``: projective trees (Eisner).

    ``forward(states [B, N, D], values [B, N, V] = states, lengths [B] in 1..N)`` (or ``mask [B, N]``
    instead of ``lengths``: bool, True at the real words, a prefix of each row; the input has no
    root position, so neither has the mask) returns
    ``AttentionOutput(context, attention, distribution)``:

    - ``attention [B, N+1, N+1]``: the arc marginals in the structure's convention,
      ``attention[b, h, m] = p(h is the head of m)`` with index 0 the root and words ``1..N``
      (row 0 holds the root marginals ``a^r``; column 0 and the diagonal are 0; so is every row and
      column of a padded word). Each real word's column sums to 1. With ``hard=True`` the one-hot
      arcs of the best tree (gradients: those of the marginals).
    - ``context``: per ``output``, ``"parent"``: ``p [B, N, V]``; ``"parent_children"``:
      ``[p; c] [B, N, 2V]``; ``"update"``: ``r [B, N, V]`` (eq. 18). 0 at padded words.
    - ``distribution``: the :class:`~structures.NonProjectiveDependencyCRF` (or, projective,
      :class:`~structures.ProjectiveDependencyCRF`) over the words, built from :meth:`arc_scores`;
      ``distribution.decode()`` gives the heads ``[B, N]`` (0 = root).
    """

    def __init__(self, state_dim: int, value_dim: int | None = None, scores: str = "bilinear",
                 output: str = "parent_children", single_root: bool = True, hard: bool = False,
                 structure: str = "nonprojective"):
        super().__init__()
        if scores not in SCORES:
            raise ValueError(f"scores: expected one of {SCORES}, got {scores!r}")
        if structure not in STRUCTURES:
            raise ValueError(f"structure: expected one of {tuple(STRUCTURES)}, got {structure!r}")
        self.structure = STRUCTURES[structure]
        if output not in OUTPUTS:
            raise ValueError(f"output: expected one of {OUTPUTS}, got {output!r}")
        value_dim = state_dim if value_dim is None else value_dim
        self.state_dim, self.value_dim = state_dim, value_dim
        self.scores, self.output, self.single_root, self.hard = scores, output, single_root, hard
        if scores == "bilinear":
            self.parent_proj = nn.Linear(state_dim, state_dim, bias=False)  # W_p
            self.child_proj = nn.Linear(state_dim, state_dim, bias=False)  # W_c
            self.bilinear = nn.Parameter(torch.empty(state_dim, state_dim))  # W_a
            nn.init.xavier_uniform_(self.bilinear)
            self.root_score = nn.Linear(state_dim, 1, bias=False)  # W_r of eq. 11
        else:
            self.query = nn.Linear(state_dim, state_dim, bias=False)  # W_q
            self.key = nn.Linear(state_dim, state_dim, bias=False)  # W_k
        self.root_embedding = nn.Parameter(torch.randn(value_dim) / math.sqrt(value_dim))  # e_root
        if output == "update":
            self.update = nn.Linear(3 * value_dim, value_dim, bias=False)  # W_r of eq. 18

    def arc_scores(self, states: Tensor) -> Tensor:
        """``[B, N+1, N+1]`` log-potentials: ``[b, h, m]`` scores word ``h`` (0: the root) as the head
        of word ``m``; column 0 and the diagonal (never used by the structure) are 0."""
        if self.scores == "bilinear":
            parents = torch.tanh(self.parent_proj(states))
            children = torch.tanh(self.child_proj(states))
            words = parents @ self.bilinear @ children.transpose(-1, -2)
            root = self.root_score(states).squeeze(-1)
        else:
            phi = self.query(states) @ self.key(states).transpose(-1, -2) / math.sqrt(self.state_dim)
            root = phi.diagonal(dim1=-2, dim2=-1)
            words = phi * (1 - torch.eye(phi.shape[-1], dtype=phi.dtype, device=phi.device))
        theta = torch.cat([root.unsqueeze(1), words], 1)  # [B, N+1, N]
        return nn.functional.pad(theta, (1, 0))

    def forward(self, states: Tensor, values: Tensor | None = None, lengths: Tensor | None = None, *,
                mask: Tensor | None = None) -> AttentionOutput:
        states, values, lengths = self._check(states, values, lengths, mask)
        distribution = self.structure(self.arc_scores(states), lengths, self.single_root)
        attention = distribution.marginals
        if self.hard:
            # exact one-hot arcs forward (x - x is exactly 0), the marginals' gradient backward
            attention = distribution.argmax + (attention - attention.detach())
        return AttentionOutput(self.read(attention, values, lengths), attention, distribution)

    def read(self, attention: Tensor, values: Tensor, lengths: Tensor | None = None) -> Tensor:
        """The context ``[B, N, V]`` (``[B, N, 2V]`` for ``"parent_children"``; eqs. 16-18) that arc
        weights ``attention [B, N+1, N+1]`` give over ``values [B, N, V]``: ``forward``'s convention,
        its tree marginals or any other head weights (e.g. a flat softmax's), 0 in the rows and
        columns of padded words (beyond ``lengths``)."""
        B, N = values.shape[:2]
        with_root = torch.cat([self.root_embedding.to(values.dtype).expand(B, 1, -1), values], 1)
        parent = attention[:, :, 1:].transpose(-1, -2) @ with_root  # eq. 16
        if self.output == "parent":
            return parent
        children = attention[:, 1:, 1:] @ values  # eq. 17
        if self.output == "parent_children":
            return torch.cat([parent, children], -1)
        real = position_mask(lengths, B, N, values.device).unsqueeze(-1)
        return torch.tanh(self.update(torch.cat([values, parent, children], -1))) * real  # eq. 18

    def _check(self, states: Tensor, values: Tensor | None, lengths: Tensor | None, mask: Tensor | None = None):
        D = self.state_dim
        if not isinstance(states, Tensor) or states.dim() != 3 or states.shape[-1] != D or states.shape[1] < 1:
            got = list(states.shape) if isinstance(states, Tensor) else type(states).__name__
            raise ValueError(f"states: expected shape [B, N, D] = [B, N >= 1, {D}], got {got}")
        B, N = states.shape[:2]
        if values is None:
            values = states
        if not isinstance(values, Tensor) or values.dim() != 3 or values.shape != (B, N, self.value_dim):
            got = list(values.shape) if isinstance(values, Tensor) else type(values).__name__
            raise ValueError(f"values: expected shape [B, N, V] = [{B}, {N}, {self.value_dim}], got {got}")
        lengths = check_lengths(lengths, B, 1, N, states.device, mask)
        return zero_padding(states, lengths), zero_padding(values, lengths), lengths
