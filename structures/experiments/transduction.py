"""Tree transduction: prefix -> infix arithmetic with self-attention encoders (Kim et al. 2017, §4.1,
Table 2, appendix A.2).

    python -m structures.experiments.transduction            # default: ~7 minutes of CPU (one thread)
    python -m structures.experiments.transduction --quick    # seconds (the tests run it)
    python -m structures.experiments.transduction --full     # the paper's sizes (15K pairs, 13 epochs)

Three encoders over the source symbols (``$`` prepended as the root), each followed by the same
attention LSTM decoder:

- ``none``: the symbol embeddings alone, ``x̂_j = x_j``;
- ``simple``: ``x̂_j = [x_j; Σ_i softmax_i(θ_ij) x_i]``;
- ``structured``: ``x̂_j = [x_j; Σ_i p(z_ij = 1) x_i]``, the soft parent under a projective
  dependency CRF (:class:`structures.nn.SyntacticAttention`);

with ``θ_ij = tanh(sᵀ tanh(W1 h_i + W2 h_j + b))`` from a bidirectional "parsing" LSTM ``h`` over
the embeddings (shared with the encoder). The metric is the average proportion of target tokens
produced correctly before the first error, by nesting depth (train on depths 2-4, test on 2-6).
Decoding is greedy: its first error is where the teacher-forced argmax first differs from the
target, so evaluation is one batched pass (the paper used beam search, size 5).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..nn import SoftmaxAttention, SyntacticAttention
from . import command_line
from .arithmetic import SYMBOLS, Pair, sample_pairs
from .progress import Progress
from .provenance import provenance, provenance_line

KINDS = ("none", "simple", "structured")
ROOT = "$"
SOURCE_VOCAB = ("<pad>", ROOT) + SYMBOLS
TARGET_VOCAB = ("<pad>", "<s>", "</s>") + SYMBOLS
PAD, BOS, EOS = 0, 1, 2
SOURCE_INDEX = {s: i for i, s in enumerate(SOURCE_VOCAB)}
TARGET_INDEX = {s: i for i, s in enumerate(TARGET_VOCAB)}

# Kim et al. 2017, Table 2: average length to failure (%) by depth
PAPER = {
    2: {"none": 7.6, "simple": 87.4, "structured": 99.2},
    3: {"none": 4.1, "simple": 49.6, "structured": 87.0},
    4: {"none": 2.8, "simple": 23.3, "structured": 64.5},
    5: {"none": 2.1, "simple": 15.0, "structured": 30.8},
    6: {"none": 1.5, "simple": 8.5, "structured": 18.2},
}


# ---------------------------------------------------------------------------------------- data


def make_data(train_per_depth: int = 5000, test_per_depth: int = 200, valid_per_depth: int = 100,
              train_depths: Sequence[int] = (2, 3, 4), test_depths: Sequence[int] = (2, 3, 4, 5, 6),
              seed: int = 0) -> dict[str, list[Pair]]:
    """``{"train", "valid", "test"}`` lists of :class:`~structures.experiments.arithmetic.Pair`:
    ``train_per_depth`` pairs of each train depth, ``valid_per_depth`` of each train depth and
    ``test_per_depth`` of each test depth; no source formula occurs twice across the three."""
    rng = random.Random(seed)
    seen: set = set()
    test = [p for d in test_depths for p in sample_pairs(rng, d, test_per_depth, seen)]
    valid = [p for d in train_depths for p in sample_pairs(rng, d, valid_per_depth, seen)]
    train = [p for d in train_depths for p in sample_pairs(rng, d, train_per_depth, seen)]
    return {"train": train, "valid": valid, "test": test}


@dataclass
class Batch:
    """Padded tensors of a batch (batch first). ``src [B, N]`` starts with the root ``$``;
    ``tgt_in [B, T]`` starts with ``<s>``, ``tgt_out [B, T]`` ends with ``</s>``; ``tgt_lengths``
    count the target symbols without ``</s>``; ``depth [B]``."""

    src: Tensor
    src_lengths: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    tgt_lengths: Tensor
    depth: Tensor

    def __len__(self) -> int:
        return self.src.shape[0]


def collate(pairs: Sequence[Pair], bucket: int = 8) -> Batch:
    """A :class:`Batch` of ``pairs``; the source is padded to a multiple of ``bucket`` (the
    projective CRF compiles its program once per source length, so few lengths keep it cached)."""
    n = max(len(p.prefix) for p in pairs) + 1
    n = bucket * math.ceil(n / bucket)
    t = max(len(p.infix) for p in pairs) + 1
    src = torch.full((len(pairs), n), PAD, dtype=torch.long)
    tgt_in = torch.full((len(pairs), t), PAD, dtype=torch.long)
    tgt_out = torch.full((len(pairs), t), PAD, dtype=torch.long)
    for b, p in enumerate(pairs):
        s = [SOURCE_INDEX[ROOT]] + [SOURCE_INDEX[x] for x in p.prefix]
        y = [TARGET_INDEX[x] for x in p.infix]
        src[b, :len(s)] = torch.tensor(s)
        tgt_in[b, :len(y) + 1] = torch.tensor([BOS] + y)
        tgt_out[b, :len(y) + 1] = torch.tensor(y + [EOS])
    return Batch(src, torch.tensor([len(p.prefix) + 1 for p in pairs]), tgt_in, tgt_out,
                 torch.tensor([len(p.infix) for p in pairs]), torch.tensor([p.depth for p in pairs]))


def batch_order(pairs: Sequence[Pair], batch_size: int, rng: random.Random | None = None, bucket: int = 8) -> list[list[int]]:
    """The indices into ``pairs`` of each batch: examples of similar source length (sorted, then
    cut); with ``rng``, the pairs within a length bucket and the order of the batches are shuffled."""
    order = list(range(len(pairs)))
    if rng is not None:
        rng.shuffle(order)
    order.sort(key=lambda i: math.ceil((len(pairs[i].prefix) + 1) / bucket))  # stable: shuffled within a bucket
    out = [order[k:k + batch_size] for k in range(0, len(order), batch_size)]
    if rng is not None:
        rng.shuffle(out)
    return out


def batches(pairs: Sequence[Pair], batch_size: int, rng: random.Random | None = None, bucket: int = 8) -> list[Batch]:
    """The :class:`Batch` of each of :func:`batch_order`'s index lists."""
    return [collate([pairs[i] for i in index], bucket) for index in batch_order(pairs, batch_size, rng, bucket)]


