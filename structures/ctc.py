"""Connectionist temporal classification (Graves et al. 2006): the alignments of a label sequence
to the frames of an input, declared in the language with a lookup by data."""

from __future__ import annotations

import math

import torch
from torch import Tensor

import semiring

from .distribution import StructuredDistribution
from .validation import check_integers, check_shape, given_lengths, prefix_mask, validating


class CTC(StructuredDistribution):
    """A distribution over the CTC alignments of each example's targets to its frames.

    ``log_probs [B, T, V]`` are the potentials (batch first, unlike ``torch.nn.functional.ctc_loss``):
    ``log_probs[b, t, v]`` scores symbol ``v`` at frame ``t``; ``blank`` (default 0) is the blank.
    ``targets [B, S]`` (integers, ``!= blank`` within each target length), ``input_lengths [B]`` in
    ``1..T`` (default ``T``) and ``target_lengths [B]`` in ``0..S`` (default ``S``). Each length may
    be given as a mask instead: ``input_mask [B, T]`` (e.g. an encoder's attention mask) and
    ``target_mask [B, S]`` (e.g. ``labels >= 0``), bool, True at the frames / target labels that
    exist, a prefix of each row; the lengths are their ``sum(-1)``. (No ``mask``: CTC has no
    ``lengths`` argument, and its two lengths count different things.)

    An alignment is a frame labelling ``π`` (a symbol per frame, Graves' path) that collapses to the
    targets (merge repeats, then drop blanks); its score is ``Σ_t log_probs[t, π_t]``. **Its parts
    are the frames' symbols**: one-hot ``[B, T, V]``, 0 past each input length, so marginals
    ``[B, T, V]`` are p(π_t = v) and argmax, samples and ``topk`` are one-hot frame labellings.
    A labelling determines its path through the extended label sequence ``ext`` (the targets with
    blanks around and between, ``S' = 2S + 1`` positions): ``positions(parts)`` gives it, ``[B, T]``.
    ``decode()`` gives the best labelling's symbols ``[B, T]`` (-1 past each input length).

    ``log_partition = log p(targets | input)`` when the rows of ``log_probs`` are normalized: it
    equals ``-ctc_loss(..., reduction='none')``. Where the frames are too few for the targets,
    ``log_partition`` is ``-inf`` (ctc_loss: a loss of ``inf``) and marginals are 0. ``lengths`` is
    ``{"n": input_lengths, "m": target_lengths}``. Note that ``ctc_loss``'s own gradient
    with respect to ``log_probs`` is ``exp(log_probs) − posterior``, not the derivative
    ``−posterior``: the two agree once chained through a ``log_softmax``.
    """

    program = semiring.program("""
        e[t, s]      = logp[t, ext[s]]                                           # gathered once, not per frame
        alpha[0, s]  = e[0, s]                                        if s < 2   # start on the first blank or label
        alpha[t, s] += alpha[t-1, s] * e[t, s]                                   # stay
        alpha[t, s] += alpha[t-1, s-1] * e[t, s]                                 # advance by one
        alpha[t, s] += alpha[t-1, s-2] * skip[s] * e[t, s]                       # over a blank, between different labels
        goal        += alpha[n-1, 2*m]                                           # end on the last blank
        goal        += alpha[n-1, 2*m-1]                                         # or on the last label
    """)
    shape = "B, T, V"
    potentials = "logp"

    def __init__(self, log_probs: Tensor, targets: Tensor, input_lengths: Tensor | None = None,
                 target_lengths: Tensor | None = None, blank: int = 0, *, input_mask: Tensor | None = None,
                 target_mask: Tensor | None = None):
        check_shape("log_probs", log_probs, "B, T, V")
        B, T, V = log_probs.shape
        if not isinstance(targets, Tensor) or targets.dim() != 2:
            raise ValueError(f"targets: expected an integer tensor of shape [B, S] = [{B}, S], got {getattr(targets, 'shape', targets)}")
        S = targets.shape[1]
        values = check_integers("targets", targets, (B, S), 0, V - 1)
        if not 0 <= blank < V:
            raise ValueError(f"blank: expected an index in 0..{V - 1}, got {blank}")
        input_lengths = given_lengths(input_lengths, input_mask, B, 1, T, log_probs.device, ("input_lengths", "input_mask"))
        target_lengths = given_lengths(target_lengths, target_mask, B, 0, S, targets.device, ("target_lengths", "target_mask"))
        inside = None if target_lengths is None else prefix_mask(target_lengths, S)
        # (no blank among the values read: nothing to look for)
        if validating() and (values is None or values[0] <= blank <= values[1]):
            within = targets == blank if inside is None else inside & (targets == blank)
            if bool(within.any()):
                raise ValueError(f"targets: the blank {blank} appears within a target length")
        self.targets, self.blank = targets, blank
        every = lambda size: torch.full((B,), size, dtype=torch.long, device=log_probs.device)  # noqa: E731
        self.input_lengths = every(T) if input_lengths is None else input_lengths
        self.target_lengths = every(S) if target_lengths is None else target_lengths
        labels = targets if inside is None else targets.where(inside, blank)  # the blank past each target length
        ext = torch.full((B, 2 * S + 1), blank, dtype=torch.long, device=targets.device)
        ext[:, 1::2] = labels
        self.ext = ext
        # skip[s]: 0 where position s may be reached from s - 2, a label different from the one before it
        skip = torch.full(ext.shape, -math.inf, dtype=log_probs.dtype, device=log_probs.device)
        skip[:, 3::2].masked_fill_(labels[:, 1:] != labels[:, :-1], 0.0)
        # (neither given: every example at the largest lengths, T and S, whose goal alone is computed)
        lengths = None if input_lengths is None and target_lengths is None else {"n": self.input_lengths, "m": self.target_lengths}
        super().__init__(log_probs, lengths, {"skip": skip, "ext": ext})

    def _check_potentials(self, log_potentials: Tensor) -> None:
        check_shape(self.argument, log_potentials, self.shape, values=False)  # (their values: checked by __init__)

    def _check_lengths(self, lengths: dict[str, Tensor]) -> dict[str, Tensor]:
        """The program's check of ``{"n", "m"}``, reading no values where it would read them again:
        where these shapes allow every ``n`` in ``1..T`` and ``m`` in ``0..S``, which the
        checks of ``input_lengths`` and ``target_lengths`` have already kept them in."""
        ranges = self.program.length_ranges(self._shapes)
        (n_lo, n_hi), (m_lo, m_hi) = ranges["n"], ranges["m"]
        T, S = self._theta.shape[1], self.targets.shape[1]
        implied = n_lo <= 1 <= T <= n_hi and m_lo <= 0 and S <= m_hi
        return self.program.check_lengths(lengths, self._batch, self._shapes, values=validating() and not implied)

    def decode(self) -> Tensor:
        """``[B, T]`` long: the symbol of every frame in the best alignment (-1 past each input length)."""
        return self.symbols(self.argmax)

    def symbols(self, parts: Tensor) -> Tensor:
        """The frames' symbols ``[..., B, T]`` (-1 where a frame has none) of one-hot parts ``[..., B, T, V]``."""
        return parts.argmax(-1).where(parts.sum(-1) > 0, -1)

    def to_parts(self, symbols: Tensor) -> Tensor:
        """One-hot parts ``[..., B, T, V]`` of frame labellings ``[..., B, T]`` (-1 and frames past
        each input length ignored)."""
        T, V = self._theta.shape[-2:]
        if symbols.dim() < 2 or symbols.shape[-1] != T:
            raise ValueError(f"value: expected symbols of shape [..., B, {T}], got {list(symbols.shape)}")
        inside = prefix_mask(self.input_lengths, T) & (symbols >= 0)
        return torch.nn.functional.one_hot(symbols.clamp(0, V - 1), V).to(self._theta.dtype) * inside.unsqueeze(-1)

    def positions(self, parts: Tensor) -> Tensor:
        """``[..., B, T]`` long: the position in the extended label sequence of every frame of
        labellings given as one-hot parts ``[..., B, T, V]`` (-1 where a frame has no symbol): a
        label that differs from the previous frame's symbol starts the next target label."""
        y = self.symbols(parts)
        label = (y >= 0) & (y != self.blank)
        starts = label & (y != torch.nn.functional.pad(y, (1, 0), value=-1)[..., :-1])
        k = starts.long().cumsum(-1)  # the target labels started so far
        return torch.where(label, 2 * k - 1, 2 * k).where(y >= 0, -1)

    def shared_counts(self, parts: Tensor) -> dict[str, Tensor]:
        """How often the alignments skip a blank into each position: ``{"skip": [..., B, S']}``."""
        s = self.positions(parts)
        S1 = self.ext.shape[-1]  # (a labelling that starts more labels than the targets have goes past it: no alignment)
        jump = (s[..., 1:] - s[..., :-1] == 2) & (s[..., 1:] >= 0) & (s[..., 1:] < S1)
        counts = torch.zeros(*s.shape[:-1], S1 + 1, dtype=parts.dtype, device=parts.device)
        return {"skip": counts.scatter_add(-1, s[..., 1:].where(jump, counts.shape[-1] - 1), jump.to(parts.dtype))[..., :-1]}

    def score(self, value: Tensor) -> Tensor:
        """``[..., B]``: ``Σ_t log_probs[t, π_t]`` of frame labellings (one-hot ``[..., B, T, V]`` or
        symbols ``[..., B, T]``); ``-inf`` for one that is not an alignment of the targets."""
        parts = value if value.dtype.is_floating_point else self.to_parts(value)
        return super().score(parts).masked_fill(~self._aligns(parts), -math.inf)

    def _aligns(self, parts: Tensor) -> Tensor:
        """``[..., B]`` bool: whether labellings (one-hot parts) are alignments of the targets: a
        symbol on exactly the frames of the input, each the one of its extended position, ending
        with every target label used."""
        s = self.positions(parts)
        T = s.shape[-1]
        framed = (s >= 0) == prefix_mask(self.input_lengths, T)
        ext = self.ext.expand(*s.shape[:-1], -1)
        fits = (ext.gather(-1, s.clamp(0, ext.shape[-1] - 1)) == self.symbols(parts)) | (s < 0)
        used = (s.amax(-1) + 1) // 2 == self.target_lengths
        return framed.all(-1) & fits.all(-1) & used
