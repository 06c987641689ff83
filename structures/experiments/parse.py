"""Supervised graph-based dependency parsing on Universal Dependencies with the tree CRFs.

``python -m structures.experiments.parse train|evaluate|predict``: train a biaffine parser
(:mod:`structures.experiments.biaffine`) and evaluate it on a treebank's test file, evaluate a
saved checkpoint on any CoNLL-U file, or parse CoNLL-U or raw tokenized text (one sentence per
line, tokens separated by spaces) into CoNLL-U. Without a subcommand it trains (so ``parse
--treebank ... --loss ...`` works as it always has).

Three training objectives over the same arc scores:

* ``projective``: ``-log p(gold tree)`` under :class:`structures.ProjectiveDependencyCRF`
  (single root). Its support is the projective trees, so sentences whose gold tree is not
  projective are left out of its training set (reported).
* ``nonprojective``: the same under :class:`structures.NonProjectiveDependencyCRF` (single root).
* ``local``: a softmax over the heads of every word, independently (the usual baseline).

Decoders: ``eisner`` (``ProjectiveDependencyCRF(...).decode()``), ``mst``
(``NonProjectiveDependencyCRF(...).decode()``: the maximum spanning arborescence) and, for the
local model, ``argmax`` (every word its best head; not necessarily a tree). Only dev and test
files exist for the treebanks here: the parser trains on the dev file, minus a deterministic
``--dev-fraction`` of its sentences held out to pick the best epoch (early stopping on held-out
LAS, then UAS), and is evaluated on the test file (and, with ``--pud``, also on a 1000-sentence
PUD file of another domain). UAS and LAS are the CoNLL 2018 shared task's
(:mod:`structures.experiments.attachment`). Evaluation times the shared scoring, each decoder's
decode and labelling, and the one-off first use of each padded length apart (see
:func:`evaluate`).

    python -m structures.experiments.parse train --treebank lassysmall --loss nonprojective --epochs 20
    python -m structures.experiments.parse evaluate results/parse/lassysmall_nonprojective.pt test.conllu
    python -m structures.experiments.parse predict results/parse/lassysmall_nonprojective.pt input.txt --output parsed.conllu
"""

from __future__ import annotations

import argparse
import copy
import csv
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from . import command_line, default_data_dir
from .attachment import Attachment, TreeShapes, is_projective
from .provenance import provenance, provenance_line
from .progress import Progress, report
from .biaffine import (DECODERS, LOSSES, BiaffineParser, Checkpoint, Vocab, arc_loss, arc_marginals, batches, decode,
                       length_groups, load_checkpoint, make_batch, parser_for, save_checkpoint)
from .ud import PUD, TREEBANKS, Sentence, read_conllu, read_sentences, write_conllu

DEV_SPLIT_SEED = 0  # the held-out dev sentences do not change with --seed, so seeds compare on the same split


def train_epoch(model: BiaffineParser, sentences: Sequence[Sentence], vocab: Vocab, kind: str,
                optimizer: torch.optim.Optimizer, rng: random.Random, tokens_per_batch: int = 500) -> float:
    """One pass over ``sentences`` in a random order of length-sorted batches; the mean loss per word."""
    model.train()
    total, words = 0.0, 0
    for batch in batches(sentences, vocab, tokens_per_batch, shuffle=rng):
        h = model.encode(batch.words, batch.chars, batch.lengths)
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
        h = model.encode(batch.words, batch.chars, batch.lengths)
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


@torch.no_grad()
def draw_example(model: BiaffineParser, s: Sentence, vocab: Vocab, kind: str, out: Path, name: str) -> list[Path]:
    """Arc diagrams (gold and every decoder's tree) and the arc-marginal heatmap of one sentence."""
    from .arcs import draw_marginals, draw_trees

    model.eval()
    batch = make_batch([s], [0], vocab)
    scores = model.arc_scores(model.encode(batch.words, batch.chars, batch.lengths))
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


