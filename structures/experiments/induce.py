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
marginals (with ``--targets all``: every word of the unmasked sentence a target;
``--uniform-epochs``: uniform arc potentials at first; ``--adjacency``: own outputs for the
neighbouring heads); ``--hub-penalty`` discourages words with many expected children. Measured in
docs/parsing.md ("Induced trees"): none of them gives syntactic trees on this data.

Why this task: the data at hand (a few thousand UD sentences, 1000 PUD pairs, an SNLI sample of
~1300 pairs) is too small for translation or inference to train anything, while every sentence
gives a cloze signal at many positions.

Induced trees: the spanning-tree decode (single root) of the layer's arc scores, two ways:
``masked``: the head scores of word ``i`` taken from the sentence with word ``i`` masked (as in
training; one copy of the sentence per word); ``unmasked``: one pass over the plain sentence.
Both are scored against gold with directed and undirected attachment accuracy beside the two
chain baselines (``right-branching``: every word headed by the word before it;
``left-branching``: by the word after it), with tree statistics.

    python -m structures.experiments.induce --language en --epochs 10
"""

from __future__ import annotations

import csv
import random
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor, nn
from tqdm import tqdm

from structures.decode.arborescence import max_arborescence
from structures.nn import StructuredSelfAttention

from .attachment import Attachment, TreeStatistics
from .parse import length_groups, markdown_table
from . import command_line, default_data_dir
from .ud import PUD, TREEBANKS, Sentence, read_conllu

PAD, UNK, MASK = 0, 1, 2
LANGUAGES = {  # (training text files, evaluation file with gold trees), under <data-dir>/ud
    "en": ((TREEBANKS["ewt"][0], TREEBANKS["ewt"][1], PUD["en"]), PUD["en"]),
    "de": ((PUD["de"],), PUD["de"]),
    "nl": (TREEBANKS["lassysmall"], TREEBANKS["lassysmall"][1]),
}


def word_index(sentences: Sequence[Sentence], min_count: int = 2) -> dict[str, int]:
    """Lower-cased words seen ``min_count`` times, after ``<pad>``, ``<unk>``, ``<mask>``."""
    counts = Counter(w.lower() for s in sentences for w in s.words)
    kept = sorted(w for w, c in counts.items() if c >= min_count)
    return {"<pad>": PAD, "<unk>": UNK, "<mask>": MASK, **{w: i + 3 for i, w in enumerate(kept)}}


def encode(sentences: Sequence[Sentence], index: dict[str, int], bucket: int = 8) -> tuple[Tensor, Tensor]:
    """Word ids ``[B, N]`` (``N`` the longest length rounded up to ``bucket``) and lengths ``[B]``."""
    N = -(-max(s.n for s in sentences) // bucket) * bucket
    words = torch.full((len(sentences), N), PAD, dtype=torch.long)
    for b, s in enumerate(sentences):
        words[b, :s.n] = torch.tensor([index.get(w.lower(), UNK) for w in s.words])
    return words, torch.tensor([s.n for s in sentences])


def mask_words(words: Tensor, lengths: Tensor, rate: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """A copy of ``words [B, N]`` with a ``rate`` share of the known real words (at least one per
    sentence that has one) replaced by ``<mask>``, and the bool ``[B, N]`` of masked positions."""
    known = (words > MASK) & (torch.arange(words.shape[1]) < lengths.unsqueeze(-1))
    noise = torch.rand(words.shape, generator=generator).masked_fill(~known, 2.0)
    chosen = (noise < rate) | ((noise == noise.min(1, keepdim=True).values) & known)
    return words.masked_fill(chosen, MASK), chosen


OBJECTIVES = ("parent_children", "parent", "head_mixture")


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

    ``forward(words [B, N], lengths [B])`` -> ``(logits [B, N, V], AttentionOutput)`` (for
    ``head_mixture`` the logits of the left-head output applied to the parent context, not used in
    training); :meth:`loss` is the training loss.
    """

    def __init__(self, vocab_size: int, dim: int = 128, hidden: int = 64, scores: str = "bilinear",
                 objective: str = "parent_children", adjacency: bool = False):
        super().__init__()
        if objective not in OBJECTIVES:
            raise ValueError(f"objective: expected one of {OBJECTIVES}, got {objective!r}")
        self.objective = objective
        self.arc_scale = 1.0  # multiplies the BiLSTM states before the arc scores: 0 gives uniform potentials
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=PAD)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True, bidirectional=True)
        self.attention = StructuredSelfAttention(2 * hidden, dim, scores=scores,
                                                 output="parent_children" if objective == "parent_children" else "parent")
        self.predict = nn.Linear((2 if objective == "parent_children" else 1) * dim, vocab_size)
        if objective == "head_mixture":
            self.predict_right = nn.Linear(dim, vocab_size)  # heads to the right of the word
        self.adjacency = adjacency and objective == "head_mixture"
        if self.adjacency:  # the DMV's adjacency: own outputs for the heads next to the word
            self.predict_next_left = nn.Linear(dim, vocab_size)
            self.predict_next_right = nn.Linear(dim, vocab_size)

    def forward(self, words: Tensor, lengths: Tensor):
        values = self.embed(words)
        packed = nn.utils.rnn.pack_padded_sequence(values, lengths, batch_first=True, enforce_sorted=False)
        states, _ = self.lstm(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=words.shape[1])
        out = self.attention(states * self.arc_scale if self.arc_scale != 1.0 else states, values, lengths)
        return self.predict(out.context), out

    def loss(self, words: Tensor, masked: Tensor, lengths: Tensor, chosen: Tensor):
        """The mean cross-entropy of the ``chosen [B, N]`` words of ``words`` given the ``masked``
        sentences, and the layer's output."""
        logits, out = self(masked, lengths)
        if self.objective != "head_mixture":
            return nn.functional.cross_entropy(logits[chosen], words[chosen]), out
        B, N = words.shape
        heads = torch.cat([self.attention.root_embedding.expand(B, 1, -1), self.embed(masked)], 1)  # [B, N+1, dim]
        b, m = chosen.nonzero(as_tuple=True)  # the masked words: sentence b, word m+1
        target = words[b, m]
        left = self.predict(heads).log_softmax(-1)[b, :, target]  # [K, N+1]: log P(w_m | head h, h left of m)
        right = self.predict_right(heads).log_softmax(-1)[b, :, target]
        side = torch.arange(N + 1, device=words.device) > (m + 1).unsqueeze(-1)  # head h right of word m+1
        word_given_head = torch.where(side, right, left)
        if self.adjacency:
            position = torch.arange(N + 1, device=words.device)
            word_given_head = torch.where((position == m.unsqueeze(-1)) & (position > 0), self.predict_next_left(heads).log_softmax(-1)[b, :, target],
                                          word_given_head)  # h = word m: the word just left of word m+1
            word_given_head = torch.where(position == (m + 2).unsqueeze(-1), self.predict_next_right(heads).log_softmax(-1)[b, :, target],
                                          word_given_head)
        marginals = out.attention[b, :, m + 1]  # [K, N+1]: p(h -> m+1)
        return -(marginals.clamp_min(1e-30).log() + word_given_head).logsumexp(-1).mean(), out


