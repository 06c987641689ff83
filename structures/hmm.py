"""The hidden Markov model: the posterior over state sequences of observed word sequences, and EM.

An HMM with ``C`` states over a vocabulary of ``V`` words has a start distribution ``start [C]``, a
transition matrix ``transitions [C, C]`` (from row to column) and an emission table ``emission [C, V]``.
Given the words ``x``, its joint ``p(x, z) = start[z_0] Π_i transitions[z_{i-1}, z_i] Π_i emission[z_i, x_i]``
is, as a function of the states ``z``, an :class:`EmissionCRF` whose per-position emission scores are
the table's columns of the words, ``emission[:, x_i]``, and whose transitions and start are shared: so
:class:`HMM` is that distribution, and its log-partition is the log-likelihood ``log p(x)``.

EM (Baum-Welch) is then the gradient of the log-likelihood: the expected counts of the start, transition
and emission events are the derivatives of ``log p(x)`` by the log-parameters (the state marginals
for the emissions, the shared scores' gradients for the rest), one forward and one backward pass of the
program per batch; the M-step normalizes them (:meth:`HMMParameters.from_counts`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Sequence

import torch
from torch import Tensor

import semiring as sr

from .base import leaf, recording
from .emission import EmissionCRF
from .validation import check_integers, check_shape, prefix_mask


class HMM(EmissionCRF):
    """The posterior ``p(z | x)`` over the state sequences of a batch of word sequences under an HMM.

    ``words [B, N]`` (integers in ``0..V-1``; entries past each length are ignored), ``emission [C, V]``,
    ``transitions [C, C]`` (from, to) and ``start [C]``: log-probabilities (normalization is not
    checked: unnormalized scores give the same posterior), ``lengths [B]`` in ``1..N`` (or
    ``mask [B, N]``, bool, True at each sequence's words: a prefix).
    The potentials are the emission scores of the words, ``emission[:, words]`` moved to ``[B, N, C]``;
    everything else is :class:`EmissionCRF`'s: ``marginals [B, N, C]`` (forward-backward),
    ``decode()`` (Viterbi) ``[B, N]``, ``sample()`` one-hot states, ``log_prob(states)`` = log p(z | x).
    ``log_partition [B]`` is ``log p(x)`` for normalized parameters.
    """

    def __init__(self, words: Tensor, emission: Tensor, transitions: Tensor, start: Tensor, lengths: Tensor | None = None,
                 *, mask: Tensor | None = None):
        check_shape("emission", emission, "C, V")
        if not isinstance(words, Tensor) or words.dim() != 2 or words.dtype.is_floating_point or words.dtype == torch.bool:
            raise ValueError(f"words: expected integer word ids of shape [B, N], got {getattr(words, 'dtype', type(words))} "
                             f"{list(getattr(words, 'shape', []))}")
        V = emission.shape[1]
        super().__init__(emission.t()[words.clamp(0, V - 1)], transitions, start, None, lengths, mask=mask)
        self.words = words if self._lengths is None else torch.where(self._inside(), words, 0)  # (None: every word inside)
        self._vocabulary = V
        check_integers("words", self.words, words.shape, 0, V - 1)  # (ids of emission's columns, within each length)

    def _inside(self) -> Tensor:
        """``[B, N]`` bool: the positions within each length."""
        return prefix_mask(self.lengths.to(self._theta.device), self._theta.shape[1])

    def posterior_decode(self) -> Tensor:
        """``[B, N]`` long: the most probable state at each position (0 past each length)."""
        return self.marginals.argmax(-1) * self._inside()

    def expected_counts(self) -> tuple[dict[str, Tensor], Tensor]:
        """The expected counts of the events under the posterior, summed over the batch — ``start [C]``,
        ``transitions [C, C]`` (from, to), ``emission [C, V]`` — and the log-partition ``[B]`` (detached),
        from one forward and one backward pass. Examples of likelihood 0 count nothing."""
        with recording():
            xs = {name: leaf(v) for name, v in self._inputs(self._theta).items()}
            log_z = self._run(sr.Log, xs)
            possible = torch.isfinite(log_z)
            grads = dict(zip(xs, torch.autograd.grad(log_z[possible].sum(), list(xs.values()))))
        C = self._theta.shape[-1]
        states = grads[self.potentials]  # [B, N, C]: the marginals (0 past each length)
        emission = states.new_zeros(C, self._vocabulary).index_add_(1, self.words.flatten(), states.reshape(-1, C).t())
        counts = {"start": grads["start"].sum(0), "transitions": grads["trans"].sum(0), "emission": emission}
        return counts, self._out(log_z.detach())


@dataclass(frozen=True)
class HMMParameters:
    """An HMM's log-probabilities: ``start [C]``, ``transitions [C, C]`` (from row to column), ``emission [C, V]``."""

    start: Tensor
    transitions: Tensor
    emission: Tensor

    @classmethod
    def random(cls, states: int, vocabulary: int, noise: float = 1.0, generator: torch.Generator | None = None,
               dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> "HMMParameters":
        """Near-uniform distributions: each proportional to ``1 + noise · u``, ``u ~ U(0, 1)`` per entry."""
        def draw(*shape: int) -> Tensor:
            u = torch.rand(*shape, generator=generator, dtype=torch.float64)
            return (1 + noise * u).log().log_softmax(-1).to(dtype=dtype, device=device)
        return cls(draw(states), draw(states, states), draw(states, vocabulary))

    @classmethod
    def from_counts(cls, counts: dict[str, Tensor], smoothing: float = 0.0) -> "HMMParameters":
        """The M-step: ``counts`` (as :meth:`HMM.expected_counts`) plus ``smoothing`` per entry, each row
        normalized. A row with nothing to normalize (a state never left, never seen) becomes all ``-inf``."""
        def normalize(x: Tensor) -> Tensor:
            x = x + smoothing
            total = x.sum(-1, keepdim=True)
            return (x / total.masked_fill(total == 0, 1)).log()
        return cls(*(normalize(counts[k]) for k in ("start", "transitions", "emission")))

    def posterior(self, words: Tensor, lengths: Tensor | None = None, *, mask: Tensor | None = None) -> HMM:
        """The :class:`HMM` posterior over the states of ``words [B, N]`` (``lengths`` or ``mask`` as the HMM's)."""
        return HMM(words, self.emission, self.transitions, self.start, lengths, mask=mask)


class Batch(NamedTuple):
    """Padded word ids ``words [B, N]``, their ``lengths [B]``, and ``index [B]``: which input sequences they are."""

    words: Tensor
    lengths: Tensor
    index: Tensor


def batches(sequences: Sequence[Sequence[int]], batch_size: int, device: torch.device | str | None = None) -> list[Batch]:
    """The sequences (lists of word ids, none empty) sorted by length and cut into padded batches of
    ``batch_size``, so that each batch holds sequences of about one length."""
    if any(len(s) == 0 for s in sequences):
        raise ValueError("sequences: expected non-empty sequences of word ids")
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out = []
    for k in range(0, len(order), batch_size):
        chunk = order[k:k + batch_size]
        lengths = torch.tensor([len(sequences[i]) for i in chunk])
        words = torch.zeros(len(chunk), int(lengths.max()), dtype=torch.long)
        for row, i in enumerate(chunk):
            words[row, :len(sequences[i])] = torch.as_tensor(sequences[i])
        out.append(Batch(words.to(device), lengths.to(device), torch.tensor(chunk)))
    return out


def em_step(params: HMMParameters, data: Iterable[Batch], smoothing: float = 0.0) -> tuple[HMMParameters, float]:
    """One EM iteration over every batch: the new parameters and the log-likelihood of the data under
    the old ones (summed in float64)."""
    total: dict[str, Tensor] = {}
    log_likelihood = 0.0
    for batch in data:
        counts, log_z = params.posterior(batch.words, batch.lengths).expected_counts()
        for k, v in counts.items():
            total[k] = total[k] + v if k in total else v
        log_likelihood += log_z.double().sum().item()
    return HMMParameters.from_counts(total, smoothing), log_likelihood


def fit(params: HMMParameters, data: Sequence[Batch], iterations: int, smoothing: float = 0.0, tol: float | None = None,
        progress: bool = False, callback: Callable[[int, HMMParameters, float], None] | None = None,
        ) -> tuple[HMMParameters, list[float]]:
    """Up to ``iterations`` EM steps; stops early once the log-likelihood gains less than ``tol``.
    Returns the parameters and the log-likelihood before each step. ``callback(iteration, params, ll)``
    is called after each step with the new parameters and the old ones' log-likelihood."""
    history: list[float] = []
    steps: Iterable[int] = range(iterations)
    if progress:
        from tqdm import tqdm  # the experiments' extra: the library itself needs only torch and numpy

        steps = bar = tqdm(steps, desc="EM", disable=None)  # a bar on a terminal only
    for it in steps:
        params, ll = em_step(params, data, smoothing)
        history.append(ll)
        if progress:
            bar.set_postfix(log_likelihood=f"{ll:.1f}")
        if callback is not None:
            callback(it, params, ll)
        if tol is not None and len(history) > 1 and history[-1] - history[-2] < tol and math.isfinite(ll):
            break
    return params, history