# ---------------------------------------------------------------------------------------- model


class Transducer(nn.Module):
    """Encoder (symbol embeddings, optionally with a soft-parent self-attention context) and a
    one-layer LSTM decoder with bilinear softmax attention over the source representation
    (Kim et al. 2017, appendix A.2). ``forward(src [B, N], src_lengths [B], tgt_in [B, T])``
    returns next-symbol logits ``[B, T, V]``."""

    def __init__(self, kind: str, dim: int = 50, bounded: bool = True):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
        self.kind = kind
        self.src_embed = nn.Embedding(len(SOURCE_VOCAB), dim, padding_idx=PAD)
        source_dim = dim
        if kind != "none":
            self.parser = nn.LSTM(dim, dim, batch_first=True, bidirectional=True)
            self.self_attention = SyntacticAttention(2 * dim, dim, structured=kind == "structured", bounded=bounded)
            source_dim = 2 * dim
        self.tgt_embed = nn.Embedding(len(TARGET_VOCAB), dim, padding_idx=PAD)
        self.decoder = nn.LSTM(dim, dim, batch_first=True)
        self.attention = SoftmaxAttention(source_dim, dim)  # W
        self.combine = nn.Linear(source_dim + dim, dim, bias=False)  # U
        self.out = nn.Linear(dim, len(TARGET_VOCAB))  # V, b

    def encode(self, src: Tensor, src_lengths: Tensor):
        """``(x̂ [B, N, D'], self-attention output or None)``."""
        x = self.src_embed(src)
        if self.kind == "none":
            return x, None
        packed = pack_padded_sequence(x, src_lengths.cpu(), batch_first=True, enforce_sorted=False)
        h, _ = pad_packed_sequence(self.parser(packed)[0], batch_first=True, total_length=src.shape[1])
        parents = self.self_attention(h, x, src_lengths)
        return torch.cat([x, parents.context], -1), parents

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> Tensor:
        source, _ = self.encode(src, src_lengths)
        queries, _ = self.decoder(self.tgt_embed(tgt_in))
        m = self.attention(source, queries, src_lengths).context
        return self.out(torch.tanh(self.combine(torch.cat([m, queries], -1))))


