"""The biaffine dependency parser: vocabulary, padded batches, the model, its arc losses and
decoders, and checkpoints that load with plain ``torch.load``.

Scores are ``scores[b, h, m]`` ``[B, N+1, N+1]`` (the structures' convention: index 0 is the root,
``[h, m]`` the arc head ``h`` -> modifier ``m``). The command line is
:mod:`structures.experiments.parse`.
"""

from __future__ import annotations

import pickle
import random
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor, nn

from structures import NonProjectiveDependencyCRF, ProjectiveDependencyCRF

from .ud import Sentence

LOSSES = ("projective", "nonprojective", "local")
DECODERS = {"projective": ("eisner", "mst"), "nonprojective": ("mst", "eisner"), "local": ("argmax", "mst", "eisner")}
PAD, UNK, ROOT = 0, 1, 2
MAX_WORD_CHARS = 20


@dataclass
class Vocab:
    """Indices of (lower-cased) words, characters and dependency labels seen in training."""

    words: dict[str, int]
    chars: dict[str, int]
    labels: list[str]

    @classmethod
    def build(cls, sentences: Sequence[Sentence], min_count: int = 2) -> "Vocab":
        counts = Counter(w.lower() for s in sentences for w in s.words)
        chars = Counter(c for s in sentences for w in s.words for c in w)
        specials = {"<pad>": PAD, "<unk>": UNK, "<root>": ROOT}
        words = {**specials, **{w: i + 3 for i, w in enumerate(sorted(w for w, c in counts.items() if c >= min_count))}}
        return cls(words, {**specials, **{c: i + 3 for i, c in enumerate(sorted(chars))}},
                   sorted({r for s in sentences for r in s.deprels}))

    def label_index(self, label: str) -> int:
        return self.labels.index(label) if label in self.labels else 0


@dataclass
class Batch:
    """Sentences padded to ``N`` words (a bucket length); position 0 is the root everywhere.

    ``words [B, N+1]``, ``chars [B, N+1, MAX_WORD_CHARS]``, ``lengths [B]`` (words, root not
    counted), ``heads [B, N]`` and ``labels [B, N]`` (gold; 0 past each length), ``index``: the
    sentences' positions in the list they came from.
    """

    words: Tensor
    chars: Tensor
    lengths: Tensor
    heads: Tensor
    labels: Tensor
    index: list[int]


