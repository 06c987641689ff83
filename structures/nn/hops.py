"""Attention over facts in K hops (Kim et al. 2017, §4.3 and appendix A.4).

Both layers read the facts through one input and one output embedding per hop and return the
context ``c = Σ_k Σ_i w_{k,i} o^k_i`` with the weights ``w [B, K, F]`` they chose:

- :class:`MemoryHopAttention`: the End-To-End Memory Network's greedy hops (Sukhbaatar et al.
  2015): ``w_k = softmax_i(x^k_i · q^k)`` with ``q^{k+1} = q^k + Σ_i w_{k,i} o^k_i``, so that
  ``q + c`` is MemN2N's last query ``q^K + c^K``;
- :class:`HopAttention`: the hop chain CRF of §4.3, ``w_{k,i} = p(z_k = i)`` under a K-step chain
  over the F facts (:class:`structures.HopChainCRF`), with unary potentials
  ``θ_k(i) = x^k_i · q^k`` or pairwise ones
  ``θ_{k,k+1}(i, j) = x^k_i · q^k + x^k_i · x^{k+1}_j + x^{k+1}_j · q^{k+1}``; the queries ``q^k``
  of every hop are given (the paper uses ``q^{k+1} = Q q^k``).

Shapes (batch first): ``inputs [B, K, F, D]`` (``x^k_i``), ``outputs [B, K, F, D]`` (``o^k_i``),
``lengths [B]`` in ``1..F`` (facts ``>= lengths[b]`` are padding: their weight is exactly 0), or
``mask [B, F]`` instead (bool, True at the real facts, a prefix of each row).
``forward`` returns ``AttentionOutput(context [B, D], attention [B, K, F], distribution)``.

*Linear start* (Sukhbaatar et al. 2015, §4.2; Kim et al. A.4): with ``linear = True`` MemN2N's
weights are the raw scores (no softmax) and the CRF's query scores ``x^k_i · q^k`` enter the
potentials as they are; with ``linear = False`` (the default, set it after the first epochs) the
softmax is in place and the CRF's query scores are normalized by ``log_softmax`` over the facts
of each hop, which keeps the potentials on the scale of log-probabilities.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..hops import HopChainCRF
from .attention import _shape, check_lengths, position_mask, zero_padding
from .output import AttentionOutput


def _check_facts(inputs: Tensor, outputs: Tensor, lengths: Tensor | None,
                 mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """Validate ``inputs``/``outputs [B, K, F, D]``: (both with their padded facts 0, ``lengths`` as
    a long tensor or None)."""
    if not isinstance(inputs, Tensor) or inputs.dim() != 4 or 0 in inputs.shape[1:3]:
        raise ValueError(f"inputs: expected shape [B, K, F, D] with K, F >= 1, got {_shape(inputs)}")
    if not isinstance(outputs, Tensor) or outputs.shape != inputs.shape:
        raise ValueError(f"outputs: expected shape [B, K, F, D] = {list(inputs.shape)}, got {_shape(outputs)}")
    B, _, F, _ = inputs.shape
    lengths = check_lengths(lengths, B, 1, F, inputs.device, mask)
    return zero_padding(inputs, lengths, 2), zero_padding(outputs, lengths, 2), lengths


def _masked_log_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """log_softmax over the last dim of ``scores [..., F]`` among the True entries of ``mask``; -inf elsewhere."""
    return torch.log_softmax(scores.masked_fill(~mask, float("-inf")), -1)


class MemoryHopAttention(nn.Module):
    """MemN2N's K greedy hops over the facts (the baseline of Kim et al. 2017, §4.3).

    ``forward(inputs [B, K, F, D], outputs [B, K, F, D], query [B, D], lengths [B])``: hop ``k``
    attends with ``w_k = softmax_i(x^k_i · q^k)`` (the raw scores while :attr:`linear`), adds
    ``c^k = Σ_i w_{k,i} o^k_i`` to the query, and the returned context is ``Σ_k c^k`` (so
    ``query + context`` is MemN2N's ``q^K + c^K``). ``attention`` is ``w [B, K, F]``; the selected
    facts are ``attention.argmax(-1)``. No parameters: the embeddings are the model's.
    """

    def __init__(self, linear: bool = False):
        super().__init__()
        self.linear = linear

    def forward(self, inputs: Tensor, outputs: Tensor, query: Tensor, lengths: Tensor | None = None, *,
                mask: Tensor | None = None) -> AttentionOutput:
        inputs, outputs, lengths = _check_facts(inputs, outputs, lengths, mask)
        B, K, F, D = inputs.shape
        if not isinstance(query, Tensor) or query.shape != (B, D):
            raise ValueError(f"query: expected shape [B, D] = [{B}, {D}], got {_shape(query)}")
        mask = position_mask(lengths, B, F, inputs.device)
        low = torch.finfo(inputs.dtype).min
        u, weights = query, []
        for k in range(K):
            scores = (inputs[:, k] @ u.unsqueeze(-1)).squeeze(-1)  # [B, F]
            w = scores * mask if self.linear else torch.softmax(scores.masked_fill(~mask, low), -1) * mask
            u = u + (w.unsqueeze(1) @ outputs[:, k]).squeeze(1)
            weights.append(w)
        return AttentionOutput(u - query, torch.stack(weights, 1), None)


class HopAttention(nn.Module):
    """Structured attention over K hops: a K-step, F-state chain CRF over the facts (Kim et al.
    2017, §4.3, A.4), built as :class:`structures.HopChainCRF`.

    ``kind="unary"``: potentials ``θ_k(i) = s_k(i)``, independent hops.
    ``kind="binary"``: ``θ_{k,k+1}(i, j) = s_k(i) + x^k_i · x^{k+1}_j + s_{k+1}(j)`` for
    ``k = 1..K-1`` (the paper's pairwise potentials; hop 1 has no potential of its own), and by
    default (``no_repeat=None`` → True for binary, False for unary) ``θ_{k,k+1}(i, i) = -inf``.
    Here ``s_k(i) = x^k_i · q^k``, normalized by log_softmax over the facts unless :attr:`linear`.

    ``forward(inputs [B, K, F, D], outputs [B, K, F, D], queries [B, K, D], lengths [B])`` returns
    ``context [B, D] = Σ_k Σ_i p(z_k = i) o^k_i``, ``attention = p(z_k = i) [B, K, F]`` and the
    :class:`~structures.HopChainCRF` (``decode()`` gives the best fact sequence ``[B, K]``).
    With ``no_repeat`` and ``K >= 2`` each example needs at least 2 facts.
    """

    def __init__(self, kind: str = "binary", no_repeat: bool | None = None, linear: bool = False):
        super().__init__()
        if kind not in ("unary", "binary"):
            raise ValueError(f"kind: expected 'unary' or 'binary', got {kind!r}")
        self.kind = kind
        self.no_repeat = kind == "binary" if no_repeat is None else no_repeat
        self.linear = linear

    def forward(self, inputs: Tensor, outputs: Tensor, queries: Tensor, lengths: Tensor | None = None, *,
                mask: Tensor | None = None) -> AttentionOutput:
        inputs, outputs, lengths = _check_facts(inputs, outputs, lengths, mask)
        B, K, F, D = inputs.shape
        if not isinstance(queries, Tensor) or queries.shape != (B, K, D):
            raise ValueError(f"queries: expected shape [B, K, D] = [{B}, {K}, {D}], got {_shape(queries)}")
        if self.kind == "binary" and K < 2:
            raise ValueError(f"inputs: the binary hop chain needs K >= 2 hops, got shape {list(inputs.shape)}")
        if self.no_repeat and K > 1 and (F < 2 or (lengths is not None and lengths.min() < 2)):
            raise ValueError("lengths: no_repeat needs at least 2 facts in every example")
        mask = position_mask(lengths, B, F, inputs.device)
        scores = (inputs @ queries.unsqueeze(-1)).squeeze(-1)  # [B, K, F]
        if not self.linear:
            # padded facts get 0 here (finite, so no NaN gradients); the structure forbids them
            scores = _masked_log_softmax(scores, mask.unsqueeze(1)).masked_fill(~mask.unsqueeze(1), 0.0)
        if self.kind == "unary":
            crf = HopChainCRF.unary(scores, mask, self.no_repeat)
        else:
            between = inputs[:, :-1] @ inputs[:, 1:].transpose(-1, -2)  # [B, K-1, F, F]: x^k_i · x^{k+1}_j
            pairwise = scores[:, :-1, :, None] + between + scores[:, 1:, None, :]
            crf = HopChainCRF.binary(scores.new_zeros(B, F), pairwise, mask, self.no_repeat)
        marginals = crf.hop_marginals  # [B, K, F], exactly 0 at padded facts
        context = (marginals.unsqueeze(-2) @ outputs).squeeze(-2).sum(1)
        return AttentionOutput(context, marginals, crf)
