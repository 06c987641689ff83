"""Gated syntactic context (Bisk & Tran 2018, §4.2): the decoder's attention over the source words,
reused over their syntactic annotations, gated by the decoder state.

At decoder step ``t``, with the standard attention weights ``α_t`` over the source (those that
built the content context ``c_t``), the syntactic annotations ``M`` (each source word's soft
head, e.g. the parent contexts of :class:`~structures.nn.StructuredSelfAttention`) and the decoder
state ``h_t``:

    d_t = M α_tᵀ                 (eq. 10: the same weights, over the annotations)
    d̂_t = d_t ⊙ σ(W_g h_t)       (eq. 11: how much syntax this step uses)

``shared=False`` is the paper's alternative with its own attention over the annotations
(eqs. 13-14): ``γ_t = softmax(h_tᵀ W_m M)``, ``d_t = M γ_tᵀ``, gated the same way.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .attention import _shape, check_lengths, position_mask, zero_padding
from .output import AttentionOutput


class GatedSyntacticContext(nn.Module):
    """``GatedSyntacticContext(state_dim, annotation_dim, shared=True)``.

    ``forward(state, annotations, weights=None, lengths=None, *, mask=None)``:

    - ``state``: the decoder state ``h``, ``[B, H]`` or ``[B, T, H]`` (``T`` decoder steps);
    - ``annotations``: ``M [B, N, A]``, one vector per source word;
    - ``weights``: the decoder's attention weights over the source, ``[B, N]`` or ``[B, T, N]``
      (the shape of ``state`` with ``N`` for ``H``); required when ``shared``, not accepted otherwise;
    - ``lengths``: ``[B]`` in ``1..N``, the number of source words (padded words get weight 0);
      or ``mask [B, N]`` (bool, True at the real words, a prefix of each row).

    Returns ``AttentionOutput(context, attention, None)``: ``context`` the gated syntactic vector
    ``d̂ [B, (T,) A]``, ``attention`` the weights it was built from ``[B, (T,) N]`` (``α`` as
    given, or ``γ``; 0 at padded words); no structure of its own (the annotations' structure is
    the self-attention's ``distribution``).
    """

    def __init__(self, state_dim: int, annotation_dim: int, shared: bool = True):
        super().__init__()
        self.state_dim, self.annotation_dim, self.shared = state_dim, annotation_dim, shared
        self.gate = nn.Linear(state_dim, annotation_dim, bias=False)  # W_g
        if not shared:
            self.bilinear = nn.Linear(annotation_dim, state_dim, bias=False)  # W_m

    def forward(self, state: Tensor, annotations: Tensor, weights: Tensor | None = None,
                lengths: Tensor | None = None, *, mask: Tensor | None = None) -> AttentionOutput:
        state, annotations, weights, lengths, single = self._check(state, annotations, weights, lengths, mask)
        B, N = annotations.shape[:2]
        real = position_mask(lengths, B, N, annotations.device).unsqueeze(1)  # [B, 1, N]
        if self.shared:
            weights = weights * real
        else:
            scores = state @ self.bilinear(annotations).transpose(-1, -2)  # h_tᵀ W_m M: [B, T, N]
            weights = torch.softmax(scores.masked_fill(~real, torch.finfo(scores.dtype).min), -1) * real
        context = (weights @ annotations) * torch.sigmoid(self.gate(state))
        if single:
            return AttentionOutput(context.squeeze(1), weights.squeeze(1), None)
        return AttentionOutput(context, weights, None)

    def _check(self, state, annotations, weights, lengths, mask=None):
        H, A = self.state_dim, self.annotation_dim
        if not isinstance(annotations, Tensor) or annotations.dim() != 3 or annotations.shape[-1] != A or annotations.shape[1] < 1:
            raise ValueError(f"annotations: expected shape [B, N, A] = [B, N >= 1, {A}], got {_shape(annotations)}")
        B, N = annotations.shape[:2]
        if not isinstance(state, Tensor) or state.dim() not in (2, 3) or state.shape[0] != B or state.shape[-1] != H:
            raise ValueError(f"state: expected shape [B, H] or [B, T, H] = [{B}, ..., {H}], got {_shape(state)}")
        single = state.dim() == 2
        if single:
            state = state.unsqueeze(1)
        if self.shared:
            expected = (B, N) if single else (B, state.shape[1], N)
            if not isinstance(weights, Tensor) or weights.shape != expected:
                raise ValueError(f"weights: expected the decoder's attention weights of shape {list(expected)}, got {_shape(weights)}")
            if single:
                weights = weights.unsqueeze(1)
        elif weights is not None:
            raise ValueError("weights: not accepted with shared=False (the layer computes its own attention)")
        lengths = check_lengths(lengths, B, 1, N, annotations.device, mask)
        weights = None if weights is None else zero_padding(weights, lengths, 2)
        return state, zero_padding(annotations, lengths), weights, lengths, single