def build_model(kind: str, dim: int = 50, init: float = 0.1, bounded: bool = True, seed: int | None = None) -> Transducer:
    """A :class:`Transducer` of the given kind (``none``, ``simple``, ``structured``) with every
    parameter drawn from ``U[-init, init]`` (the paper's initialization)."""
    if seed is not None:
        torch.manual_seed(seed)
    model = Transducer(kind, dim, bounded)
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-init, init)
    return model


# ---------------------------------------------------------------------------------------- training


def loss_of(model: nn.Module, batch: Batch) -> Tensor:
    """Cross-entropy of the target symbols (with ``</s>``), summed over symbols, averaged over the batch."""
    logits = model(batch.src, batch.src_lengths, batch.tgt_in)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD, reduction="sum")
    return loss / len(batch)


def train_step(model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, clip: float = 1.0) -> float:
    """One update on ``batch`` (gradients renormalized to norm ``clip``); returns the loss."""
    optimizer.zero_grad()
    loss = loss_of(model, batch)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return loss.item()


def train_epoch(model: nn.Module, data: Iterable[Batch], optimizer: torch.optim.Optimizer, clip: float = 1.0,
                progress=None) -> float:
    """One pass of :func:`train_step` over ``data``; returns the mean loss per example."""
    model.train()
    total, count = 0.0, 0
    for batch in data:
        total += train_step(model, batch, optimizer, clip) * len(batch)
        count += len(batch)
        if progress is not None:
            progress.update(1)
    return total / max(count, 1)


@torch.no_grad()
def correct_prefix(model: nn.Module, batch: Batch) -> Tensor:
    """``[B]``: the proportion of target symbols greedy decoding gets right before its first error.
    Greedy decoding follows the target until its first mistake, which is where the
    teacher-forced argmax first differs from the target."""
    predicted = model(batch.src, batch.src_lengths, batch.tgt_in).argmax(-1)
    t = batch.tgt_in.shape[1]
    inside = torch.arange(t) < batch.tgt_lengths.unsqueeze(-1)
    wrong = (predicted != batch.tgt_out) & inside
    first = torch.where(wrong.any(-1), wrong.float().argmax(-1), batch.tgt_lengths)
    return first.float() / batch.tgt_lengths.float()


@torch.no_grad()
def mean_loss(model: nn.Module, data: Iterable[Batch]) -> float:
    """The loss per example (:func:`loss_of`) over ``data``."""
    model.eval()
    total, count = 0.0, 0
    for batch in data:
        total += loss_of(model, batch).item() * len(batch)
        count += len(batch)
    return total / max(count, 1)


def formula_scores(model: nn.Module, pairs: Sequence[Pair], batch_size: int = 100) -> list[float]:
    """Per pair, in the order of ``pairs``: the proportion of its target symbols produced correctly
    until the first failure (:func:`correct_prefix`)."""
    model.eval()
    out = [0.0] * len(pairs)
    for index in batch_order(pairs, batch_size):
        for i, a in zip(index, correct_prefix(model, collate([pairs[i] for i in index])).tolist()):
            out[i] = a
    return out


def by_depth(pairs: Sequence[Pair], scores: Sequence[float]) -> dict[int, float]:
    """The mean of ``scores`` (proportions, one per pair) in % for each nesting depth of ``pairs``."""
    sums: dict[int, list[float]] = {}
    for p, a in zip(pairs, scores):
        sums.setdefault(p.depth, []).append(a)
    return {d: 100.0 * sum(v) / len(v) for d, v in sorted(sums.items())}