def split_dev(sentences: Sequence[Sentence], fraction: float) -> tuple[list[Sentence], list[Sentence]]:
    """(training, dev) sentences: ``fraction`` of them (at least one when ``fraction > 0``), chosen
    by a fixed-seed draw, held out as dev; both keep the file's order."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction: expected 0 <= fraction < 1, got {fraction}")
    k = max(1, round(fraction * len(sentences))) if fraction > 0 else 0
    held = set(random.Random(DEV_SPLIT_SEED).sample(range(len(sentences)), min(k, len(sentences))))
    return ([s for i, s in enumerate(sentences) if i not in held], [s for i, s in enumerate(sentences) if i in held])


def training_set(sentences: Sequence[Sentence], kind: str, max_length: int) -> list[Sentence]:
    """The sentences a loss trains on: at most ``max_length`` words, and for the projective CRF
    only sentences whose gold tree is projective (the others have probability 0 under it)."""
    return [s for s in sentences if s.n <= max_length and (kind != "projective" or is_projective(s.heads))]


def build(train: Sequence[Sentence], seed: int) -> tuple[Vocab, BiaffineParser]:
    torch.manual_seed(seed)
    vocab = Vocab.build(train)
    return vocab, parser_for(vocab)


@dataclass
class EarlyStopping:
    """The best epoch so far by a score (higher is better; ties keep the earlier epoch) and whether
    ``patience`` epochs have passed without improving on it."""

    patience: int
    best_epoch: int = 0
    best_score: tuple[float, ...] | None = None
    since_best: int = 0

    def update(self, epoch: int, score: tuple[float, ...]) -> bool:
        """Record an epoch's score; True if it is the new best."""
        if self.best_score is None or score > self.best_score:
            self.best_epoch, self.best_score, self.since_best = epoch, score, 0
            return True
        self.since_best += 1
        return False

    @property
    def stop(self) -> bool:
        return self.since_best >= self.patience