def hub_penalty(attention: Tensor, lengths: Tensor) -> Tensor:
    """The mean over sentences of ``sum_h (expected children of h)^2 / n``: 1 for a chain-like
    spread (every word about one child), up to ``n`` for a hub that heads every word. ``attention``
    is the layer's ``[B, N+1, N+1]`` arc marginals; the root row is left out."""
    children = attention[:, 1:, 1:].sum(-1)  # [B, N]: expected number of children of each word
    return ((children ** 2).sum(-1) / lengths.to(children.dtype)).mean()


def train_epoch(model: ClozeModel, sentences: Sequence[Sentence], index: dict[str, int], optimizer: torch.optim.Optimizer,
                rng: random.Random, generator: torch.Generator, rate: float = 0.15, tokens_per_batch: int = 800,
                hub_weight: float = 0.0, targets: str = "masked") -> tuple[float, int]:
    """One pass of the cloze task: the mean cross-entropy per masked word (``targets="all"``: every
    known word is a target and none is masked, only for ``head_mixture``, whose mixture of
    probabilities cannot pass the target through the choice of heads: ``p(w_i) <= max_h P(w_i | w_h)``,
    and no head is word ``i`` itself) (``hub_weight`` times
    :func:`hub_penalty` is added to the loss that is minimized, not to the one reported), and the
    number of batches skipped because the backward pass through the matrix-tree marginals failed (a
    singular Laplacian or non-finite gradients; ``NonProjectiveDependencyCRF.marginals``'s
    backward breaks down once arc scores spread over ~100 nats)."""
    model.train()
    total, count, skipped = 0.0, 0, 0
    for group in length_groups(sentences, tokens_per_batch, rng):
        words, lengths = encode([sentences[i] for i in group], index)
        if targets == "all":
            masked, chosen = words, (words > MASK) & (torch.arange(words.shape[1]) < lengths.unsqueeze(-1))
        else:
            masked, chosen = mask_words(words, lengths, rate, generator)
        loss, att = model.loss(words, masked, lengths, chosen)
        objective = loss + hub_weight * hub_penalty(att.attention, lengths) if hub_weight else loss
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