def evaluate(model: nn.Module, pairs: Sequence[Pair]) -> dict[int, float]:
    """Average proportion (%) of target symbols produced correctly until the first failure, by depth."""
    return by_depth(pairs, formula_scores(model, pairs))


def make_optimizer(model: nn.Module, name: str, lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr)
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr)
    raise ValueError(f"optimizer: expected 'sgd' or 'adam', got {name!r}")


def fit(kind: str, data: dict[str, list[Pair]], config: argparse.Namespace, progress=None) -> tuple[Transducer, dict]:
    """Train one model (the paper's schedule: the learning rate halves after every epoch from
    ``decay_after`` on, or from the first epoch whose validation loss does not improve) and test
    it. The loss, not the length to failure, decides: the latter sits at the same few percent for
    the first epochs, which would start the decay before anything is learned. Returns the model and
    ``{"test": {depth: %}, "formulas": [per test pair, a proportion], "history": [per epoch],
    "seconds": wall time, "cpu_seconds": CPU time}``
    (on a shared machine the CPU time is what an idle core would take)."""
    start, cpu = time.time(), time.process_time()
    model = build_model(kind, config.dim, config.init, config.bounded, config.seed)
    optimizer = make_optimizer(model, config.optimizer, config.lr)
    rng = random.Random(config.seed)
    valid_batches = batches(data["valid"], 100)
    best, decaying, history = math.inf, False, []
    for epoch in range(1, config.epochs + 1):
        loss = train_epoch(model, batches(data["train"], config.batch_size, rng), optimizer, config.clip, progress)
        valid_loss = mean_loss(model, valid_batches)
        valid = evaluate(model, data["valid"])
        score = sum(valid.values()) / len(valid)
        history.append({"epoch": epoch, "loss": loss, "valid_loss": valid_loss, "valid": score,
                        "lr": optimizer.param_groups[0]["lr"]})
        if progress is not None:
            progress.set_postfix(model=kind, epoch=epoch, loss=f"{loss:.2f}", valid=f"{score:.1f}")
            progress.write(f"{kind} epoch {epoch}: loss {loss:.2f}, valid loss {valid_loss:.2f}, valid {score:.1f}, "
                           f"lr {history[-1]['lr']:.3g}, {time.time() - start:.0f} s")
        decaying = decaying or epoch >= config.decay_after or valid_loss >= best
        best = min(best, valid_loss)
        if decaying:
            for group in optimizer.param_groups:
                group["lr"] *= 0.5
    formulas = formula_scores(model, data["test"])
    return model, {"test": by_depth(data["test"], formulas), "formulas": formulas, "history": history,
                   "seconds": time.time() - start, "cpu_seconds": time.process_time() - cpu}


# ---------------------------------------------------------------------------------------- output