def make_batch(sentences: Sequence[Sentence], index: Sequence[int], vocab: Vocab, bucket: int = 8) -> Batch:
    """Pad the sentences at ``index`` to the next multiple of ``bucket`` words (compiled CRF
    programs are cached per length, so few distinct lengths means few compilations)."""
    chosen = [sentences[i] for i in index]
    n = max(s.n for s in chosen)
    N = -(-n // bucket) * bucket
    B = len(chosen)
    words = torch.full((B, N + 1), PAD, dtype=torch.long)
    chars = torch.full((B, N + 1, MAX_WORD_CHARS), PAD, dtype=torch.long)
    heads = torch.zeros(B, N, dtype=torch.long)
    labels = torch.zeros(B, N, dtype=torch.long)
    words[:, 0] = ROOT
    chars[:, 0, 0] = ROOT
    for b, s in enumerate(chosen):
        words[b, 1:s.n + 1] = torch.tensor([vocab.words.get(w.lower(), UNK) for w in s.words])
        for i, w in enumerate(s.words, 1):
            ids = [vocab.chars.get(c, UNK) for c in w[:MAX_WORD_CHARS]]
            chars[b, i, :len(ids)] = torch.tensor(ids)
        heads[b, :s.n] = torch.tensor(s.heads)
        labels[b, :s.n] = torch.tensor([vocab.label_index(r) for r in s.deprels])
    return Batch(words, chars, torch.tensor([s.n for s in chosen]), heads, labels, list(index))


def length_groups(sentences: Sequence[Sentence], tokens_per_batch: int, shuffle: random.Random | None = None) -> list[list[int]]:
    """Indices of sentences grouped by similar length (sorted by length, about ``tokens_per_batch``
    padded words per group); the groups in a random order if ``shuffle`` (a seeded ``random.Random``)."""
    order = sorted(range(len(sentences)), key=lambda i: sentences[i].n)
    groups, current = [], []
    for i in order:
        if current and (len(current) + 1) * sentences[i].n > tokens_per_batch:
            groups.append(current)
            current = []
        current.append(i)
    groups += [current] if current else []
    if shuffle is not None:
        shuffle.shuffle(groups)
    return groups


def batches(sentences: Sequence[Sentence], vocab: Vocab, tokens_per_batch: int = 1000,
            shuffle: random.Random | None = None) -> Iterator[Batch]:
    """The :func:`length_groups` of ``sentences`` as batches."""
    for g in length_groups(sentences, tokens_per_batch, shuffle):
        yield make_batch(sentences, g, vocab)


class CharCNN(nn.Module):
    """A word's characters -> one vector: embeddings, a width-3 convolution, max over positions."""

    def __init__(self, n_chars: int, dim: int = 32, out: int = 100):
        super().__init__()
        self.embed = nn.Embedding(n_chars, dim, padding_idx=PAD)
        self.conv = nn.Conv1d(dim, out, 3, padding=1)

    def forward(self, chars: Tensor) -> Tensor:
        """``chars [B, T, C]`` -> ``[B, T, out]``."""
        B, T, C = chars.shape
        x = self.conv(self.embed(chars.view(B * T, C)).transpose(1, 2))
        x = x.masked_fill((chars.view(B * T, 1, C) == PAD), float("-inf")).amax(-1)
        return torch.nan_to_num(x, neginf=0.0).view(B, T, -1)


class BiaffineParser(nn.Module):
    """Arc scores ``[B, N+1, N+1]`` (``[b, h, m]``) and label scores of a batch of sentences."""

    def __init__(self, vocab: Vocab, word_dim: int = 100, char_dim: int = 100, hidden: int = 200, layers: int = 2,
                 arc_dim: int = 200, label_dim: int = 100, dropout: float = 0.33):
        super().__init__()
        self.config = {"word_dim": word_dim, "char_dim": char_dim, "hidden": hidden, "layers": layers,
                       "arc_dim": arc_dim, "label_dim": label_dim, "dropout": dropout}
        self.word = nn.Embedding(len(vocab.words), word_dim, padding_idx=PAD)
        self.char = CharCNN(len(vocab.chars), out=char_dim)
        self.lstm = nn.LSTM(word_dim + char_dim, hidden, layers, batch_first=True, bidirectional=True, dropout=dropout)
        self.dropout = nn.Dropout(dropout)
        self.arc_head, self.arc_dep = (nn.Sequential(nn.Linear(2 * hidden, arc_dim), nn.LeakyReLU(0.1), nn.Dropout(dropout)) for _ in range(2))
        self.label_head, self.label_dep = (nn.Sequential(nn.Linear(2 * hidden, label_dim), nn.LeakyReLU(0.1), nn.Dropout(dropout)) for _ in range(2))
        self.biaffine = nn.Parameter(torch.zeros(arc_dim, arc_dim))
        self.head_bias = nn.Parameter(torch.zeros(arc_dim))
        self.label = nn.Bilinear(label_dim, label_dim, len(vocab.labels))
        self.word_dropout = dropout

    def encode(self, batch: Batch) -> Tensor:
        """BiLSTM states ``[B, N+1, 2*hidden]`` (position 0 the root)."""
        words = batch.words
        if self.training:  # word dropout: the embedding learns an <unk> that stands for rare words
            words = words.masked_fill((torch.rand(words.shape) < self.word_dropout) & (words > ROOT), UNK)
        x = self.dropout(torch.cat([self.word(words), self.char(batch.chars)], -1))
        packed = nn.utils.rnn.pack_padded_sequence(x, batch.lengths + 1, batch_first=True, enforce_sorted=False)
        h, _ = self.lstm(packed)
        h, _ = nn.utils.rnn.pad_packed_sequence(h, batch_first=True, total_length=x.shape[1])
        return self.dropout(h)

    def arc_scores(self, h: Tensor) -> Tensor:
        """``scores[b, h, m]`` ``[B, N+1, N+1]`` = dep_m^T U head_h + u^T head_h."""
        head, dep = self.arc_head(h), self.arc_dep(h)
        return torch.einsum("bmi,ij,bhj->bhm", dep, self.biaffine, head) + (head @ self.head_bias).unsqueeze(-1)

    def label_scores(self, h: Tensor, heads: Tensor) -> Tensor:
        """Label scores ``[B, N, L]`` of every word ``1..N`` given its head ``heads [B, N]``."""
        head, dep = self.label_head(h), self.label_dep(h)
        head_of = head.gather(1, heads.unsqueeze(-1).expand(-1, -1, head.shape[-1]))
        return self.label(dep[:, 1:].contiguous(), head_of.contiguous())


def local_log_probs(scores: Tensor, lengths: Tensor) -> Tensor:
    """``log p(head h | word m)`` ``[B, N+1, N+1]`` of the local model: a softmax over the
    heads ``0..n`` (not ``m`` itself) of every word."""
    N1 = scores.shape[-1]
    pos = torch.arange(N1)
    allowed = (pos.view(1, N1, 1) <= lengths.view(-1, 1, 1)) & (pos.view(N1, 1) != pos.view(1, N1))
    return scores.masked_fill(~allowed, float("-inf")).log_softmax(-2)


def arc_loss(kind: str, scores: Tensor, lengths: Tensor, heads: Tensor) -> Tensor:
    """Mean over the batch of ``-log p(gold heads)`` (summed over the words of a sentence)."""
    # gold trees are trees (the projective loss trains on the projective ones): their log-probability
    # is score - log Z, without log_prob's check that a value is a structure (a Max run per batch)
    if kind in ("projective", "nonprojective"):
        crf = ProjectiveDependencyCRF if kind == "projective" else NonProjectiveDependencyCRF
        d = crf(scores, lengths, single_root=True)
        return -(d.score(heads) - d.log_partition).mean()
    if kind == "local":
        logp = local_log_probs(scores, lengths)[:, :, 1:].gather(1, heads.unsqueeze(1)).squeeze(1)
        inside = torch.arange(heads.shape[1]) < lengths.unsqueeze(-1)
        return -(logp * inside).sum(-1).mean()
    raise ValueError(f"kind: expected one of {LOSSES}, got {kind!r}")


def decode(decoder: str, scores: Tensor, lengths: Tensor) -> Tensor:
    """Heads ``[B, N]`` of scores ``[B, N+1, N+1]`` by ``eisner``, ``mst`` or ``argmax``."""
    if decoder == "eisner":
        return ProjectiveDependencyCRF(scores, lengths, single_root=True).decode()
    if decoder == "mst":
        return NonProjectiveDependencyCRF(scores, lengths, single_root=True).decode()
    if decoder == "argmax":
        heads = local_log_probs(scores, lengths)[:, :, 1:].argmax(1)
        return heads * (torch.arange(heads.shape[1]) < lengths.unsqueeze(-1))
    raise ValueError(f"decoder: expected eisner, mst or argmax, got {decoder!r}")


def arc_marginals(kind: str, scores: Tensor, lengths: Tensor) -> Tensor:
    """``[B, N+1, N+1]`` arc marginals of the model a loss trains (for the local model: its
    per-word head distributions)."""
    if kind == "projective":
        return ProjectiveDependencyCRF(scores, lengths, single_root=True).marginals
    if kind == "nonprojective":
        return NonProjectiveDependencyCRF(scores, lengths, single_root=True).marginals
    return local_log_probs(scores, lengths).exp()


CHECKPOINT_FORMAT = "structures.experiments.parse/1"


def save_checkpoint(path: str | Path, model: BiaffineParser, vocab: Vocab, loss: str, info: dict[str, Any]) -> None:
    """Save a parser as plain containers and tensors only, so that ``torch.load(path)`` (torch's
    default ``weights_only=True``) loads it anywhere: ``{"format", "loss", "vocab", "config",
    "state", "info"}``; ``info`` must hold only str, int, float, bool, None, lists and dicts."""
    torch.save({"format": CHECKPOINT_FORMAT, "loss": loss, "vocab": asdict(vocab), "config": dict(model.config),
                "state": model.state_dict(), "info": info}, path)


@dataclass
class Checkpoint:
    """A loaded parser: the model (in eval mode), its vocabulary, the loss it was trained with and
    the ``info`` saved with it."""

    model: BiaffineParser
    vocab: Vocab
    loss: str
    info: dict[str, Any]


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Load what :func:`save_checkpoint` saved; ``ValueError`` naming the file if it is missing, not a
    torch file, or a torch file of another kind."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint {path}: no such file")
    try:
        saved = torch.load(path, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        reason = str(e).split(". ")[0]  # torch's weights-only message goes on about trusting the source
        raise ValueError(f"checkpoint {path}: not a file torch.load reads ({type(e).__name__}: {reason})") from e
    if not isinstance(saved, dict) or saved.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {path}: not a parser checkpoint (expected format {CHECKPOINT_FORMAT!r}, got "
                         f"{saved.get('format') if isinstance(saved, dict) else type(saved).__name__!r})")
    vocab = Vocab(**saved["vocab"])
    model = BiaffineParser(vocab, **saved["config"])
    model.load_state_dict(saved["state"])
    return Checkpoint(model.eval(), vocab, saved["loss"], saved["info"])
