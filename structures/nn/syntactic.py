"""Syntactic attention (Kim et al. 2017, §3.2 and appendix A.1): every word attends to its soft parent.

The sequence's first position is the root symbol (``$`` in the paper), as in the paper's
inside-outside algorithm; positions ``1..n-1`` are the words. Arc scores come from an MLP over
encoder states ``h`` (e.g. a bidirectional LSTM's),

    θ_ij = tanh(sᵀ tanh(W1 h_i + W2 h_j + b))        (i the parent of j)

and a projective dependency CRF (:class:`structures.ProjectiveDependencyCRF`, Eisner's algorithm)
turns them into arc marginals ``p(z_ij = 1)``. Word ``j``'s context is its expected parent
``Σ_i p(z_ij = 1) x_i`` (and optionally its expected children ``Σ_k p(z_jk = 1) x_k``) over values
``x`` (the paper averages the symbol embeddings, not the LSTM states).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..projective import ProjectiveDependencyCRF
from .attention import check_lengths, position_mask, zero_padding
from .output import AttentionOutput


class SyntacticAttention(nn.Module):
    """Soft-parent self-attention over a sequence whose position 0 is the root symbol.

    ``forward(states [B, N, D], values [B, N, V] = states, lengths [B] in 2..N)`` (or ``mask [B, N]``
    instead of ``lengths``, as SuPar's: bool over the positions, the root's entry at 0 ignored, then
    True at the real words, a prefix; the lengths are ``1 + mask[:, 1:].sum(-1)``) returns
    ``AttentionOutput(context, attention, distribution)``:

    - ``attention [B, N, N]``: ``attention[b, i, j] = p(z_ij = 1)``, the probability that position
      ``i`` is the parent of position ``j`` (the root, 0, is nobody's child: column 0 is 0; so is
      every row and column at a padded position ``>= lengths[b]``). Each word's column sums to 1.
    - ``context [B, N, V]``: ``context[b, j] = Σ_i attention[b, i, j] values[b, i]`` (0 for the
      root and for padded positions); with ``children=True``, ``[B, N, 2V]``: the soft parent
      followed by the soft children ``Σ_k attention[b, j, k] values[b, k]``.
    - ``distribution``: the :class:`~structures.ProjectiveDependencyCRF` over the ``lengths - 1``
      words (its index 0 is the root symbol, i.e. position 0), so ``distribution.decode()`` gives
      each word's head as a position ``[B, N-1]``. ``None`` when ``structured=False``.

    ``structured=False`` is the paper's simple (non-structured) attention with the same scores:
    ``p(z_ij = 1) = softmax_i(θ_ij)`` over the candidate parents ``i ≠ j`` of each word.
    ``single_root=True`` lets the root take exactly one child (default: any number).
    ``bounded=False`` drops the outer ``tanh`` (scores unbounded instead of in ``[-1, 1]``).
    """

    def __init__(self, state_dim: int, hidden_dim: int, structured: bool = True, single_root: bool = False,
                 children: bool = False, bounded: bool = True):
        super().__init__()
        self.parent_proj = nn.Linear(state_dim, hidden_dim, bias=False)  # W1 (the parent i)
        self.child_proj = nn.Linear(state_dim, hidden_dim)  # W2 and b (the child j)
        self.score = nn.Linear(hidden_dim, 1, bias=False)  # s
        self.structured = structured
        self.single_root = single_root
        self.with_children = children
        self.bounded = bounded

    def arc_scores(self, states: Tensor) -> Tensor:
        """``[B, N, N]``: ``θ[b, i, j]`` scores position ``i`` as the parent of position ``j``."""
        hidden = torch.tanh(self.parent_proj(states).unsqueeze(2) + self.child_proj(states).unsqueeze(1))
        theta = self.score(hidden).squeeze(-1)
        return torch.tanh(theta) if self.bounded else theta

    def forward(self, states: Tensor, values: Tensor | None = None, lengths: Tensor | None = None, *,
                mask: Tensor | None = None) -> AttentionOutput:
        states, values, lengths = self._check(states, values, lengths, mask)
        B, N = states.shape[:2]
        theta = self.arc_scores(states)
        if self.structured:
            distribution = ProjectiveDependencyCRF(theta, None if lengths is None else lengths - 1, self.single_root)
            attention = distribution.marginals
        else:
            distribution = None
            attention = self._softmax_parents(theta, lengths)
        context = attention.transpose(-1, -2) @ values  # soft parents
        if self.with_children:
            context = torch.cat([context, attention @ values], -1)
        return AttentionOutput(context, attention, distribution)

    @staticmethod
    def _softmax_parents(theta: Tensor, lengths: Tensor | None) -> Tensor:
        """``[B, N, N]``: softmax over the candidate parents ``i ≠ j`` of each word ``j`` (column)."""
        B, N = theta.shape[:2]
        real = position_mask(lengths, B, N, theta.device)
        eye = torch.eye(N, dtype=torch.bool, device=theta.device)
        word = real.clone()
        word[:, 0] = False  # the root has no parent
        allowed = real.unsqueeze(2) & word.unsqueeze(1) & ~eye
        low = torch.finfo(theta.dtype).min  # not -inf: an empty column would give NaN gradients
        return torch.softmax(theta.masked_fill(~allowed, low), 1) * allowed

    def _check(self, states: Tensor, values: Tensor | None, lengths: Tensor | None, mask: Tensor | None = None):
        D = self.parent_proj.in_features
        if not isinstance(states, Tensor) or states.dim() != 3 or states.shape[-1] != D:
            got = list(states.shape) if isinstance(states, Tensor) else type(states).__name__
            raise ValueError(f"states: expected shape [B, N, D] = [B, N, {D}], got {got}")
        B, N = states.shape[:2]
        if N < 2:
            raise ValueError(f"states: expected N >= 2 positions (the root symbol and at least one word), got {N}")
        if values is None:
            values = states
        elif not isinstance(values, Tensor) or values.dim() != 3 or values.shape[:2] != (B, N):
            got = list(values.shape) if isinstance(values, Tensor) else type(values).__name__
            raise ValueError(f"values: expected shape [B, N, V] = [{B}, {N}, V], got {got}")
        lengths = check_lengths(lengths, B, 2, N, states.device, mask, root=True)
        return zero_padding(states, lengths), zero_padding(values, lengths), lengths