def write_tables(results: dict[str, dict], config: argparse.Namespace, data: dict, out: Path, total: float) -> str:
    """``results.md``, ``results.csv`` and ``formulas.csv`` (each test formula's score under each
    model, for ``significance formulas``) in ``out``; returns the markdown."""
    depths = sorted(next(iter(results.values()))["test"])
    with open(out / "formulas.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["formula", "depth", "prefix"] + list(results))
        for i, pair in enumerate(data["test"]):
            w.writerow([i, pair.depth, " ".join(pair.prefix)] + [f"{results[k]['formulas'][i]:.6g}" for k in results])
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["depth"] + list(results) + [f"paper_{k}" for k in KINDS])
        for d in depths:
            w.writerow([d] + [f"{results[k]['test'][d]:.1f}" for k in results]
                       + [PAPER.get(d, {}).get(k, "") for k in KINDS])
        w.writerow(["wall_seconds"] + [f"{results[k]['seconds']:.0f}" for k in results] + ["", "", ""])
        w.writerow(["cpu_seconds"] + [f"{results[k]['cpu_seconds']:.0f}" for k in results] + ["", "", ""])
        for key, value in provenance([config.seed]).items():
            w.writerow([key, value] + [""] * (len(results) + len(KINDS) - 1))
    lines = [
        "# Tree transduction (Kim et al. 2017, Table 2)",
        "",
        f"Average proportion (%) of target symbols correct until the first failure (greedy decoding), "
        f"by nesting depth. Train: {len(data['train'])} pairs ({config.train_per_depth} per depth "
        f"{config.train_depths}); test: {len(data['test'])} ({config.test_per_depth} per depth "
        f"{config.test_depths}); {config.epochs} epochs, {config.optimizer} lr {config.lr}, batch "
        f"{config.batch_size}, dim {config.dim}, {'bounded' if config.bounded else 'unbounded'} arc scores, seed {config.seed}.",
        "",
        "| depth | " + " | ".join(results) + " | " + " | ".join(f"paper {k}" for k in KINDS) + " |",
        "|---|" + "---|" * (len(results) + len(KINDS)),
    ]
    for d in depths:
        ours = " | ".join(f"{results[k]['test'][d]:.1f}" for k in results)
        paper = " | ".join(str(PAPER.get(d, {}).get(k, "")) for k in KINDS)
        lines.append(f"| {d} | {ours} | {paper} |")
    for key, name in (("seconds", "wall time (s)"), ("cpu_seconds", "CPU time (s)")):
        lines.append(f"| {name} | " + " | ".join(f"{results[k][key]:.0f}" for k in results)
                     + " | " + " | ".join("" for _ in KINDS) + " |")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines += ["", f"Total wall time: {total:.0f} s (CPU {time.process_time():.0f} s); load average at the end: {load}.",
              "", provenance_line([config.seed]).rstrip()]
    text = "\n".join(lines) + "\n"
    (out / "results.md").write_text(text)
    return text


