"""Klein & Manning's (2004) dependency model with valence (DMV) over POS tags, as the library's
second-order projective CRF (:class:`structures.SecondOrderDependencyCRF`).

The DMV generates a sentence's tags from the root down: the root picks one tag, and every head
``h``, on each side ``d``, decides to stop or to continue (probabilities that depend on its tag, the
side and whether it already has a child on that side, its *valence*), and on continuing picks a
dependent's tag ``P(t_m | t_h, d)``, closest dependents first. A tree's log-probability is then
edge-factored up to the valence, which depends only on whether a dependent is the closest one on
its side, the one thing the sibling scores of the second-order CRF know:

- ``arc[h, m] = log P(t_m | t_h, d) + log cont(h, d, 0) + log stop(h, d, 1) - log stop(h, d, 0)``
  (the closest dependent turns the head's final stop from "without" to "with a child");
- ``sib[h, s, m] = log cont(h, d, 1) - log cont(h, d, 0) - log stop(h, d, 1) + log stop(h, d, 0)``
  for every later dependent ``m`` (after ``s``);
- plus ``sum_h sum_d log stop(h, d, 0)``, the same for every tree.

So ``log p(tags) = log Z(arc, sib) + sum_h sum_d log stop(h, d, 0)`` exactly, and the model is
fitted by gradient ascent on that marginal likelihood (what EM climbs too); the trees are the best
trees of the CRF (Viterbi parses). No gold tree is used; the gold POS tags are the input, as in
grammar induction since Klein & Manning.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from structures import SecondOrderDependencyCRF

from .parse import length_groups
from .progress import Progress
from .ud import Sentence
from .vocabulary import encode


class DMV(nn.Module):
    """The DMV's probabilities from tag embeddings: ``P(t_m | t_h, d)`` (one softmax per side),
    ``P(t_m | root)``, and ``stop(h, d, v)`` (a sigmoid per side and valence). ``crf(tags [B, N],
    lengths [B])`` is the tags' :class:`SecondOrderDependencyCRF` and the per-sentence constant
    ``[B]``; :meth:`loss` the negative log-likelihood per tag."""

    def __init__(self, tags: int, dim: int = 32):
        super().__init__()
        self.embed = nn.Embedding(tags, dim)
        self.attach = nn.Linear(dim, 2 * tags)  # [left, right] dependents' tag logits
        self.root = nn.Parameter(torch.zeros(tags))
        self.stop = nn.Linear(dim, 4)  # [side, valence] logits of stopping

    def crf(self, tags: Tensor, lengths: Tensor, harmonic: float = 0.0) -> tuple[SecondOrderDependencyCRF, Tensor]:
        """The CRF over the trees of the ``tags [B, N]`` and ``sum_h sum_d log stop(h, d, 0)`` ``[B]``;
        ``harmonic`` adds ``-harmonic * log |h - m|`` to every arc (a bias toward short arcs, in the
        spirit of Klein & Manning's harmonic initializer)."""
        B, N = tags.shape
        e = self.embed(tags)
        attach = self.attach(e).view(B, N, 2, -1).log_softmax(-1)  # [B, h, side, tag]
        given = attach.gather(-1, tags[:, None, None, :].expand(B, N, 2, N))  # [B, h, side, m]
        position = torch.arange(1, N + 1, device=tags.device)
        right = (position > position.unsqueeze(-1)).unsqueeze(0)  # [1, h, m]: m right of h
        stop = self.stop(e).view(B, N, 2, 2)  # [B, h, side, valence]
        log_stop, log_cont = nn.functional.logsigmoid(stop), nn.functional.logsigmoid(-stop)
        first = log_cont[..., 0] + log_stop[..., 1] - log_stop[..., 0]  # [B, h, side]
        later = log_cont[..., 1] - log_cont[..., 0] - log_stop[..., 1] + log_stop[..., 0]

        def by_side(x: Tensor) -> Tensor:  # [B, h, side] -> [B, h, m]
            return torch.where(right, x[..., 1:], x[..., :1])

        words = torch.where(right, given[:, :, 1], given[:, :, 0]) + by_side(first)
        if harmonic:
            words = words - harmonic * (position - position.unsqueeze(-1)).abs().clamp_min(1).log()
        arc = nn.functional.pad(words, (1, 0, 1, 0))
        arc[:, 0, 1:] = self.root.log_softmax(-1)[tags]
        sib = nn.functional.pad(by_side(later), (1, 0, 1, 0)).unsqueeze(2).expand(B, N + 1, N + 1, N + 1)
        real = position <= lengths.unsqueeze(-1)
        constant = (log_stop[..., 0].sum(-1) * real).sum(-1)
        return SecondOrderDependencyCRF(arc, sib.contiguous(), lengths, single_root=True), constant

    def loss(self, tags: Tensor, lengths: Tensor, harmonic: float = 0.0) -> Tensor:
        """``-log p(tags)`` per tag, over the batch."""
        crf, constant = self.crf(tags, lengths, harmonic)
        return -(crf.log_partition + constant).sum() / lengths.sum()


def run_epoch(model: nn.Module, sentences: Sequence[Sentence], loss_of: Callable[[list[Sentence]], Tensor],
              optimizer: torch.optim.Optimizer, rng: random.Random, tokens_per_batch: int = 800) -> float:
    """One pass over batches of sentences of similar lengths: ``loss_of(batch)`` (a mean per word),
    a step with the gradient clipped to norm 5; returns the mean loss per word."""
    model.train()
    total, count = 0.0, 0
    for group in length_groups(sentences, tokens_per_batch, rng):
        batch = [sentences[i] for i in group]
        loss = loss_of(batch)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        words = sum(s.n for s in batch)
        total += float(loss.detach()) * words
        count += words
    return total / max(count, 1)


def train_epoch(model: DMV, sentences: Sequence[Sentence], tag_index: dict[str, int], optimizer: torch.optim.Optimizer,
                rng: random.Random, harmonic: float = 0.0) -> float:
    """One pass over the sentences; the mean negative log-likelihood per tag."""
    return run_epoch(model, sentences, lambda batch: model.loss(*encode(batch, tag_index, field="upos"), harmonic), optimizer, rng)


def fit(sentences: Sequence[Sentence], tag_index: dict[str, int], epochs: int, warm_epochs: int = 0, lr: float = 0.01,
        weight_decay: float = 0.01, seeds: Sequence[int] = (0,)) -> tuple[DMV, list[float], int]:
    """A DMV trained from each seed (AdamW; the first ``warm_epochs`` with the harmonic bias), the
    one with the highest likelihood (lowest final loss) kept: ``(model, its loss per epoch, its seed)``.
    The DMV's likelihood has many local optima, some of them near a chain: restarts chosen by
    likelihood, as EM's usually are, need no gold tree."""
    best = None
    for seed in seeds:
        torch.manual_seed(seed)
        model, rng = DMV(len(tag_index)), random.Random(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        curve = [train_epoch(model, sentences, tag_index, optimizer, rng, harmonic=1.0 if epoch < warm_epochs else 0.0)
                 for epoch in Progress(range(epochs), desc=f"dmv seed {seed}")]
        if best is None or curve[-1] < best[1][-1]:
            best = (model, curve, seed)
    return best


@torch.no_grad()
def parses(model: DMV, sentences: Sequence[Sentence], tag_index: dict[str, int], tokens_per_batch: int = 4000) -> list[list[int]]:
    """The best tree (heads, 0 the root) of each sentence."""
    model.eval()
    out: list[list[int]] = [[] for _ in sentences]
    for group in length_groups(sentences, tokens_per_batch):
        tags, lengths = encode([sentences[i] for i in group], tag_index, field="upos")
        heads = model.crf(tags, lengths)[0].decode()
        for b, i in enumerate(group):
            out[i] = heads[b, :sentences[i].n].tolist()
    return out