def masked_arc_scores(model: ClozeModel, words: Tensor, lengths: Tensor) -> Tensor:
    """``[B, N+1, N+1]`` arc scores whose column ``m`` (the head scores of word ``m``) comes from
    the sentence with word ``m`` masked: one copy of each sentence per word. Column 0 is 0."""
    B, N = words.shape
    copies = words.repeat_interleave(N, 0)
    masked_word = torch.arange(N).repeat(B)
    copies[torch.arange(B * N), masked_word] = MASK
    copy_lengths = lengths.repeat_interleave(N)
    inside = masked_word < copy_lengths
    scores = torch.zeros(B * N, N + 1, N + 1)
    scores[inside] = model(copies[inside], copy_lengths[inside])[1].distribution.log_potentials
    m = torch.arange(N)
    columns = scores.view(B, N, N + 1, N + 1)[:, m, :, m + 1]  # [N, B, N+1]: [m, b, h] = copy m's score h -> m+1
    return nn.functional.pad(columns.permute(1, 2, 0), (1, 0))


@torch.no_grad()
def induced_trees(model: ClozeModel, sentences: Sequence[Sentence], index: dict[str, int],
                  tokens_per_batch: int = 4000) -> dict[str, list[list[int]]]:
    """The trees the layer induces, by the spanning-tree decode (single root) of its arc scores:
    ``masked`` (word i's head scores from the sentence with word i masked) and ``unmasked``."""
    model.eval()
    out = {"masked": [[] for _ in sentences], "unmasked": [[] for _ in sentences]}
    for group in length_groups(sentences, tokens_per_batch):
        words, lengths = encode([sentences[i] for i in group], index)
        _, plain = model(words, lengths)
        unmasked = plain.distribution.decode()
        heads = max_arborescence(masked_arc_scores(model, words, lengths), lengths, single_root=True)
        for b, i in enumerate(group):
            n = sentences[i].n
            out["masked"][i] = heads[b, :n].tolist()
            out["unmasked"][i] = unmasked[b, :n].tolist()
    return out


def chain_trees(sentences: Sequence[Sentence]) -> dict[str, list[list[int]]]:
    """``right-branching``: word m headed by word m-1 (word 1 the root's child);
    ``left-branching``: word m headed by word m+1 (the last word the root's child)."""
    return {"right-branching": [list(range(s.n)) for s in sentences],
            "left-branching": [[m + 1 for m in range(1, s.n)] + [0] for s in sentences]}


