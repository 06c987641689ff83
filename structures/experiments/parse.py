"""Supervised graph-based dependency parsing on Universal Dependencies with the tree CRFs.

A biaffine parser (Dozat & Manning 2017): word embeddings + a character CNN per word, a BiLSTM,
MLP-reduced head and dependent vectors, biaffine arc scores ``scores[b, h, m]`` (the structures'
convention: index 0 is the root, ``[h, m]`` the arc head ``h`` -> modifier ``m``) and a bilinear
label classifier. Three training objectives over the same scores:

* ``projective``: ``-log p(gold tree)`` under :class:`structures.ProjectiveDependencyCRF`
  (single root). Its support is the projective trees, so sentences whose gold tree is not
  projective are left out of its training set (reported).
* ``nonprojective``: the same under :class:`structures.NonProjectiveDependencyCRF` (single root).
* ``local``: a softmax over the heads of every word, independently (the usual baseline).

Decoders: ``eisner`` (``ProjectiveDependencyCRF(...).decode()``), ``mst``
(``NonProjectiveDependencyCRF(...).decode()``: the maximum spanning arborescence) and, for the
local model, ``argmax`` (every word its best head; not necessarily a tree). Only dev and test
files exist for the treebanks here: the parser trains on the dev file and is evaluated on the
test file (and, with ``--pud``, also on a 1000-sentence PUD file of another domain). Evaluation
times the shared scoring, each decoder's decode and labelling, and the one-off first use of each
padded length apart (see :func:`evaluate`).

    python -m structures.experiments.parse --treebank lassysmall --loss nonprojective --epochs 20
"""

from __future__ import annotations

import csv
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import torch
from torch import Tensor, nn
from tqdm import tqdm

from structures import NonProjectiveDependencyCRF, ProjectiveDependencyCRF

from .attachment import Attachment, TreeShapes, is_projective
from . import command_line, default_data_dir
from .ud import PUD, TREEBANKS, Sentence, read_conllu, write_conllu

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


def train_epoch(model: BiaffineParser, sentences: Sequence[Sentence], vocab: Vocab, kind: str,
                optimizer: torch.optim.Optimizer, rng: random.Random, tokens_per_batch: int = 500) -> float:
    """One pass over ``sentences`` in a random order of length-sorted batches; the mean loss per word."""
    model.train()
    total, words = 0.0, 0
    for batch in batches(sentences, vocab, tokens_per_batch, shuffle=rng):
        h = model.encode(batch)
        loss = arc_loss(kind, model.arc_scores(h), batch.lengths, batch.heads)
        labels = model.label_scores(h, batch.heads)
        inside = torch.arange(batch.heads.shape[1]) < batch.lengths.unsqueeze(-1)
        loss = loss + nn.functional.cross_entropy(labels[inside], batch.labels[inside], reduction="sum") / len(batch.index)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        total += float(loss.detach()) * len(batch.index)
        words += int(batch.lengths.sum())
    return total / max(words, 1)


@dataclass
class Evaluation:
    """What one decoder achieved on an evaluation file."""

    decoder: str
    attachment: Attachment
    shapes: TreeShapes
    decode_seconds: float = 0.0
    first_use_seconds: float = 0.0
    label_seconds: float = 0.0
    heads: list[list[int]] = field(default_factory=list)
    labels: list[list[str]] = field(default_factory=list)


