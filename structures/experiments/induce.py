"""Trees induced by structured self-attention, scored against Universal Dependencies (Bisk & Tran
2018 §7, Liu & Lapata 2018 §4.3).

No gold tree is used in training. The signal is a cloze task on the raw UD text: 15% of the words
of a sentence are replaced by a mask, and each masked word must be predicted **only** from the
context that :class:`structures.nn.StructuredSelfAttention` builds for it: its soft parent and
soft children ``[p_i; c_i]`` (Liu & Lapata eqs. 16-17), mixtures of the *non-contextual* word
embeddings of the other words. The arc scores come from a BiLSTM over the masked sentence. So
the only way to predict a masked word is to put on its parent and children the words that predict
it: the layer is pushed toward head-dependent pairs that predict one another (the idea behind
generative dependency models), with no leak of the masked word itself (it is masked in both the
BiLSTM's input and the values).

Other signals (``--objective``, see :class:`ClozeModel`): ``parent``, the soft parent only;
``head_mixture``, a generative dependency model's word-given-head probability mixed over the arc
marginals; ``tree_autoencoder``, the same probabilities over whole trees (Cai et al. 2017's CRF
autoencoder); with ``--targets all`` (every word of the unmasked sentence a target) or ``each``
(every word, its head scores from the sentence with it masked); ``--values upos``: POS tags are
input and predicted; ``--encoder``: the arc scores from the head-dependent distance only (a
generative model), or with the BiLSTM's; ``--uniform-epochs``: uniform arc potentials at first;
``--adjacency``: own outputs for the neighbouring heads; ``--hub-penalty``. And ``dmv``: Klein &
Manning's dependency model with valence over the POS tags (:mod:`structures.experiments.dmv`),
whose posterior trees can teach the layer over the words (``--student-epochs``). Measured in
docs/parsing.md ("Induced trees"): only the DMV, and the layer it teaches, give trees whose
undirected attachment beats a chain's.

Why this task: the data at hand (a few thousand UD sentences, 1000 PUD pairs, an SNLI sample of
~1300 pairs) is too small for translation or inference to train anything, while every sentence
gives a cloze signal at many positions.

Induced trees: the best-tree decode (single root) of the layer's arc scores, two ways:
``masked``: the head scores of word ``i`` taken from the sentence with word ``i`` masked (as in
training; one copy of the sentence per word); ``unmasked``: one pass over the plain sentence;
for the head objectives also ``posterior`` (the scores plus every word's log-probability given
each head); ``dmv``: the DMV's best trees; ``layer``: the taught layer's. All are scored against gold with directed and undirected attachment accuracy beside the two
chain baselines (``right-branching``: every word headed by the word before it;
``left-branching``: by the word after it), with tree statistics.

    python -m structures.experiments.induce --language en --epochs 10
    python -m structures.experiments.induce --objective dmv --values upos --uniform-epochs 2 --drop-punct \
        --lr 0.01 --epochs 12 --restarts 10 --student-epochs 6
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor, nn

from structures.distribution import StructuredDistribution
from structures.nn import StructuredSelfAttention

from .attachment import TreeStatistics, chain_trees, score_trees
from .parse import length_groups, markdown_table, write_csv
from .provenance import provenance, provenance_line
from .progress import Progress, report
from . import command_line, default_data_dir
from .ud import PUD, TREEBANKS, Sentence, read_conllu, write_conllu
from .dmv import DMV, parses, run_epoch
from .dmv import fit as fit_dmv
from .vocabulary import MASK, PAD, UNK, encode, word_index

LANGUAGES = {  # (training text files, evaluation file with gold trees), under <data-dir>/ud
    "en": ((TREEBANKS["ewt"][0], TREEBANKS["ewt"][1], PUD["en"]), PUD["en"]),
    "de": ((PUD["de"],), PUD["de"]),
    "nl": (TREEBANKS["lassysmall"], TREEBANKS["lassysmall"][1]),
}
HELD_OUT = {  # English with PUD kept out of the training text (--evaluate): the EWT files' text trains
    "dev": ((TREEBANKS["ewt"][0], TREEBANKS["ewt"][1]), TREEBANKS["ewt"][0]),  # where settings are chosen
    "test": ((TREEBANKS["ewt"][0], TREEBANKS["ewt"][1]), PUD["en"]),  # once, for the settings dev chose
}
SHORT = 10  # the words (punctuation left out) of the sentences scored apart, as Klein & Manning's WSJ10


def mask_words(words: Tensor, lengths: Tensor, rate: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """A copy of ``words [B, N]`` with a ``rate`` share of the known real words (at least one per
    sentence that has one) replaced by ``<mask>``, and the bool ``[B, N]`` of masked positions."""
    known = (words > MASK) & (torch.arange(words.shape[1]) < lengths.unsqueeze(-1))
    noise = torch.rand(words.shape, generator=generator).masked_fill(~known, 2.0)
    chosen = (noise < rate) | ((noise == noise.min(1, keepdim=True).values) & known)
    return words.masked_fill(chosen, MASK), chosen


OBJECTIVES = ("parent_children", "parent", "head_mixture", "tree_autoencoder")
HEAD_OBJECTIVES = ("head_mixture", "tree_autoencoder")  # a word-given-head probability per arc
DISTANCE = 10  # encoder="distance": signed head-dependent distances beyond this share a score
ENCODERS = ("bilstm", "distance", "headness", "bilstm_distance")


class ClozeModel(nn.Module):
    """Predicts masked words from the structured attention's context: ``objective="parent_children"``
    ``[p_i; c_i]`` (the soft parent and the soft children), ``"parent"`` ``p_i`` only (the soft
    parent: a mixture of the other words' embeddings with one weight per candidate head, so the
    layer must put its head mass on the single word that best predicts word ``i``), or
    ``"head_mixture"``: a generative dependency model's word-given-head probability, mixed over the
    layer's arc marginals, ``p(w_i) = sum_h p(h -> i) P(w_i | w_h, side)`` with ``P`` a softmax of
    the head's embedding (the root's: the layer's ``e_root``), one output matrix for heads to the
    left of ``i`` (the root included) and one for heads to the right (as the DMV's directions). In the
    mixture of *probabilities* a head that predicts word ``i`` well earns the head mass (the
    expectation-maximization dynamic of a generative model), where a mixture of embeddings, as in
    the other two objectives, scores an average of heads as well as a choice of one.
    ``"tree_autoencoder"``: the same word-given-head probabilities scored over whole trees, the
    CRF autoencoder of Cai, Jiang & Tu (2017) with the matrix-tree theorem:
    ``log E_{t ~ p(t | x)} prod_i P(w_i | w_{head_t(i)}) = log Z(theta + R) - log Z(theta)``, with
    ``R[h, i] = log P(w_i | w_h, side)``; unlike the per-word mixture it keeps the tree's coupling
    (a word's head cannot also be its dependent).

    ``tags > 0`` (only with a head objective): the sentence's POS tags (a tag vocabulary of that
    size) are an input beside the words (their embeddings added), and they are what is predicted:
    ``P(t_i | t_h, side)``, the tag-level generative dependency model of grammar induction (Klein &
    Manning's DMV). No gold tree is used either way.

    ``encoder="distance"`` (only ``tree_autoencoder``): the arc scores depend on nothing but the
    signed distance ``h - m`` (a learned score per distance up to ``DISTANCE``), a prior over trees
    that cannot see the sentence. The loss is then the negative log-likelihood of an edge-factored
    generative dependency model (Klein & Manning's DMV without valence), whose trees are those of its
    posterior (:meth:`posterior`): no word can choose a head from its own context.
    ``encoder="headness"`` adds to those scores two per word read off the BiLSTM over the sentence,
    how good a head it is for the words to its left and to its right: a prior over trees that sees
    the sentence, but whose scores of word ``m``'s heads cannot depend on ``m`` beyond the distance,
    so it cannot point a word at a head that shares its tag (which predicts the tag better than its
    syntactic head does, and which the bilinear scores learn). ``encoder="bilstm_distance"``: the
    bilinear scores plus the distance scores (a locality the BiLSTM states cannot easily express).

    ``forward(words [B, N], lengths [B], tags [B, N] = None)`` -> ``(logits [B, N, V],
    AttentionOutput)`` (for the head objectives the logits of the left-head output applied to the
    parent context, not used in training); :meth:`loss` is the training loss.
    """

    def __init__(self, vocab_size: int, dim: int = 128, hidden: int = 64, scores: str = "bilinear",
                 objective: str = "parent_children", adjacency: bool = False, tags: int = 0,
                 structure: str = "nonprojective", encoder: str = "bilstm"):
        super().__init__()
        if objective not in OBJECTIVES:
            raise ValueError(f"objective: expected one of {OBJECTIVES}, got {objective!r}")
        if encoder not in ENCODERS or (encoder != "bilstm" and objective != "tree_autoencoder"):
            raise ValueError(f"encoder: expected 'bilstm', or one of {ENCODERS[1:]} with objective='tree_autoencoder', got {encoder!r}")
        self.distance = nn.Parameter(torch.zeros(2 * DISTANCE + 1)) if encoder != "bilstm" else None
        self.headness = nn.Linear(2 * hidden, 2) if encoder == "headness" else None
        self.encoder = encoder
        if tags and objective not in HEAD_OBJECTIVES:
            raise ValueError(f"tags: only with the objectives {HEAD_OBJECTIVES}, got objective={objective!r}")
        self.objective = objective
        self.arc_scale = 1.0  # multiplies the BiLSTM states before the arc scores: 0 gives uniform potentials
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=PAD)
        self.embed_tags = nn.Embedding(tags, dim, padding_idx=PAD) if tags else None
        self.lstm = nn.LSTM(dim, hidden, batch_first=True, bidirectional=True)
        self.attention = StructuredSelfAttention(2 * hidden, dim, scores=scores, structure=structure,
                                                 output="parent_children" if objective == "parent_children" else "parent")
        predicted = tags or vocab_size
        self.predict = nn.Linear((2 if objective == "parent_children" else 1) * dim, predicted)
        if objective in HEAD_OBJECTIVES:
            self.predict_right = nn.Linear(dim, predicted)  # heads to the right of the word
        self.adjacency = adjacency and objective in HEAD_OBJECTIVES
        if self.adjacency:  # the DMV's adjacency: own outputs for the heads next to the word
            self.predict_next_left = nn.Linear(dim, predicted)
            self.predict_next_right = nn.Linear(dim, predicted)

    def forward(self, words: Tensor, lengths: Tensor, tags: Tensor | None = None):
        states, values = self.states(words, lengths, tags)
        out = self.attention(states, values, lengths)
        return self.predict(out.context), out

    def states(self, words: Tensor, lengths: Tensor, tags: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The BiLSTM states the arc scores are read from ``[B, N, 2 * hidden]`` (times
        ``arc_scale``) and the input embeddings ``[B, N, dim]``."""
        values = self.embed(words) if self.embed_tags is None else self.embed(words) + self.embed_tags(tags)
        packed = nn.utils.rnn.pack_padded_sequence(values, lengths, batch_first=True, enforce_sorted=False)
        states, _ = self.lstm(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=words.shape[1])
        return (states * self.arc_scale if self.arc_scale != 1.0 else states), values

    def distance_scores(self, lengths: Tensor, N: int) -> Tensor:
        """``[B, N+1, N+1]`` arc scores of ``encoder="distance"``: ``[b, h, m]`` the learned score of
        the signed distance ``h - m`` (clipped to ``±DISTANCE``); the root's row 0 (one root arc in
        every single-rooted tree, a constant)."""
        position = torch.arange(N + 1, device=lengths.device)
        theta = self.distance[(position.unsqueeze(-1) - position).clamp(-DISTANCE, DISTANCE) + DISTANCE]
        return theta.masked_fill(position.unsqueeze(-1) == 0, 0.0).expand(len(lengths), N + 1, N + 1)

    def tree_scores(self, words: Tensor, lengths: Tensor, tags: Tensor | None = None, masked: bool = True) -> Tensor:
        """The layer's ``[B, N+1, N+1]`` arc scores of the sentences: :meth:`masked_arc_scores`
        (``masked``), those of one pass over the plain sentences, or the distance scores."""
        if self.encoder == "headness":
            left, right = nn.functional.pad(self.headness(self.states(words, lengths, tags)[0]), (0, 0, 1, 0)).unbind(-1)
            position = torch.arange(words.shape[1] + 1, device=words.device)
            heads = torch.where(position.unsqueeze(-1) < position, right.unsqueeze(-1), left.unsqueeze(-1))  # [B, h, m]
            return self.distance_scores(lengths, words.shape[1]) + heads.masked_fill(position.unsqueeze(-1) == 0, 0.0)
        if self.encoder == "distance":
            return self.distance_scores(lengths, words.shape[1])
        if masked:
            scores = self.masked_arc_scores(words, lengths, tags)
        else:
            scores = self.attention.arc_scores(self.states(words, lengths, tags)[0])
        return scores + self.distance_scores(lengths, words.shape[1]) if self.encoder == "bilstm_distance" else scores

    def posterior(self, words: Tensor, lengths: Tensor, tags: Tensor | None = None) -> StructuredDistribution:
        """The trees given the whole observed sentence (head objectives): the layer's
        :meth:`tree_scores` plus every word's ``log P(x_m | x_h)``."""
        targets = words if tags is None else tags
        gain = self.given_head(self.head_values(words, tags), targets) * (targets > MASK).unsqueeze(1)
        return self.attention.structure(self.tree_scores(words, lengths, tags) + nn.functional.pad(gain, (1, 0)),
                                        lengths, self.attention.single_root)

    def head_values(self, words: Tensor, tags: Tensor | None = None) -> Tensor:
        """``[B, N+1, dim]``: the root's embedding, then each word's (its tag's, with tags): what
        the word-given-head probabilities are read from."""
        heads = self.embed(words) if tags is None else self.embed_tags(tags)
        return torch.cat([self.attention.root_embedding.expand(len(heads), 1, -1), heads], 1)

    def masked_arc_scores(self, words: Tensor, lengths: Tensor, tags: Tensor | None = None) -> Tensor:
        """``[B, N+1, N+1]`` arc scores whose column ``m`` (the head scores of word ``m``) comes from
        the sentence with word ``m`` (and its tag) masked: one copy of each sentence per word, so no
        word's own identity reaches the scores of its heads. Column 0 is 0."""
        B, N = words.shape
        masked_word = torch.arange(N, device=words.device).repeat(B)
        copy_lengths = lengths.repeat_interleave(N)
        inside = masked_word < copy_lengths

        def copied(ids: Tensor) -> Tensor:
            copies = ids.repeat_interleave(N, 0)
            copies[torch.arange(B * N, device=words.device), masked_word] = MASK
            return copies[inside]

        states = self.states(copied(words), copy_lengths[inside], None if tags is None else copied(tags))[0]
        columns = states.new_zeros(B * N, N + 1)
        columns[inside] = self.attention.arc_scores(states)[torch.arange(len(states)), :, masked_word[inside] + 1]
        return nn.functional.pad(columns.view(B, N, N + 1).transpose(1, 2), (1, 0))

    def loss(self, words: Tensor, masked: Tensor, lengths: Tensor, chosen: Tensor, tags: Tensor | None = None,
             each: bool = False) -> tuple[Tensor, StructuredDistribution]:
        """The mean cross-entropy of the ``chosen [B, N]`` words of ``words`` (with tags: their
        tags ``tags [B, N]``) given the ``masked`` sentences, and the layer's distribution over
        trees. ``each`` (head objectives, nothing masked): every word's head scores come from the
        sentence with that word masked (:meth:`masked_arc_scores`)."""
        masked_tags = None if tags is None else tags.masked_fill(masked == MASK, MASK)
        targets = words if tags is None else tags
        if each or self.encoder != "bilstm":
            prior = self.attention.structure(self.tree_scores(masked, lengths, masked_tags, masked=each), lengths, self.attention.single_root)
        else:
            logits, out = self(masked, lengths, masked_tags)
            if self.objective not in HEAD_OBJECTIVES:
                return nn.functional.cross_entropy(logits[chosen], targets[chosen]), out.distribution
            prior = out.distribution
        given = self.given_head(self.head_values(masked, masked_tags), targets)
        if self.objective == "head_mixture":
            mixture = (prior.marginals[:, :, 1:].clamp_min(1e-30).log() + given).logsumexp(1)  # [B, N]
            return -mixture[chosen].mean(), prior
        gain = nn.functional.pad(given * chosen.unsqueeze(1), (1, 0))  # [B, N+1, N+1]; 0 for words not predicted
        joint = type(prior)(prior.log_potentials + gain, lengths, prior.single_root)
        return -(joint.log_partition - prior.log_partition).sum() / chosen.sum(), prior

    def given_head(self, heads: Tensor, targets: Tensor) -> Tensor:
        """``[B, N+1, N]`` log-probabilities ``[b, h, m-1] = log P(targets[b, m-1] | head h)`` of
        word ``m`` given each candidate head ``h`` (0 the root) from the head representations
        ``heads [B, N+1, dim]``: the left-head output for ``h < m``, the right-head one for
        ``h > m`` and, with adjacency, their own for ``h = m - 1 >= 1`` and ``h = m + 1``."""
        B, N = targets.shape
        index = targets.unsqueeze(1).expand(B, N + 1, N)

        def scored(output: nn.Linear) -> Tensor:
            return output(heads).log_softmax(-1).gather(-1, index)

        h = torch.arange(N + 1, device=targets.device).unsqueeze(-1)
        m = torch.arange(1, N + 1, device=targets.device)
        given = torch.where(h > m, scored(self.predict_right), scored(self.predict))
        if self.adjacency:
            given = torch.where((h == m - 1) & (h > 0), scored(self.predict_next_left), given)
            given = torch.where(h == m + 1, scored(self.predict_next_right), given)
        return given


def hub_penalty(attention: Tensor, lengths: Tensor) -> Tensor:
    """The mean over sentences of ``sum_h (expected children of h)^2 / n``: 1 for a chain-like
    spread (every word about one child), up to ``n`` for a hub that heads every word. ``attention``
    is the layer's ``[B, N+1, N+1]`` arc marginals; the root row is left out."""
    children = attention[:, 1:, 1:].sum(-1)  # [B, N]: expected number of children of each word
    return ((children ** 2).sum(-1) / lengths.to(children.dtype)).mean()


def train_epoch(model: ClozeModel, sentences: Sequence[Sentence], index: dict[str, int], optimizer: torch.optim.Optimizer,
                rng: random.Random, generator: torch.Generator, rate: float = 0.15, tokens_per_batch: int = 800,
                hub_weight: float = 0.0, targets: str = "masked", tag_index: dict[str, int] | None = None) -> tuple[float, int]:
    """One pass of the cloze task: the mean cross-entropy per masked word (``targets="all"``: every
    known word is a target and none is masked, only for the head objectives, whose word-given-head
    probabilities cannot pass the target through the choice of heads: ``p(w_i) <= max_h P(w_i | w_h)``,
    and no head is word ``i`` itself; with ``tag_index`` the tags are input and targets) (``hub_weight`` times
    :func:`hub_penalty` is added to the loss that is minimized, not to the one reported), and the
    number of batches skipped because the backward pass through the matrix-tree marginals failed (a
    singular Laplacian or non-finite gradients; ``NonProjectiveDependencyCRF.marginals``'s
    backward breaks down once arc scores spread over ~100 nats)."""
    model.train()
    total, count, skipped = 0.0, 0, 0
    for group in length_groups(sentences, tokens_per_batch, rng):
        batch = [sentences[i] for i in group]
        words, lengths = encode(batch, index)
        tags = encode(batch, tag_index, field="upos")[0] if tag_index else None
        if targets in ("all", "each"):
            known = words if tags is None else tags
            masked, chosen = words, (known > MASK) & (torch.arange(words.shape[1]) < lengths.unsqueeze(-1))
        else:
            masked, chosen = mask_words(words, lengths, rate, generator)
        loss, trees = model.loss(words, masked, lengths, chosen, tags, each=targets == "each")
        objective = loss + hub_weight * hub_penalty(trees.marginals, lengths) if hub_weight else loss
        optimizer.zero_grad()
        try:
            objective.backward()
        except torch.linalg.LinAlgError:
            skipped += 1
            continue
        if not all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None):
            skipped += 1
            continue
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        total += float(loss.detach()) * int(chosen.sum())
        count += int(chosen.sum())
    return total / max(count, 1), skipped


@torch.no_grad()
def induced_trees(model: ClozeModel, sentences: Sequence[Sentence], index: dict[str, int],
                  tokens_per_batch: int = 4000, tag_index: dict[str, int] | None = None) -> dict[str, list[list[int]]]:
    """The trees the layer induces, by the best-tree decode (single root) of its arc scores:
    ``masked`` (word i's head scores from the sentence with word i masked) and ``unmasked``; for
    the head objectives also ``posterior``, the best tree of :meth:`ClozeModel.posterior`."""
    model.eval()
    kinds = ("masked", "unmasked", "posterior") if model.objective in HEAD_OBJECTIVES else ("masked", "unmasked")
    out = {kind: [[] for _ in sentences] for kind in kinds}
    for group in length_groups(sentences, tokens_per_batch):
        batch = [sentences[i] for i in group]
        words, lengths = encode(batch, index)
        tags = encode(batch, tag_index, field="upos")[0] if tag_index else None
        trees = {kind: model.attention.structure(model.tree_scores(words, lengths, tags, kind == "masked"), lengths, True)
                 for kind in kinds[:2]}
        if "posterior" in kinds:
            trees["posterior"] = model.posterior(words, lengths, tags)
        for kind, distribution in trees.items():
            heads = distribution.decode()
            for b, i in enumerate(group):
                out[kind][i] = heads[b, :sentences[i].n].tolist()
    return out


def distill_epoch(student: ClozeModel, teacher: DMV, sentences: Sequence[Sentence], index: dict[str, int],
                  tag_index: dict[str, int], optimizer: torch.optim.Optimizer, rng: random.Random,
                  tokens_per_batch: int = 800) -> float:
    """One pass teaching the layer's distribution over the trees of the *words* the DMV's posterior
    over the trees of their *tags*: the cross-entropy ``E_{t ~ DMV(t | tags)}[-log p_layer(t | words)]
    = log Z(theta) - sum_{h,m} mu_DMV[h, m] theta[h, m]`` (the layer is edge-factored), per word,
    with the layer's arc scores ``theta`` from one pass over the plain sentence. Returns its mean."""

    def loss_of(batch: list[Sentence]) -> Tensor:
        words, lengths = encode(batch, index)
        with torch.no_grad():
            target = teacher.crf(encode(batch, tag_index, field="upos")[0], lengths)[0].marginals
        theta = student.tree_scores(words, lengths, masked=False)
        layer = student.attention.structure(theta, lengths, student.attention.single_root)
        return (layer.log_partition - (target * theta).sum((-2, -1))).sum() / lengths.sum()

    return run_epoch(student, sentences, loss_of, optimizer, rng, tokens_per_batch)


def without_punctuation(s: Sentence) -> Sentence:
    """``s`` without its punctuation (gold UPOS ``PUNCT``), as grammar induction reads text (Klein &
    Manning 2004); in its gold tree a punctuation head is replaced by its nearest other ancestor."""
    keep = [m for m, pos in enumerate(s.upos, 1) if pos != "PUNCT"]
    new = {m: i for i, m in enumerate(keep, 1)}

    def head(m: int) -> int:
        h = s.heads[m - 1]
        while h and h not in new:
            h = s.heads[h - 1]
        return new.get(h, 0)

    return Sentence(s.tokens, *(tuple(column[m - 1] for m in keep) for column in (s.words, s.upos)),
                    tuple(head(m) for m in keep), tuple(s.deprels[m - 1] for m in keep))


def has_words(s: Sentence) -> bool:
    """Whether ``s`` has a word that is not punctuation (gold UPOS)."""
    return any(pos != "PUNCT" for pos in s.upos)


def with_punctuation(s: Sentence, heads: Sequence[int]) -> list[int]:
    """The heads over all words of ``s`` of a tree ``heads`` over its words without punctuation
    (:func:`without_punctuation`): each punctuation mark attached to the word before it (the first
    word after it at the start of the sentence, the root if it has no other word)."""
    keep = [m for m, pos in enumerate(s.upos, 1) if pos != "PUNCT"]
    out = [0] * s.n
    for m, h in zip(keep, heads):
        out[m - 1] = keep[h - 1] if h else 0
    for m, pos in enumerate(s.upos, 1):
        if pos == "PUNCT":
            before = [k for k in keep if k < m]
            out[m - 1] = before[-1] if before else keep[0] if keep else (m + 1 if m < s.n else 0)
    return out


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = command_line("induce", __doc__)
    p.add_argument("--language", choices=sorted(LANGUAGES), default="en")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="a small slice and one epoch (seconds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-sentences", type=int, default=None, help="read at most this many sentences of each file")
    p.add_argument("--max-train-length", type=int, default=60)
    p.add_argument("--scores", choices=("bilinear", "dot"), default="bilinear")
    p.add_argument("--encoder", choices=ENCODERS, default="bilstm",
                   help="the arc scores: bilinear from a BiLSTM over the sentence, or (tree_autoencoder) from the head-dependent "
                        "distance only (a generative dependency model; read its posterior trees), or distance plus each "
                        "word's BiLSTM score as a head to its left and right (headness)")
    p.add_argument("--structure", choices=("nonprojective", "projective"), default="nonprojective",
                   help="the layer's trees: non-projective (matrix-tree, Liu & Lapata) or projective (Eisner, Kim et al.)")
    p.add_argument("--objective", choices=OBJECTIVES + ("dmv",), default="parent_children",
                   help="the context a masked word is predicted from: its soft parent and children, or its soft parent only")
    p.add_argument("--targets", choices=("masked", "all", "each"), default="masked",
                   help="predict the masked share of the words (--mask-rate), or (head objectives only) every word: `all` from "
                        "the unmasked sentence, `each` with its head scores from the sentence with it masked")
    p.add_argument("--mask-rate", type=float, default=0.15, help="the share of the words masked (targets masked)")
    p.add_argument("--values", choices=("words", "upos"), default="words",
                   help="what the head objectives predict from the head: words, or the POS tags (also an input beside the words)")
    p.add_argument("--adjacency", action="store_true",
                   help="head objectives: own word-given-head outputs for the two neighbouring heads (the DMV's adjacency)")
    p.add_argument("--uniform-epochs", type=int, default=0,
                   help="train the first this many epochs with uniform arc potentials (the word predictor learns from "
                        "every candidate head before the arc scorer commits to any, as IBM Model 1 before its alignments); "
                        "dmv: with a bias of -log|h - m| on every arc (toward short arcs, as Klein & Manning's harmonic start)")
    p.add_argument("--hub-penalty", type=float, default=0.0,
                   help="weight of the penalty on the squared expected number of children per word (see hub_penalty)")
    p.add_argument("--restarts", type=int, default=1,
                   help="dmv: train from seeds --seed .. --seed + restarts - 1 and keep the highest likelihood (no gold tree needed)")
    p.add_argument("--student-epochs", type=int, default=0,
                   help="dmv: then teach StructuredSelfAttention over the words (a BiLSTM, no tags) the DMV's posterior trees "
                        "for this many epochs, and read its trees too (`layer`)")
    p.add_argument("--drop-punct", action="store_true",
                   help="the model reads the sentences without punctuation (gold UPOS); each mark is attached to the word before it")
    p.add_argument("--evaluate", choices=("transductive", "dev", "test"), default="transductive",
                   help="transductive: the language's text, the evaluation file's included, trains and the evaluation file "
                        "is scored (the runs of 2026-11-25/26); English only: dev: the EWT dev and test files' text trains and "
                        "EWT dev is scored (choose settings here); test: the same training, English PUD (not in it) scored")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW's; keeps the arc scores moderate")
    p.add_argument("--data-dir", type=Path, default=default_data_dir(),
                   help="the shared data sets (default: $STRUCTURES_DATA_DIR, else ../shared/data beside the checkout)")
    p.add_argument("--out", type=Path, default=Path("results/induce"))
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    dmv = args.objective == "dmv"
    if (args.targets != "masked" or args.values == "upos") and args.objective not in HEAD_OBJECTIVES and not dmv:
        p.error(f"--targets all or each, --values upos: only with --objective {' or '.join(HEAD_OBJECTIVES)} (the other contexts would leak the word)")
    if dmv and args.values != "upos":
        p.error("--objective dmv: a model of POS tags, needs --values upos")
    if args.student_epochs and not dmv:
        p.error("--student-epochs: only with --objective dmv (the DMV is the teacher)")
    if args.evaluate != "transductive" and args.language != "en":
        p.error("--evaluate dev or test: English only (EWT's text trains, PUD is held out)")
    if args.quick:
        args.max_sentences = args.max_sentences or 40
        args.epochs = 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    wall = time.perf_counter()

    train_files, eval_file = LANGUAGES[args.language] if args.evaluate == "transductive" else HELD_OUT[args.evaluate]
    ud = args.data_dir / "ud"
    view = without_punctuation if args.drop_punct else (lambda s: s)
    train = [v for f in train_files for s in read_conllu(ud / f, args.max_sentences) if 0 < (v := view(s)).n <= args.max_train_length]
    test = read_conllu(ud / eval_file, args.max_sentences)
    shown = [view(s) if has_words(s) else s for s in test]  # what the model reads (punctuation only: read whole)
    index = word_index(train)
    tag_index = word_index(train, min_count=1, field="upos") if args.values == "upos" else None
    rng, generator = random.Random(args.seed), torch.Generator().manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"{args.language}_{args.scores}" + ("" if args.evaluate == "transductive" else f"_{args.evaluate}")
    if args.objective != "parent_children" or args.hub_penalty:
        name += f"_{args.objective}" + (f"_hub{args.hub_penalty:g}" if args.hub_penalty else "")
    if args.targets != "masked":
        name += f"_{args.targets}"
    elif args.mask_rate != 0.15:
        name += f"_rate{args.mask_rate:g}"
    if tag_index:
        name += "_upos"
    if args.structure == "projective":
        name += "_projective"
    if args.encoder != "bilstm":
        name += f"_{args.encoder}"
    if args.drop_punct:
        name += "_nopunct"
    if args.uniform_epochs:
        name += f"_uniform{args.uniform_epochs}"
    if args.student_epochs:
        name += f"_student{args.student_epochs}"
    if args.restarts > 1:
        name += f"_restarts{args.restarts}"
    if args.adjacency:
        name += "_adjacency"
    start = time.perf_counter()
    if dmv:
        model, losses, args.seed = fit_dmv(train, tag_index, args.epochs, args.uniform_epochs, args.lr, args.weight_decay,
                                           range(args.seed, args.seed + args.restarts))
        curve = [{"epoch": e + 1, "cloze_loss": loss, "skipped_batches": 0, "seconds": None, "stage": "train"} for e, loss in enumerate(losses)]
    else:
        model = ClozeModel(len(index), scores=args.scores, objective=args.objective, adjacency=args.adjacency,
                           tags=len(tag_index) if tag_index else 0, structure=args.structure, encoder=args.encoder)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        curve = []
        for epoch in (bar := Progress(range(args.epochs), desc=f"induce {args.language}")):
            model.arc_scale = 0.0 if epoch < args.uniform_epochs else 1.0
            loss, skipped = train_epoch(model, train, index, optimizer, rng, generator, rate=args.mask_rate, hub_weight=args.hub_penalty,
                                        targets=args.targets, tag_index=tag_index)
            curve.append({"epoch": epoch + 1, "cloze_loss": loss, "skipped_batches": skipped, "seconds": time.perf_counter() - start,
                          "stage": "train"})
            report(bar, epoch, loss=f"{loss:.3f}")
    train_seconds = time.perf_counter() - start

    start = time.perf_counter()
    induced = {"dmv": parses(model, shown, tag_index)} if dmv else induced_trees(model, shown, index, tag_index=tag_index)
    if args.student_epochs:  # the layer taught by the DMV: its trees from one pass over the words (no tags)
        student = ClozeModel(len(index), objective="parent", structure=args.structure)
        student_optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3, weight_decay=args.weight_decay)
        for epoch in Progress(range(args.student_epochs), desc="student"):
            loss = distill_epoch(student, model, train, index, tag_index, student_optimizer, rng)
            curve.append({"epoch": args.epochs + epoch + 1, "cloze_loss": loss, "skipped_batches": 0, "seconds": time.perf_counter() - start,
                          "stage": "student"})
        induced["layer"] = induced_trees(student, shown, index)["unmasked"]
    restored = ({k: [with_punctuation(s, h) if has_words(s) else h for s, h in zip(test, v)] for k, v in induced.items()}
                if args.drop_punct else induced)
    trees = {"gold": [list(s.heads) for s in test], **restored, **chain_trees(test)}
    short = [i for i, s in enumerate(test) if sum(pos != "PUNCT" for pos in s.upos) <= SHORT]
    for kind, heads in trees.items():  # (gold: the sentences scored; any two compare by significance parses)
        write_conllu(args.out / f"{name}_{kind}.conllu", test, heads)
    induce_seconds = time.perf_counter() - start
    wall = time.perf_counter() - wall
    rows = [{"language": args.language, "objective": args.objective, "targets": args.targets, "mask_rate": args.mask_rate, "values": args.values, "structure": args.structure, "encoder": args.encoder, "drop_punct": args.drop_punct, "student_epochs": args.student_epochs, "restarts": args.restarts, "hub_penalty": args.hub_penalty, "uniform_epochs": args.uniform_epochs, "adjacency": args.adjacency, "trees": k,
             "epochs": args.epochs, "seed": args.seed, "train_sentences": len(train),
             "eval_sentences": len(test), **score_trees(test, v),
             **{f"{key}_short": value for key, value in score_trees([test[i] for i in short], [v[i] for i in short]).items()
                if key in ("directed_no_punct", "undirected_no_punct")}, "short_sentences": len(short),
             "evaluate": args.evaluate, "final_cloze_loss": curve[args.epochs - 1]["cloze_loss"],
             "skipped_batches": sum(c["skipped_batches"] for c in curve),
             "train_s": train_seconds, "induce_s": induce_seconds, "wall_s": wall} for k, v in trees.items()]
    for path, table in ((args.out / f"{name}.csv", [{**r, **provenance([args.seed])} for r in rows]),
                        (args.out / f"{name}_epochs.csv", curve)):
        write_csv(path, table)
    (args.out / f"{name}.md").write_text(markdown_table(rows) + "\n" + provenance_line([args.seed]))
    draw(model, shown, index, {"gold": [list(s.heads) for s in shown], **induced, **chain_trees(shown)} if args.drop_punct else trees,
         args.out, name, tag_index=tag_index)
    print(markdown_table(rows))
    return rows