def plot_accuracy(results: dict[str, dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for i, kind in enumerate(results):
        depths = sorted(results[kind]["test"])
        ax.plot(depths, [results[kind]["test"][d] for d in depths], "o-", color=f"C{i}", label=f"{kind} (ours)")
        paper = [d for d in depths if d in PAPER]
        ax.plot(paper, [PAPER[d][kind] for d in paper], "x--", color=f"C{i}", alpha=0.6, label=f"{kind} (paper)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # depths are integers
    ax.set_xlabel("nesting depth (train: 2-4)")
    ax.set_ylabel("length to failure (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)
    ax.set_title("Prefix to infix transduction")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@torch.no_grad()
def plot_attention(models: dict[str, Transducer], pair: Pair, path: Path) -> None:
    """Kim et al. Figure 3: each word's distribution over parents (rows: the word, columns: its
    parent) under the simple and the structured model, and the structured model's best tree
    (Eisner) drawn as arcs over the source."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Arc

    batch = collate([pair], bucket=1)
    tokens = [ROOT] + list(pair.prefix)
    shown = [k for k in ("simple", "structured") if k in models]
    fig, axes = plt.subplots(1, len(shown) + 1, figsize=(5 * (len(shown) + 1), 5), squeeze=False)
    axes = axes[0]
    heads = None
    for ax, kind in zip(axes, shown):
        models[kind].eval()
        _, parents = models[kind].encode(batch.src, batch.src_lengths)
        image = ax.imshow(parents.attention[0].T.numpy(), cmap="Blues", vmin=0, vmax=1)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="p(parent | word)")
        ax.set_xticks(range(len(tokens)), tokens, fontsize=7)
        ax.set_yticks(range(len(tokens)), tokens, fontsize=7)
        ax.set_xlabel("parent")
        ax.set_ylabel("word")
        ax.set_title(f"{kind}: p(parent | word)")
        if parents.distribution is not None:
            heads = parents.distribution.decode()[0].tolist()
    ax = axes[-1]
    if heads is not None:
        for m, h in enumerate(heads, start=1):
            lo, hi = sorted((h, m))
            ax.add_patch(Arc(((lo + hi) / 2, 0), hi - lo, (hi - lo) * 0.8, theta1=0, theta2=180, color="C0"))
            ax.annotate("", xy=(m, 0), xytext=(m, 0.25), arrowprops={"arrowstyle": "->", "color": "C0"})
        ax.set_xlim(-0.5, len(tokens) - 0.5)
        ax.set_ylim(-1, 0.45 * len(tokens))
        ax.set_xticks(range(len(tokens)), tokens, fontsize=7)
        ax.set_yticks([])
        ax.set_title("structured: best tree (Eisner)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------- CLI

MODES = {
    "quick": dict(train_per_depth=60, test_per_depth=10, valid_per_depth=10, train_depths=[2, 3], test_depths=[2, 3, 4],
                  epochs=2, optimizer="adam", lr=0.01, decay_after=99, dim=16, batch_size=20, bounded=True),
    # batches of 100: the CRF's cost per batch hardly grows with the batch size (it is per-length overhead)
    "default": dict(train_per_depth=1000, test_per_depth=200, valid_per_depth=50, train_depths=[2, 3, 4],
                    test_depths=[2, 3, 4, 5, 6], epochs=10, optimizer="adam", lr=0.01, decay_after=7, dim=50,
                    batch_size=100, bounded=True),
    "full": dict(train_per_depth=5000, test_per_depth=200, valid_per_depth=100, train_depths=[2, 3, 4],
                 test_depths=[2, 3, 4, 5, 6], epochs=13, optimizer="sgd", lr=1.0, decay_after=9, dim=50, batch_size=20, bounded=True),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    repo = Path(__file__).resolve().parents[2]
    p = command_line("transduction", __doc__)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a tiny run (seconds)")
    mode.add_argument("--full", action="store_true", help="the paper's sizes: 15K pairs, 13 epochs, SGD lr 1")
    p.add_argument("--models", nargs="+", default=list(KINDS), choices=KINDS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=repo / "results" / "transduction")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--clip", type=float, default=1.0, help="gradient norm limit")
    p.add_argument("--init", type=float, default=0.1, help="parameters start in U[-init, init]")
    p.add_argument("--bounded", action=argparse.BooleanOptionalAction,
                   help="the paper's arc scores tanh(sᵀ tanh(..)) in [-1, 1] (every mode's default); "
                        "--no-bounded drops the outer tanh")
    for name in ("train_per_depth", "test_per_depth", "valid_per_depth", "epochs", "decay_after", "dim", "batch_size"):
        p.add_argument("--" + name.replace("_", "-"), type=int)
    p.add_argument("--train-depths", type=int, nargs="+")
    p.add_argument("--test-depths", type=int, nargs="+")
    p.add_argument("--optimizer", choices=("sgd", "adam"))
    p.add_argument("--lr", type=float)
    args = p.parse_args(argv)
    for key, value in MODES["quick" if args.quick else "full" if args.full else "default"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, dict]:
    config = parse_args(argv)
    torch.set_num_threads(config.threads)
    config.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    data = make_data(config.train_per_depth, config.test_per_depth, config.valid_per_depth,
                     config.train_depths, config.test_depths, config.seed)
    steps = math.ceil(len(data["train"]) / config.batch_size)  # batches per epoch (bucketing may add a few)
    results, models = {}, {}
    # a bar on a terminal only; in a log, the one line per epoch that fit writes
    with Progress(total=steps * config.epochs * len(config.models), desc="transduction") as progress:
        for kind in config.models:
            models[kind], outcome = fit(kind, data, config, progress)
            results = {k: outcome if k == kind else results[k] for k in KINDS if k == kind or k in results}
            # tables after every model, so that an interrupted run leaves what it finished
            text = write_tables(results, config, data, config.out, time.time() - start)
    print(text, end="")
    plot_accuracy(results, config.out / "accuracy.png")
    example = min((p for p in data["test"] if p.depth == 3), key=lambda p: abs(len(p.prefix) - 21), default=data["test"][0])
    if {"simple", "structured"} & set(models):
        plot_attention(models, example, config.out / "attention.png")
    return results


if __name__ == "__main__":
    main()