@torch.no_grad()
@torch.no_grad()
def evaluate(model: BiaffineParser, sentences: Sequence[Sentence], vocab: Vocab, decoders: Sequence[str],
             tokens_per_batch: int = 5000) -> tuple[dict[str, Evaluation], float]:
    """Parse every sentence with each decoder; returns the evaluations and the seconds spent
    batching, encoding and scoring arcs (shared by the decoders; each decoder's decode and
    labelling are its own).

    The first time a decoder meets a padded length it first decodes the batch's first sentence
    alone, timed apart as ``first_use_seconds``: Eisner's program builds its schedule once per
    length (cached after), a one-off cost that ``decode_seconds`` then leaves out."""
    model.eval()
    results = {d: Evaluation(d, Attachment(), TreeShapes(), heads=[[] for _ in sentences],
                             labels=[[] for _ in sentences]) for d in decoders}
    scoring = 0.0
    seen: dict[str, set[int]] = {d: set() for d in decoders}
    for group in length_groups(sentences, tokens_per_batch):
        start = time.perf_counter()
        batch = make_batch(sentences, group, vocab)
        h = model.encode(batch)
        scores = model.arc_scores(h)
        scoring += time.perf_counter() - start
        for d in decoders:
            if scores.shape[-1] not in seen[d]:
                seen[d].add(scores.shape[-1])
                start = time.perf_counter()
                decode(d, scores[:1], batch.lengths[:1])
                results[d].first_use_seconds += time.perf_counter() - start
            start = time.perf_counter()
            heads = decode(d, scores, batch.lengths)
            results[d].decode_seconds += time.perf_counter() - start
            start = time.perf_counter()
            labels = model.label_scores(h, heads).argmax(-1)
            results[d].label_seconds += time.perf_counter() - start
            for b, i in enumerate(batch.index):
                s = sentences[i]
                results[d].heads[i] = heads[b, :s.n].tolist()
                results[d].labels[i] = [vocab.labels[j] for j in labels[b, :s.n].tolist()]
    for r in results.values():
        for s, heads, labels in zip(sentences, r.heads, r.labels):
            r.attachment.add(s.heads, heads, s.upos, s.deprels, labels)
            r.shapes.add(heads)
    return results, scoring


def arc_marginals(kind: str, scores: Tensor, lengths: Tensor) -> Tensor:
    """``[B, N+1, N+1]`` arc marginals of the model a loss trains (for the local model: its
    per-word head distributions)."""
    if kind == "projective":
        return ProjectiveDependencyCRF(scores, lengths, single_root=True).marginals
    if kind == "nonprojective":
        return NonProjectiveDependencyCRF(scores, lengths, single_root=True).marginals
    return local_log_probs(scores, lengths).exp()


@torch.no_grad()
def draw_example(model: BiaffineParser, s: Sentence, vocab: Vocab, kind: str, out: Path, name: str) -> list[Path]:
    """Arc diagrams (gold and every decoder's tree) and the arc-marginal heatmap of one sentence."""
    from .arcs import draw_marginals, draw_trees

    model.eval()
    batch = make_batch([s], [0], vocab)
    scores = model.arc_scores(model.encode(batch))
    trees = {"gold": list(s.heads)}
    trees.update({f"{kind} model, {d} decode": decode(d, scores, batch.lengths)[0, :s.n].tolist() for d in DECODERS[kind]})
    paths = [out / f"{name}_trees.png", out / f"{name}_marginals.png"]
    draw_trees(s.words, trees, paths[0], title=f"{s.sent_id} (red: arcs not in gold)")
    draw_marginals(s.words, arc_marginals(kind, scores, batch.lengths)[0, :s.n + 1, :s.n + 1].tolist(), paths[1],
                   gold=list(s.heads), title=f"{kind} model: arc marginals")
    return paths


def example_sentence(sentences: Sequence[Sentence], shortest: int = 8, longest: int = 16) -> Sentence:
    """The first sentence of a moderate length whose gold tree is not projective (else the first of that length)."""
    fitting = [s for s in sentences if shortest <= s.n <= longest] or list(sentences)
    return next((s for s in fitting if not is_projective(s.heads)), fitting[0])


def load_treebank(data_dir: Path, treebank: str, max_sentences: int | None = None) -> tuple[list[Sentence], list[Sentence]]:
    """(training sentences, evaluation sentences) of a treebank (see ``TREEBANKS``)."""
    train_file, eval_file = TREEBANKS[treebank]
    return (read_conllu(data_dir / "ud" / train_file, max_sentences), read_conllu(data_dir / "ud" / eval_file, max_sentences))


def training_set(sentences: Sequence[Sentence], kind: str, max_length: int) -> list[Sentence]:
    """The sentences a loss trains on: at most ``max_length`` words, and for the projective CRF
    only sentences whose gold tree is projective (the others have probability 0 under it)."""
    return [s for s in sentences if s.n <= max_length and (kind != "projective" or is_projective(s.heads))]