def fit(model: BiaffineParser, vocab: Vocab, train: Sequence[Sentence], dev: Sequence[Sentence], kind: str,
        epochs: int, patience: int, lr: float, seed: int, on_best: Callable[[int, dict], None],
        desc: str = "train") -> tuple[list[dict], int]:
    """Train for at most ``epochs``; after each epoch score ``dev`` (decoded by the loss's first
    decoder) and, when its (LAS, UAS) is the best so far, call ``on_best(epoch, row)``. Stops
    after ``patience`` epochs without improvement and leaves the model with the best epoch's
    weights. Without dev sentences every epoch counts as the best (the last one is kept).

    Returns the per-epoch rows (``epoch``, ``loss_per_word``, ``dev_uas``, ``dev_las``,
    ``seconds``) and the best epoch (1-based)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.9))
    rng = random.Random(seed)
    stopping = EarlyStopping(patience)
    best_state, curve, start = None, [], time.perf_counter()
    for epoch in (bar := Progress(range(1, epochs + 1), desc=desc)):
        loss = train_epoch(model, train, vocab, kind, optimizer, rng)
        row = {"epoch": epoch, "loss_per_word": loss, "dev_uas": None, "dev_las": None}
        if dev:
            a = evaluate(model, dev, vocab, DECODERS[kind][:1])[0][DECODERS[kind][0]].attachment
            row.update(dev_uas=a.uas, dev_las=a.las)
        row["seconds"] = time.perf_counter() - start
        curve.append(row)
        report(bar, epoch, loss=f"{loss:.3f}", **({"dev_las": f"{row['dev_las']:.3f}"} if dev else {}))
        if stopping.update(epoch, (row["dev_las"], row["dev_uas"]) if dev else (epoch,)):
            best_state = copy.deepcopy(model.state_dict())
            on_best(epoch, row)
        if stopping.stop:
            break
    model.load_state_dict(best_state)
    return curve, stopping.best_epoch


def plain(args: argparse.Namespace) -> dict[str, Any]:
    """The options as plain values (paths as strings), which ``torch.load``'s default accepts."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def markdown_table(rows: Sequence[dict]) -> str:
    cols = list(rows[0])
    fmt = lambda v: f"{v:.4f}" if isinstance(v, float) and abs(v) <= 1 else (f"{v:.1f}" if isinstance(v, float) else str(v))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_csv(path: Path, rows: Sequence[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def existing(p: argparse.ArgumentParser, option: str, path: Path) -> Path:
    """``path`` if it is a file; else exit with a usage error naming the option."""
    if not path.is_file():
        p.error(f"{option} {path}: no such file")
    return path


def read(p: argparse.ArgumentParser, option: str, path: Path, reader: Callable[[Path], list[Sentence]]) -> list[Sentence]:
    """The sentences ``reader`` reads from ``path``; a usage error naming the option if the file is
    missing or malformed."""
    try:
        return reader(existing(p, option, path))
    except ValueError as e:
        p.error(f"{option} {path}: {e}")


def arguments() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command's parser and its subcommands' parsers by name."""
    p = command_line("parse", __doc__)
    p.description += " Without a subcommand: train (its options: `train --help`)."
    sub = p.add_subparsers(dest="command", metavar="{train,evaluate,predict}")
    kw = {"formatter_class": p.formatter_class}

    t = sub.add_parser("train", help="train on a treebank, keep the best dev epoch, evaluate on its test file",
                       description="Train a parser (early stopping on held-out dev sentences), save its checkpoint, "
                                   "evaluate it on the test file; tables, CoNLL-U outputs and pictures under --out.", **kw)
    t.add_argument("--treebank", choices=sorted(TREEBANKS), default="lassysmall", help="its dev file trains, its test file evaluates")
    t.add_argument("--train-file", type=Path, default=None, help="a CoNLL-U file to train on instead of the treebank's dev file")
    t.add_argument("--test-file", type=Path, default=None, help="a CoNLL-U file to evaluate on instead of the treebank's test file")
    t.add_argument("--loss", choices=LOSSES, default="nonprojective", help="the arc loss (see the module docstring)")
    t.add_argument("--epochs", type=int, default=20, help="at most this many epochs")
    t.add_argument("--dev-fraction", type=float, default=0.1,
                   help="hold out this share of the training file (a fixed draw) to pick the best epoch; 0: no dev split, keep the last epoch")
    t.add_argument("--patience", type=int, default=5, help="stop after this many epochs without a better dev LAS (then UAS)")
    t.add_argument("--quick", action="store_true", help="a small slice and one epoch (seconds)")
    t.add_argument("--seed", type=int, default=0, help="initialisation, word dropout and batch order")
    t.add_argument("--max-sentences", type=int, default=None, help="read at most this many sentences of each file")
    t.add_argument("--max-train-length", type=int, default=100, help="train on sentences of at most this many words (evaluation uses all)")
    t.add_argument("--lr", type=float, default=2e-3, help="Adam's learning rate")
    t.add_argument("--data-dir", type=Path, default=default_data_dir(),
                   help="the shared data sets (default: $STRUCTURES_DATA_DIR, else ../shared/data beside the checkout)")
    t.add_argument("--out", type=Path, default=Path("results/parse"), help="where the checkpoint, tables, CoNLL-U outputs and pictures go")
    t.add_argument("--pud", choices=sorted(PUD), default=None,
                   help="also evaluate on this language's PUD file (1000 sentences, another domain)")

    e = sub.add_parser("evaluate", help="UAS/LAS (CoNLL 2018) of a checkpoint on a CoNLL-U file with gold trees",
                       description="Parse a CoNLL-U file with a saved parser and score it against the file's trees "
                                   "(UAS/LAS as the CoNLL 2018 shared task: syntactic words, universal labels, punctuation included).", **kw)
    e.add_argument("checkpoint", type=Path, help="a .pt file written by train")
    e.add_argument("file", type=Path, help="CoNLL-U with gold trees")
    e.add_argument("--decoder", choices=("eisner", "mst", "argmax"), action="append", default=None,
                   help="decode with this (repeatable; default: every decoder of the checkpoint's loss)")
    e.add_argument("--max-sentences", type=int, default=None, help="read at most this many sentences")

    r = sub.add_parser("predict", help="parse CoNLL-U or raw tokenized text into CoNLL-U",
                       description="Parse sentences with a saved parser and write them as CoNLL-U with the predicted heads "
                                   "and labels (the other columns of CoNLL-U input unchanged).", **kw)
    r.add_argument("checkpoint", type=Path, help="a .pt file written by train")
    r.add_argument("input", type=Path, help="CoNLL-U, or raw text: one sentence per line, tokens separated by spaces")
    r.add_argument("--format", choices=("auto", "conllu", "text"), default="auto",
                   help="the input's format; auto: CoNLL-U if its first non-comment line has 10 tab-separated fields")
    r.add_argument("--output", default="-", help="the CoNLL-U file to write; -: standard output")
    r.add_argument("--decoder", choices=("eisner", "mst", "argmax"), default=None,
                   help="default: the first decoder of the checkpoint's loss (eisner for projective, mst otherwise)")
    for s in (t, e, r):
        s.add_argument("--threads", type=int, default=1, help="torch threads")
    return p, {"train": t, "evaluate": e, "predict": r}


def main(argv: Sequence[str] | None = None) -> list[dict] | None:
    """Run a subcommand (``train`` if none is named); the rows of the table it printed (train,
    evaluate) or None (predict)."""
    p, subcommands = arguments()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (*subcommands, "-h", "--help"):
        argv.insert(0, "train")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    run = {"train": train_command, "evaluate": evaluate_command, "predict": predict_command}[args.command]
    return run(subcommands[args.command], args)


def loaded(p: argparse.ArgumentParser, path: Path) -> Checkpoint:
    """The checkpoint at ``path``; else exit with a usage error saying what is wrong with it."""
    try:
        return load_checkpoint(path)
    except ValueError as e:
        p.error(str(e))


def train_command(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[dict]:
    """Train, save the best dev epoch's checkpoint, evaluate on the test (and PUD) file, write the
    tables, CoNLL-U outputs and pictures under ``args.out``."""
    if args.quick:
        args.max_sentences = args.max_sentences or 60
        args.epochs = 1
    if args.epochs < 1 or args.patience < 1 or not 0.0 <= args.dev_fraction < 1.0:
        p.error(f"expected --epochs >= 1, --patience >= 1 and 0 <= --dev-fraction < 1, got {args.epochs}, {args.patience}, {args.dev_fraction}")
    ud = args.data_dir / "ud"
    from_treebank = f"--treebank {args.treebank} (under --data-dir):"
    train_file = existing(p, "--train-file" if args.train_file else from_treebank, args.train_file or ud / TREEBANKS[args.treebank][0])
    test_file = existing(p, "--test-file" if args.test_file else from_treebank, args.test_file or ud / TREEBANKS[args.treebank][1])
    pud_file = existing(p, f"--pud {args.pud} (under --data-dir):", ud / PUD[args.pud]) if args.pud else None
    treebank = args.treebank if args.train_file is None else train_file.stem
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        p.error(f"--out {args.out}: {e}")
    random.seed(args.seed)
    wall = time.perf_counter()

    train_all = read(p, "--train-file", train_file, lambda f: read_conllu(f, args.max_sentences))
    test = read(p, "--test-file", test_file, lambda f: read_conllu(f, args.max_sentences))
    pud = read(p, "--pud", pud_file, lambda f: read_conllu(f, args.max_sentences)) if pud_file else None
    kept, dev = split_dev(train_all, args.dev_fraction)
    train = training_set(kept, args.loss, args.max_train_length)
    if not train:
        p.error(f"no training sentences left in {train_file} after the dev split and the length/projectivity filter")
    vocab, model = build(train, args.seed)
    name = f"{treebank}_{args.loss}"
    checkpoint = args.out / f"{name}.pt"

    def on_best(epoch: int, row: dict) -> None:
        save_checkpoint(checkpoint, model, vocab, args.loss,
                        {"args": plain(args), "treebank": treebank, "epoch": epoch, "dev_uas": row["dev_uas"], "dev_las": row["dev_las"]})

    start = time.perf_counter()
    curve, best_epoch = fit(model, vocab, train, dev, args.loss, args.epochs, args.patience, args.lr, args.seed, on_best,
                            desc=f"{treebank} {args.loss}")
    train_seconds = time.perf_counter() - start
    write_csv(args.out / f"{name}_epochs.csv", curve)

    evaluated = [(treebank, test)] + ([(f"pud-{args.pud}", pud)] if pud else [])
    rows = []
    for eval_name, sentences in evaluated:
        start = time.perf_counter()
        evaluations, scoring = evaluate(model, sentences, vocab, DECODERS[args.loss])
        eval_seconds = time.perf_counter() - start
        for d, r in evaluations.items():
            a, shapes = r.attachment, r.shapes.fractions()
            rows.append({
                "treebank": treebank, "loss": args.loss, "eval_file": eval_name, "decoder": d, "epochs": args.epochs,
                "best_epoch": best_epoch, "epochs_trained": len(curve),
                "seed": args.seed, "train_sentences": len(train), "train_sentences_read": len(train_all),
                "dev_sentences": len(dev), "eval_sentences": len(sentences),
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
            suffix = "" if eval_name == treebank else f"_{eval_name}"
            write_conllu(args.out / f"{name}{suffix}_{d}.conllu", sentences, r.heads, r.labels)
    wall = time.perf_counter() - wall
    for r in rows:
        r["wall_s"] = wall
    write_csv(args.out / f"{name}.csv", [{**r, **provenance([args.seed])} for r in rows])
    (args.out / f"{name}.md").write_text(markdown_table(rows) + "\n" + provenance_line([args.seed]))
    draw_example(model, example_sentence(test), vocab, args.loss, args.out, name)
    print(markdown_table(rows))
    return rows


def evaluate_command(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[dict]:
    """Score a checkpoint on a CoNLL-U file with each decoder; print and return the table."""
    ck = loaded(p, args.checkpoint)
    sentences = read(p, "file", args.file, lambda f: read_conllu(f, args.max_sentences))
    evaluations, _ = evaluate(ck.model, sentences, ck.vocab, args.decoder or DECODERS[ck.loss])
    rows = []
    for d, r in evaluations.items():
        a, shapes = r.attachment, r.shapes.fractions()
        rows.append({"file": str(args.file), "loss": ck.loss, "decoder": d, "sentences": len(sentences), "words": a.words,
                     "uas": a.uas, "las": a.las, "uas_no_punct": a.uas_no_punct, "las_no_punct": a.las_no_punct,
                     "valid": shapes["valid"], "projective": shapes["projective"]})
    print(markdown_table(rows))
    return rows


def predict_command(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Parse the input and write CoNLL-U with the predicted heads and labels."""
    ck = loaded(p, args.checkpoint)
    sentences = read(p, "input", args.input, lambda f: read_sentences(f, args.format))
    if not sentences:
        p.error(f"input {args.input}: no sentences")
    decoder = args.decoder or DECODERS[ck.loss][0]
    # evaluate also scores against the input's trees (none for raw text); only the parses are used
    parsed = evaluate(ck.model, sentences, ck.vocab, [decoder])[0][decoder]
    if args.output == "-":
        write_conllu(sys.stdout, sentences, parsed.heads, parsed.labels)
    else:
        write_conllu(args.output, sentences, parsed.heads, parsed.labels)


if __name__ == "__main__":
    main()
