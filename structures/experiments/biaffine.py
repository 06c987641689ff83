"""The biaffine dependency parser on CoNLL-U: vocabulary, padded batches, its arc losses and
decoders, and checkpoints that load with plain ``torch.load``; the model is
:class:`structures.nn.parser.BiaffineParser` (no conllu needed).

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
from torch import Tensor

from structures import NonProjectiveDependencyCRF, ProjectiveDependencyCRF
from structures.nn.parser import PAD, ROOT, UNK, BiaffineParser

from .ud import Sentence

LOSSES = ("projective", "nonprojective", "local")
DECODERS = {"projective": ("eisner", "mst"), "nonprojective": ("mst", "eisner"), "local": ("argmax", "mst", "eisner")}
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


def parser_for(vocab: Vocab, **config: Any) -> BiaffineParser:
    """A :class:`BiaffineParser` sized for ``vocab``'s words, characters and labels."""
    return BiaffineParser(len(vocab.words), len(vocab.chars), len(vocab.labels), **config)


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
OLD_NAMES = {"biaffine": "biaffine.weight", "head_bias": "biaffine.bias"}


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
    model = parser_for(vocab, **saved["config"])
    # checkpoints saved before the arc scorer was structures.nn.Biaffine name its parameters so
    state = {OLD_NAMES.get(k, k): v for k, v in saved["state"].items()}
    model.load_state_dict(state)
    return Checkpoint(model.eval(), vocab, saved["loss"], saved["info"])