def build(train: Sequence[Sentence], seed: int) -> tuple[Vocab, BiaffineParser]:
    torch.manual_seed(seed)
    vocab = Vocab.build(train)
    return vocab, BiaffineParser(vocab)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = command_line("parse", __doc__)
    p.add_argument("--treebank", choices=sorted(TREEBANKS), default="lassysmall")
    p.add_argument("--loss", choices=LOSSES, default="nonprojective")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="a small slice and one epoch (seconds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-sentences", type=int, default=None, help="read at most this many sentences of each file")
    p.add_argument("--max-train-length", type=int, default=100, help="train on sentences of at most this many words (evaluation uses all)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--data-dir", type=Path, default=default_data_dir(),
                   help="the shared data sets (default: $STRUCTURES_DATA_DIR, else ../shared/data beside the checkout)")
    p.add_argument("--out", type=Path, default=Path("results/parse"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--pud", choices=sorted(PUD), default=None,
                   help="also evaluate on this language's PUD file (1000 sentences, another domain)")
    args = p.parse_args(argv)
    if args.quick:
        args.max_sentences = args.max_sentences or 60
        args.epochs = 1
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    wall = time.perf_counter()

    train_all, test = load_treebank(args.data_dir, args.treebank, args.max_sentences)
    train = training_set(train_all, args.loss, args.max_train_length)
    vocab, model = build(train, args.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.9))
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"{args.treebank}_{args.loss}"
    start = time.perf_counter()
    curve = []
    for epoch in (bar := tqdm(range(args.epochs), desc=f"{args.treebank} {args.loss}")):
        loss = train_epoch(model, train, vocab, args.loss, optimizer, rng)
        curve.append({"epoch": epoch + 1, "loss_per_word": loss, "seconds": time.perf_counter() - start})
        bar.set_postfix(loss=f"{loss:.3f}")
    train_seconds = time.perf_counter() - start
    with open(args.out / f"{name}_epochs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(curve[0]))
        w.writeheader()
        w.writerows(curve)
    # plain containers only: a pickled Vocab would name __main__.Vocab and load nowhere else; Vocab(**ck["vocab"]) restores it
    torch.save({"state": model.state_dict(), "vocab": asdict(vocab), "args": vars(args)}, args.out / f"{name}.pt")

    evaluated = [(args.treebank, test)]
    if args.pud:
        evaluated.append((f"pud-{args.pud}", read_conllu(args.data_dir / "ud" / PUD[args.pud], args.max_sentences)))
    rows = []
    for eval_name, sentences in evaluated:
        start = time.perf_counter()
        evaluations, scoring = evaluate(model, sentences, vocab, DECODERS[args.loss])
        eval_seconds = time.perf_counter() - start
        for d, r in evaluations.items():
            a, shapes = r.attachment, r.shapes.fractions()
            rows.append({
                "treebank": args.treebank, "loss": args.loss, "eval_file": eval_name, "decoder": d, "epochs": args.epochs,
                "seed": args.seed, "train_sentences": len(train), "train_sentences_read": len(train_all),
                "eval_sentences": len(sentences),
                "uas": a.uas, "las": a.las, "uas_no_punct": a.uas_no_punct, "las_no_punct": a.las_no_punct,
                "valid": shapes["valid"], "single_root": shapes["single_root"], "projective": shapes["projective"],
                "non_projective": shapes["non_projective"],
                "score_s": scoring, "decode_s": r.decode_seconds, "label_s": r.label_seconds,
                "first_use_s": r.first_use_seconds,
                "decode_share": r.decode_seconds / (scoring + r.label_seconds + r.decode_seconds),
                "decode_share_cold": (r.decode_seconds + r.first_use_seconds)
                / (scoring + r.label_seconds + r.decode_seconds + r.first_use_seconds),
                "train_s": train_seconds, "eval_s": eval_seconds,
            })
            suffix = "" if eval_name == args.treebank else f"_{eval_name}"
            write_conllu(args.out / f"{name}{suffix}_{d}.conllu", sentences, r.heads, r.labels)
    wall = time.perf_counter() - wall
    for r in rows:
        r["wall_s"] = wall
    with open(args.out / f"{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (args.out / f"{name}.md").write_text(markdown_table(rows))
    draw_example(model, example_sentence(test), vocab, args.loss, args.out, name)
    print(markdown_table(rows))
    return rows


def markdown_table(rows: Sequence[dict]) -> str:
    cols = list(rows[0])
    fmt = lambda v: f"{v:.4f}" if isinstance(v, float) and abs(v) <= 1 else (f"{v:.1f}" if isinstance(v, float) else str(v))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