@torch.no_grad()
def draw(model: ClozeModel | DMV, sentences: Sequence[Sentence], index: dict[str, int], trees: dict[str, list[list[int]]],
         out: Path, name: str, shortest: int = 8, longest: int = 14, tag_index: dict[str, int] | None = None) -> None:
    """Arc diagrams (gold, induced, baselines) of one sentence, the depth histograms of every tree
    kind, and the heatmap of the layer's (or the DMV's) arc marginals on the plain sentence."""
    import matplotlib.pyplot as plt

    from .arcs import draw_marginals, draw_trees

    i = next((k for k, s in enumerate(sentences) if shortest <= s.n <= longest), 0)
    s = sentences[i]
    draw_trees(s.words, {k: v[i] for k, v in trees.items()}, out / f"{name}_trees.png", title=f"{s.sent_id} (red: arcs not in gold)")
    words, lengths = encode([s], index)
    tags = encode([s], tag_index, field="upos")[0] if tag_index else None
    layer = model.crf(tags, lengths)[0] if isinstance(model, DMV) else \
        model.attention.structure(model.tree_scores(words, lengths, tags, masked=False), lengths, model.attention.single_root)
    marginals = layer.marginals
    draw_marginals(s.words, marginals[0, :s.n + 1, :s.n + 1].tolist(), out / f"{name}_marginals.png", gold=list(s.heads),
                   title="arc marginals (plain sentence)")
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for k, v in trees.items():
        stats = TreeStatistics()
        for heads in v:
            stats.add(heads)
        depth = range(1, 16)
        ax.plot(depth, [stats.depth_counts.get(d, 0) / stats.words for d in depth], marker=".", label=k)
    ax.set_xlabel("depth")
    ax.set_ylabel("share of words")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{name}_depths.png", dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
