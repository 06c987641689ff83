"""Query attention over a memory: softmax, sigmoid and segmentation attention (Kim et al. 2017).

Every layer scores memory position ``i`` against a query with a bilinear map, ``θ_i = h_i W q``
(Kim et al. 2017, §4.2 and appendix A.3), and differs only in how the scores become weights:

- :class:`SoftmaxAttention`: ``softmax(θ)`` — one position is selected (categorical ``z``);
- :class:`SigmoidAttention`: ``sigmoid(θ_i)`` — each position independently (Bernoulli ``z_i``);
- :class:`SegmentationAttention`: ``p(z_i = 1)`` under a 2-state linear-chain CRF over the
  positions, unary ``θ_i(1) = θ_i``, ``θ_i(0) = 0`` and 4 pairwise scores ``b`` (§3.1), so that
  contiguous segments are selected together.

Shapes (batch first): ``memory [B, N, D]``; ``query [B, Q]`` (one query per example) or
``[B, T, Q]`` (``T`` queries, e.g. every decoder step); ``lengths [B]`` in ``1..N`` (positions
``>= lengths[b]`` are padding: their weight is exactly 0), or ``mask [B, N]`` instead (bool, True
at the real positions, a prefix of each row: the lengths ``mask.sum(-1)``). ``forward`` returns
``AttentionOutput(context [B, (T,) D], attention [B, (T,) N], distribution)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..emission import EmissionCRF
from ..validation import blame_mask, lengths_of_mask, prefix_mask, validating
from .output import AttentionOutput


def check_lengths(lengths: Tensor | None, batch: int, low: int, high: int, device: torch.device,
                  mask: Tensor | None = None, root: bool = False, name: str = "") -> Tensor | None:
    """``lengths`` as a long tensor ``[B]`` with values in ``low..high`` (``ValueError`` naming it),
    or None; every layer's ``lengths`` and ``mask`` go through here. Given ``mask [B, high]``
    instead (bool, True at the real positions, a prefix of each row), the lengths it implies,
    ``mask.sum(-1)`` (:func:`structures.validation.lengths_of_mask`); with ``root``, position 0 is
    a root symbol whose mask entry is ignored (SuPar's masks set it False) and counts in the
    lengths: ``1 + mask[:, 1:].sum(-1)``. ``name`` prefixes both argument names (``query_``).
    The checks that read values (the range, the mask's prefixes) run only while validating."""
    names = (f"{name}lengths", f"{name}mask")
    try:
        lengths = lengths_of_mask(lengths, mask, batch, high - root, root=root, names=names,
                                  spec="B, N" if root else None)
        if lengths is None:
            return None
        if mask is not None and root:
            lengths = lengths + 1
        lengths = torch.as_tensor(lengths, device=device)
        if lengths.shape != (batch,) or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise ValueError(f"{names[0]}: expected an integer tensor of shape [B] = [{batch}], got {lengths.dtype} {list(lengths.shape)}")
        if validating() and lengths.numel() and bool((lengths.min() < low) | (lengths.max() > high)):
            raise ValueError(f"{names[0]}: expected values in {low}..{high}, got {lengths.tolist()}")
    except ValueError as error:
        raise (error if mask is None else blame_mask(error, names)) from None
    return lengths.long()


def zero_padding(x: Tensor, lengths: Tensor | None, dim: int = 1) -> Tensor:
    """``x [B, ...]`` with the positions ``>= lengths[b]`` along ``dim`` set to 0, whatever they
    held (NaN, inf): what a layer reads from padding then adds nothing to any score, sum or gradient."""
    if lengths is None:
        return x
    real = position_mask(lengths, x.shape[0], x.shape[dim], x.device)
    return x.masked_fill(~real.reshape(x.shape[0], *[1] * (dim - 1), x.shape[dim], *[1] * (x.dim() - dim - 1)), 0)


def position_mask(lengths: Tensor | None, batch: int, size: int, device: torch.device) -> Tensor:
    """``[B, N]`` bool: True at the real (non-padded) positions."""
    if lengths is None:
        return torch.ones(batch, size, dtype=torch.bool, device=device)
    return prefix_mask(lengths, size)


class BilinearAttention(nn.Module):
    """The shared part of the query attentions: bilinear scores ``θ_i = h_i W q`` and the context
    ``Σ_i w_i h_i``; a subclass turns scores into weights (:meth:`weights`)."""

    def __init__(self, memory_dim: int, query_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(memory_dim, query_dim))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, memory: Tensor, query: Tensor, lengths: Tensor | None = None, *,
                mask: Tensor | None = None) -> AttentionOutput:
        """``memory [B, N, D]``, ``query [B, Q]`` or ``[B, T, Q]``, ``lengths [B]`` in ``1..N`` (or
        ``mask [B, N]``, bool, True at the real positions). Returns ``context [B, (T,) D]``,
        ``attention [B, (T,) N]`` (0 at padding) and the distribution (``None`` unless the subclass
        has one)."""
        memory, query, lengths, single = self._check(memory, query, lengths, mask)
        scores = query @ self.weight.t() @ memory.transpose(-1, -2)  # [B, T, N]
        mask = position_mask(lengths, memory.shape[0], memory.shape[1], memory.device).unsqueeze(1)
        weights, distribution = self.weights(scores, mask, lengths)
        context = weights @ memory
        if single:
            return AttentionOutput(context.squeeze(1), weights.squeeze(1), distribution)
        return AttentionOutput(context, weights, distribution)

    def weights(self, scores: Tensor, mask: Tensor, lengths: Tensor | None):
        """``(weights [B, T, N], distribution or None)`` from ``scores [B, T, N]``; ``mask [B, 1, N]``."""
        raise NotImplementedError

    def _check(self, memory: Tensor, query: Tensor, lengths: Tensor | None, mask: Tensor | None = None):
        D, Q = self.weight.shape
        if not isinstance(memory, Tensor) or memory.dim() != 3 or memory.shape[-1] != D:
            raise ValueError(f"memory: expected shape [B, N, D] = [B, N, {D}], got {_shape(memory)}")
        B, N = memory.shape[:2]
        if N == 0:
            raise ValueError("memory: expected at least one position (N >= 1)")
        if not isinstance(query, Tensor) or query.dim() not in (2, 3) or query.shape[0] != B or query.shape[-1] != Q:
            raise ValueError(f"query: expected shape [B, Q] or [B, T, Q] = [{B}, ..., {Q}], got {_shape(query)}")
        lengths = check_lengths(lengths, B, 1, N, memory.device, mask)
        single = query.dim() == 2
        return zero_padding(memory, lengths), query.unsqueeze(1) if single else query, lengths, single


def _shape(x) -> str:
    return str(list(x.shape)) if isinstance(x, Tensor) else type(x).__name__


class SoftmaxAttention(BilinearAttention):
    """Simple (categorical) attention: ``c = Σ_i softmax(θ)_i h_i`` with ``θ_i = h_i W q``."""

    def weights(self, scores, mask, lengths):
        low = torch.finfo(scores.dtype).min  # not -inf: a fully padded row would give NaN gradients
        return torch.softmax(scores.masked_fill(~mask, low), -1) * mask, None


class SigmoidAttention(BilinearAttention):
    """Bernoulli attention (Kim et al. 2017, Fig. 1b): ``c = Σ_i sigmoid(θ_i) h_i``."""

    def weights(self, scores, mask, lengths):
        return torch.sigmoid(scores) * mask, None


class SegmentationAttention(BilinearAttention):
    """Segmentation attention (Kim et al. 2017, §3.1, §4.2): a 2-state linear-chain CRF over the
    memory positions, ``z_i ∈ {0, 1}`` (selected or not), with unary scores ``θ_i(1) = h_i W q``,
    ``θ_i(0) = 0`` and pairwise scores ``b[z_i, z_{i+1}]`` (:attr:`pairwise`, ``[2, 2]``, from,
    to; the 4 extra parameters). The context is ``c = Σ_i p(z_i = 1) h_i`` (expected selected
    memory), computed by forward-backward in :class:`structures.EmissionCRF`.

    ``normalize=λ`` (the paper's λ = 2 for translation) divides the marginals by
    ``γ = (1/λ) Σ_i p(z_i = 1)``, so the weights sum to λ: the paper found the plain expectation's
    marginals to saturate in training. The paper writes each pairwise potential as
    ``θ_i(z_i) + θ_{i+1}(z_{i+1}) + b``; here each unary is counted once (the usual CRF), which
    differs only by how often interior unaries are counted.

    ``distribution`` is the :class:`~structures.EmissionCRF` with one example per query, batch
    ``B·T`` in ``(b, t)`` order (``B`` for a query ``[B, Q]``). Add an l2 penalty on
    :attr:`pairwise` in the loss if wanted (the paper used 0.005).
    """

    def __init__(self, memory_dim: int, query_dim: int, normalize: float | None = None):
        super().__init__(memory_dim, query_dim)
        if normalize is not None and not normalize > 0:
            raise ValueError(f"normalize: expected a positive λ or None, got {normalize}")
        self.normalize = normalize
        self.pairwise = nn.Parameter(torch.zeros(2, 2))

    def weights(self, scores, mask, lengths):
        B, T, N = scores.shape
        emissions = torch.stack([torch.zeros_like(scores), scores], -1).flatten(0, 1)  # [B·T, N, 2]
        flat_lengths = None if lengths is None else lengths.repeat_interleave(T)
        crf = EmissionCRF(emissions, self.pairwise.to(scores.dtype), lengths=flat_lengths)
        selected = crf.marginals[..., 1].reshape(B, T, N)  # p(z_i = 1), 0 past each length
        if self.normalize is not None:
            gamma = selected.sum(-1, keepdim=True) / self.normalize
            selected = selected / gamma.clamp_min(torch.finfo(selected.dtype).tiny)
        return selected, crf