def score_trees(sentences: Sequence[Sentence], trees: Sequence[Sequence[int]]) -> dict[str, float]:
    """Directed and undirected attachment accuracy, with and without punctuation (``_no_punct``:
    over the words whose gold UPOS is not PUNCT, as Bisk & Tran's Table 3), tree statistics."""
    a, stats = Attachment(), TreeStatistics()
    undirected, words = 0, 0
    for s, heads in zip(sentences, trees):
        a.add(s.heads, heads, s.upos)
        stats.add(heads)
        gold = {frozenset((h, m)) for m, h in enumerate(s.heads, 1)}
        for m, (h, pos) in enumerate(zip(heads, s.upos), 1):
            if pos != "PUNCT":
                words += 1
                undirected += frozenset((h, m)) in gold
    return {"directed": a.uas, "directed_no_punct": a.uas_no_punct, "undirected": a.undirected_accuracy,
            "undirected_no_punct": undirected / max(words, 1), **stats.summary()}


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = command_line("induce", __doc__)
    p.add_argument("--language", choices=sorted(LANGUAGES), default="en")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="a small slice and one epoch (seconds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-sentences", type=int, default=None, help="read at most this many sentences of each file")
    p.add_argument("--max-train-length", type=int, default=60)
    p.add_argument("--scores", choices=("bilinear", "dot"), default="bilinear")
    p.add_argument("--objective", choices=OBJECTIVES, default="parent_children",
                   help="the context a masked word is predicted from: its soft parent and children, or its soft parent only")
    p.add_argument("--targets", choices=("masked", "all"), default="masked",
                   help="predict the masked 15%% of the words, or (head_mixture only) every word of the unmasked sentence")
    p.add_argument("--adjacency", action="store_true",
                   help="head_mixture: own word-given-head outputs for the two neighbouring heads (the DMV's adjacency)")
    p.add_argument("--uniform-epochs", type=int, default=0,
                   help="train the first this many epochs with uniform arc potentials (the word predictor learns from "
                        "every candidate head before the arc scorer commits to any, as IBM Model 1 before its alignments)")
    p.add_argument("--hub-penalty", type=float, default=0.0,
                   help="weight of the penalty on the squared expected number of children per word (see hub_penalty)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW's; keeps the arc scores moderate")
    p.add_argument("--data-dir", type=Path, default=default_data_dir(),
                   help="the shared data sets (default: $STRUCTURES_DATA_DIR, else ../shared/data beside the checkout)")
    p.add_argument("--out", type=Path, default=Path("results/induce"))
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.targets == "all" and args.objective != "head_mixture":
        p.error("--targets all: only with --objective head_mixture (the other contexts would leak the word)")
    if args.quick:
        args.max_sentences = args.max_sentences or 40
        args.epochs = 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    wall = time.perf_counter()

    train_files, eval_file = LANGUAGES[args.language]
    ud = args.data_dir / "ud"
    train = [s for f in train_files for s in read_conllu(ud / f, args.max_sentences) if s.n <= args.max_train_length]
    test = read_conllu(ud / eval_file, args.max_sentences)
    index = word_index(train)
    model = ClozeModel(len(index), scores=args.scores, objective=args.objective, adjacency=args.adjacency)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    rng, generator = random.Random(args.seed), torch.Generator().manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"{args.language}_{args.scores}"
    if args.objective != "parent_children" or args.hub_penalty:
        name += f"_{args.objective}" + (f"_hub{args.hub_penalty:g}" if args.hub_penalty else "")
    if args.targets == "all":
        name += "_all"
    if args.uniform_epochs:
        name += f"_uniform{args.uniform_epochs}"
    if args.adjacency:
        name += "_adjacency"
    start = time.perf_counter()
    curve = []
    for epoch in (bar := tqdm(range(args.epochs), desc=f"induce {args.language}")):
        model.arc_scale = 0.0 if epoch < args.uniform_epochs else 1.0
        loss, skipped = train_epoch(model, train, index, optimizer, rng, generator, hub_weight=args.hub_penalty, targets=args.targets)
        curve.append({"epoch": epoch + 1, "cloze_loss": loss, "skipped_batches": skipped, "seconds": time.perf_counter() - start})
        bar.set_postfix(loss=f"{loss:.3f}")
    train_seconds = time.perf_counter() - start

    start = time.perf_counter()
    trees = {"gold": [list(s.heads) for s in test], **induced_trees(model, test, index), **chain_trees(test)}
    induce_seconds = time.perf_counter() - start
    wall = time.perf_counter() - wall
    rows = [{"language": args.language, "objective": args.objective, "targets": args.targets, "hub_penalty": args.hub_penalty, "uniform_epochs": args.uniform_epochs, "adjacency": args.adjacency, "trees": k,
             "epochs": args.epochs, "seed": args.seed, "train_sentences": len(train),
             "eval_sentences": len(test), **score_trees(test, v), "final_cloze_loss": curve[-1]["cloze_loss"],
             "skipped_batches": sum(c["skipped_batches"] for c in curve),
             "train_s": train_seconds, "induce_s": induce_seconds, "wall_s": wall} for k, v in trees.items()]
    for path, table in ((args.out / f"{name}.csv", rows), (args.out / f"{name}_epochs.csv", curve)):
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(table[0]))
            w.writeheader()
            w.writerows(table)
    (args.out / f"{name}.md").write_text(markdown_table(rows))
    draw(model, test, index, trees, args.out, name)
    print(markdown_table(rows))
    return rows


@torch.no_grad()
def draw(model: ClozeModel, sentences: Sequence[Sentence], index: dict[str, int], trees: dict[str, list[list[int]]],
         out: Path, name: str, shortest: int = 8, longest: int = 14) -> None:
    """Arc diagrams (gold, induced, baselines) of one sentence, the depth histograms of every tree
    kind, and the heatmap of the layer's arc marginals on the plain sentence."""
    import matplotlib.pyplot as plt

    from .arcs import draw_marginals, draw_trees

    i = next((k for k, s in enumerate(sentences) if shortest <= s.n <= longest), 0)
    s = sentences[i]
    draw_trees(s.words, {k: v[i] for k, v in trees.items()}, out / f"{name}_trees.png", title=f"{s.sent_id} (red: arcs not in gold)")
    words, lengths = encode([s], index)
    _, att = model(words, lengths)
    draw_marginals(s.words, att.attention[0, :s.n + 1, :s.n + 1].tolist(), out / f"{name}_marginals.png", gold=list(s.heads),
                   title="structured attention: arc marginals (plain sentence)")
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
