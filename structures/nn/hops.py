"""Attention over facts in K hops (Kim et al. 2017, §4.3 and appendix A.4).

Both layers read the facts through one input and one output embedding per hop and return the
context ``c = Σ_k Σ_i w_{k,i} o^k_i`` with the weights ``w [B, K, F]`` they chose:

- :class:`MemoryHopAttention`: the End-To-End Memory Network's greedy hops (Sukhbaatar et al.
  2015): ``w_k = softmax_i(x^k_i · q^k)`` with ``q^{k+1} = q^k + Σ_i w_{k,i} o^k_i``, so that
  ``q + c`` is MemN2N's last query ``q^K + c^K``;
- :class:`HopAttention`: the hop chain CRF of §4.3, ``w_{k,i} = p(z_k = i)`` under a K-step chain
  over the F facts (:class:`structures.HopChainCRF`), with unary potentials
  ``θ_k(i) = x^k_i · q^k`` or pairwise ones
  ``θ_{k,k+1}(i, j) = x^k_i · q^k + l_k(i, j) + x^{k+1}_j · q^{k+1}`` whose link term is A.4's
  ``l_k(i, j) = x^k_i · x^{k+1}_j`` (``link="inputs"``), ``o^k_i · x^{k+1}_j`` (``link="outputs"``,
  the product MemN2N's next hop takes) or their sum (``link="both"``); the queries ``q^k`` of every hop are given (the paper uses
  ``q^{k+1} = Q q^k``).

Shapes (batch first): ``inputs [B, K, F, D]`` (``x^k_i``), ``outputs [B, K, F, D]`` (``o^k_i``),
``lengths [B]`` in ``1..F`` (facts ``>= lengths[b]`` are padding: their weight is exactly 0), or
``mask [B, F]`` instead (bool, True at the real facts, a prefix of each row).
``forward`` returns ``AttentionOutput(context [B, D], attention [B, K, F], distribution)``.

*Linear start* (Sukhbaatar et al. 2015, §4.2; Kim et al. A.4): with ``linear = True`` MemN2N's
weights are the raw scores (no softmax). A.4's linear start for the CRFs (the query scores enter
the potentials without their ``log_softmax``) changes nothing, since a chain CRF's distribution
ignores a constant added to every fact of a hop; so with ``linear = True`` :class:`HopAttention`
instead takes its hops greedily and linearly, as MemN2N does then: ``w_1 = s_1``,
``w_{k+1}(j) = s_{k+1}(j) + Σ_i w_k(i) l_k(i, j)`` (binary; ``l_k`` the link term of the pairwise
potential, 0 on forbidden repeats) or ``w_k = s_k`` (unary), with the raw ``s_k(i) = x^k_i · q^k``;
no structure is built (``distribution`` is None). With ``linear = False`` (the default, set it
after the first epochs) the weights are the CRF's marginals and the query scores are normalized
by ``log_softmax`` over the facts of each hop.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..hops import HopChainCRF
from .attention import _shape, check_lengths, position_mask, zero_padding
from .output import AttentionOutput


LINKS = ("inputs", "outputs", "both")


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


def _linear_weights(scores: Tensor, links: Tensor | None, no_repeat: bool) -> Tensor:
    """The linear start's hop weights ``[B, K, F]`` from raw query scores ``scores [B, K, F]`` (0 at
    padded facts) and, for the binary chain, links ``[B, K-1, F, F]``: ``w_1 = s_1`` and
    ``w_{k+1}(j) = s_{k+1}(j) + Σ_i w_k(i) l_k(i, j)`` (``l_k(i, i)`` left out under ``no_repeat``);
    without links ``w_k = s_k``."""
    if links is None:
        return scores
    if no_repeat:
        links = links * (1 - torch.eye(links.shape[-1], dtype=links.dtype, device=links.device))
    weights = [scores[:, 0]]
    for k in range(links.shape[1]):
        weights.append(scores[:, k + 1] + (weights[-1].unsqueeze(-2) @ links[:, k]).squeeze(-2))
    return torch.stack(weights, 1)


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
    ``kind="binary"``: ``θ_{k,k+1}(i, j) = s_k(i) + l_k(i, j) + s_{k+1}(j)`` for ``k = 1..K-1``
    (the paper's pairwise potentials; hop 1 has no potential of its own), and by default
    (``no_repeat=None`` → True for binary, False for unary) ``θ_{k,k+1}(i, i) = -inf``. Here
    ``s_k(i) = x^k_i · q^k``, normalized by log_softmax over the facts unless :attr:`linear`, and
    the link ``l_k(i, j)`` is ``x^k_i · x^{k+1}_j`` (``link="inputs"``, A.4 as printed) or
    ``o^k_i · x^{k+1}_j`` (``link="outputs"``: under adjacent weight tying ``o^k`` and ``x^{k+1}``
    share one embedding, so a fact is most similar to itself and its kin from the start, as in
    MemN2N's ``x^{k+1}_j · (q^k + o^k)``) or ``(x^k_i + o^k_i) · x^{k+1}_j`` (``link="both"``).

    ``forward(inputs [B, K, F, D], outputs [B, K, F, D], queries [B, K, D], lengths [B])`` returns
    ``context [B, D] = Σ_k Σ_i p(z_k = i) o^k_i``, ``attention = p(z_k = i) [B, K, F]`` and the
    :class:`~structures.HopChainCRF` (``decode()`` gives the best fact sequence ``[B, K]``); while
    :attr:`linear`, the linear start's weights (module docstring) and no distribution.
    With ``no_repeat`` and ``K >= 2`` each example needs at least 2 facts.
    """

    def __init__(self, kind: str = "binary", no_repeat: bool | None = None, linear: bool = False, link: str = "inputs"):
        super().__init__()
        if kind not in ("unary", "binary"):
            raise ValueError(f"kind: expected 'unary' or 'binary', got {kind!r}")
        if link not in LINKS:
            raise ValueError(f"link: expected one of {LINKS}, got {link!r}")
        self.kind, self.link = kind, link
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
        links = None
        if self.kind == "binary":
            source = {"inputs": inputs, "outputs": outputs, "both": inputs + outputs}[self.link]
            links = source[:, :-1] @ inputs[:, 1:].transpose(-1, -2)  # [B, K-1, F, F]: l_k(i, j)
        if self.linear:
            weights = _linear_weights(scores * mask.unsqueeze(1), links, self.no_repeat)
            return AttentionOutput((weights.unsqueeze(-2) @ outputs).squeeze(-2).sum(1), weights, None)
        # padded facts get 0 here (finite, so no NaN gradients); the structure forbids them
        scores = _masked_log_softmax(scores, mask.unsqueeze(1)).masked_fill(~mask.unsqueeze(1), 0.0)
        if links is None:
            crf = HopChainCRF.unary(scores, mask, self.no_repeat)
        else:
            pairwise = scores[:, :-1, :, None] + links + scores[:, 1:, None, :]
            crf = HopChainCRF.binary(scores.new_zeros(B, F), pairwise, mask, self.no_repeat)
        marginals = crf.hop_marginals  # [B, K, F], exactly 0 at padded facts
        context = (marginals.unsqueeze(-2) @ outputs).squeeze(-2).sum(1)
        return AttentionOutput(context, marginals, crf)
