"""Trees induced for translation: Bisk & Tran's (2018) syntactic attention NMT on the parallel PUD
files, the source side's trees scored against Universal Dependencies (their §4, §7, Table 3).

The model (SA-NMT, their §4): a BiLSTM encoder gives the content annotations ``S``; the head word
selection layer (:class:`structures.nn.StructuredSelfAttention`, ``scores="dot"``:
``φ_ij = (W_q s_i)ᵀ (W_k s_j) / √d``, non-projective, single root) gives every source word its soft
parent ``M_j = Σ_i β_ij W_v s_i`` (β the arc marginals; a word whose parent is the root gets the
layer's root vector). An LSTM decoder with input feeding attends to ``S``
(``α_t = softmax(h_tᵀ W_a S)``, ``c_t = S α_t``) and, with the **same** weights, to ``M``
(``d_t = M α_t``, the shared attention of their §4.2), gated (``d̂_t = d_t ⊙ σ(W_g h_t)``, eq. 11):
``u_t = tanh(W_u [h_t; c_t; d̂_t])``, the next word from ``u_t`` through the output layer tied to
the target embeddings. ``--attention flat`` is their FA-NMT (``β = softmax(φ)`` per word, no
tree); ``--hard``: the forward pass uses the best tree's one-hot arcs and the backward pass the
marginals' gradient (their §4.3 with the maximum spanning tree, which they name the principled
form of their greedy heads); ``--head-input embeddings``: the head selection reads the word
embeddings instead of the BiLSTM states (the change their §7.3 proposes). An auxiliary signal,
``--teacher-weight``: the cross-entropy of the layer's trees against the posterior of Klein &
Manning's DMV fitted to the source language's gold POS tags (:mod:`structures.experiments.dmv`, as
``induce --objective dmv`` fits it); ``--translation-weight 0`` leaves the teacher alone (the control).

The data: the 1000 English-German sentence pairs of PUD (``--source en``: English to German, the
row EN (→DE) of Table 3; ``--source de`` the other way), words as UD tokenizes them (syntactic
words, lower-cased; every word of the 1000 pairs in the vocabulary, so no subwords and no
collapsing of their §7.1), punctuation kept in the input as in the paper. The model is trained
on all 1000 pairs and its trees are read on the same 1000 source sentences (grammar induction's
setting: the text is the training data; no gold tree is used in training). Bisk & Tran trained on
5.9M pairs; 1000 pairs are about what a translation model memorizes, which is what this measures.

Trees: the maximum spanning tree (Chu-Liu-Edmonds, single root) of the arc scores ``φ`` of one pass
over the plain sentence, for the flat model too (their §7.1). Scores without punctuation
(directed / undirected attachment, their Table 3) beside the left- and right-branching chains,
after every epoch (the learning curve) and at the end.

    python -m structures.experiments.translate --source en --epochs 40 [--hard | --attention flat | --head-input embeddings]
    python -m structures.experiments.translate --source en --epochs 40 --teacher-weight 1 [--translation-weight 0]
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
from structures.nn.attention import position_mask

from . import command_line, default_data_dir
from .attachment import chain_trees, score_trees
from .biaffine import length_groups
from .dmv import DMV
from .dmv import fit as fit_dmv
from .induce import LANGUAGES, with_punctuation, without_punctuation
from .parse import markdown_table, write_csv
from .provenance import provenance, provenance_line
from .progress import Progress, report
from .ud import PUD, Sentence, read_conllu
from .vocabulary import PAD, encode, word_index

ATTENTION = ("structured", "flat")
HEAD_INPUTS = ("states", "embeddings")


def target_index(sentences: Sequence[Sentence]) -> dict[str, int]:
    """Every target word (lower-cased) after ``<pad>``, ``<unk>``, ``<mask>``, then ``<s>`` and ``</s>``."""
    index = word_index(sentences, min_count=1)
    return {**index, "<s>": len(index), "</s>": len(index) + 1}


def decoder_ids(sentences: Sequence[Sentence], index: dict[str, int]) -> tuple[Tensor, Tensor]:
    """The decoder's inputs ``<s> y_1 .. y_m`` and outputs ``y_1 .. y_m </s>``, both ``[B, T]``
    (``T`` the longest ``m + 1``, ``<pad>`` after each)."""
    words, lengths = encode(sentences, index, bucket=1)
    B, T = len(sentences), int(lengths.max()) + 1
    inputs = torch.full((B, T), PAD, dtype=torch.long)
    outputs = torch.full((B, T), PAD, dtype=torch.long)
    for b, m in enumerate(lengths.tolist()):
        inputs[b, 0], inputs[b, 1:m + 1] = index["<s>"], words[b, :m]
        outputs[b, :m], outputs[b, m] = words[b, :m], index["</s>"]
    return inputs, outputs


def flat_marginals(theta: Tensor, lengths: Tensor) -> Tensor:
    """FA-NMT's self-attention in the layer's ``[B, N+1, N+1]`` convention: column ``m`` (a real
    word) the softmax of ``theta[:, :, m]`` over the root and the other real words; 0 elsewhere."""
    B, N1 = theta.shape[:2]
    heads = torch.arange(N1, device=theta.device)
    real = heads <= lengths.view(B, 1)  # [B, N+1]: the root and the real words
    allowed = real.unsqueeze(2) & real.unsqueeze(1) & (heads.view(-1, 1) != heads.view(1, -1))
    allowed[:, :, 0] = False
    beta = torch.softmax(theta.masked_fill(~allowed, float("-inf")), 1)
    return beta.nan_to_num(0.0)  # columns with no allowed head (the root's, padding) are 0


@torch.no_grad()
def teacher_marginals(teacher: DMV, sentences: Sequence[Sentence], tag_index: dict[str, int]) -> list[Tensor]:
    """The DMV's arc marginals ``[n+1, n+1]`` over each whole sentence: the DMV reads the sentence
    without punctuation (its gold tags), and each punctuation mark is attached with probability 1
    where :func:`~structures.experiments.induce.with_punctuation` puts it."""
    teacher.eval()
    out = []
    for s in sentences:
        bare = without_punctuation(s)
        if bare.n == 0:
            raise ValueError(f"sentences: {s.sent_id} is all punctuation; the DMV has nothing to parse")
        mu = teacher.crf(*encode([bare], tag_index, field="upos", bucket=1))[0].marginals[0]
        keep = [0] + [m for m, pos in enumerate(s.upos, 1) if pos != "PUNCT"]
        full = torch.zeros(s.n + 1, s.n + 1)
        full[torch.tensor(keep).view(-1, 1), torch.tensor(keep[1:]).view(1, -1)] = mu[:, 1:]
        for m, h in enumerate(with_punctuation(s, [0] * bare.n), 1):
            if s.upos[m - 1] == "PUNCT":
                full[h, m] = 1.0
        out.append(full)
    return out


class Translator(nn.Module):
    """SA-NMT (Bisk & Tran §4) of dimension ``dim``; ``attention="flat"``: FA-NMT; ``hard``: the
    best tree forward, the marginals' gradient backward; ``head_input="embeddings"``: the head
    selection (scores and values) reads the word embeddings instead of the BiLSTM states.

    ``forward(source [B, N], lengths [B], inputs [B, T], outputs [B, T])`` returns the summed
    cross-entropy of the target words (``<pad>`` outputs ignored) and the layer's tree
    distribution (None for the flat attention); ``tree_scores(source, lengths)``
    the layer's arc scores ``[B, N+1, N+1]`` (index 0 the root)."""

    def __init__(self, source_vocab: int, target_vocab: int, dim: int = 256, attention: str = "structured",
                 hard: bool = False, dropout: float = 0.3, head_input: str = "states"):
        super().__init__()
        if attention not in ATTENTION:
            raise ValueError(f"attention: expected one of {ATTENTION}, got {attention!r}")
        if head_input not in HEAD_INPUTS:
            raise ValueError(f"head_input: expected one of {HEAD_INPUTS}, got {head_input!r}")
        self.attention, self.hard, self.head_input = attention, hard, head_input
        self.source_embedding = nn.Embedding(source_vocab, dim, padding_idx=PAD)
        self.encoder = nn.LSTM(dim, dim // 2, batch_first=True, bidirectional=True)
        self.heads = StructuredSelfAttention(dim, scores="dot", output="parent", hard=hard)
        self.value = nn.Linear(dim, dim, bias=False)  # W_v
        self.target_embedding = nn.Embedding(target_vocab, dim, padding_idx=PAD)
        self.decoder = nn.LSTMCell(2 * dim, dim)  # [y_{t-1}; u_{t-1}]: input feeding
        self.align = nn.Linear(dim, dim, bias=False)  # W_a
        self.gate = nn.Linear(dim, dim, bias=False)  # W_g
        self.combine = nn.Linear(3 * dim, dim)  # g of eq. 12
        self.output_bias = nn.Parameter(torch.zeros(target_vocab))  # the output layer's weights are the target embeddings
        self.dropout = nn.Dropout(dropout)

    def encode(self, source: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """The content annotations ``S [B, N, dim]`` and what the head selection reads (``S``, or
        with ``head_input="embeddings"`` the word embeddings), both 0 at padding."""
        embedded = self.dropout(self.source_embedding(source))
        packed = nn.utils.rnn.pack_padded_sequence(embedded, lengths.cpu(), batch_first=True, enforce_sorted=False)
        states = nn.utils.rnn.pad_packed_sequence(self.encoder(packed)[0], batch_first=True, total_length=source.shape[1])[0]
        return states, states if self.head_input == "states" else embedded

    def tree_scores(self, source: Tensor, lengths: Tensor) -> Tensor:
        return self.heads.arc_scores(self.encode(source, lengths)[1])

    def syntax(self, words: Tensor, lengths: Tensor) -> tuple[Tensor, StructuredDistribution | None]:
        """The syntactic annotations ``M [B, N, dim]``: each word's soft parent's value vector,
        scores and values from ``words`` (the head selection's input); and the layer's tree
        distribution (None for the flat attention)."""
        values = self.value(words)
        if self.attention == "structured":
            out = self.heads(words, values, lengths)
            return out.context, out.distribution
        return self.heads.read(flat_marginals(self.heads.arc_scores(words), lengths), values, lengths), None

    def forward(self, source: Tensor, lengths: Tensor, inputs: Tensor,
                outputs: Tensor) -> tuple[Tensor, StructuredDistribution | None]:
        states, words = self.encode(source, lengths)
        syntax, trees = self.syntax(words, lengths)
        padded = ~position_mask(lengths, *source.shape, source.device)
        B, dim = source.shape[0], states.shape[-1]
        h = c = u = states.new_zeros(B, dim)
        embedded = self.dropout(self.target_embedding(inputs))
        feeds = []
        for t in range(inputs.shape[1]):
            h, c = self.decoder(torch.cat([embedded[:, t], u], -1), (h, c))
            alpha = torch.softmax((states @ self.align(h).unsqueeze(-1)).squeeze(-1).masked_fill(padded, float("-inf")), -1)
            context = (alpha.unsqueeze(1) @ states).squeeze(1)
            syntactic = (alpha.unsqueeze(1) @ syntax).squeeze(1) * torch.sigmoid(self.gate(h))
            u = torch.tanh(self.combine(torch.cat([h, context, syntactic], -1)))
            feeds.append(u)
        logits = self.dropout(torch.stack(feeds, 1)) @ self.target_embedding.weight.T + self.output_bias
        return nn.functional.cross_entropy(logits.flatten(0, 1), outputs.flatten(), ignore_index=PAD, reduction="sum"), trees


def tree_cross_entropy(trees: StructuredDistribution, target: Tensor) -> Tensor:
    """The summed cross-entropy of an edge-factored tree distribution against arc marginals
    ``target [B, N+1, N+1]`` (a teacher's posterior): ``log Z(θ) - Σ target ⊙ θ`` per sentence."""
    return (trees.log_partition - (target * trees.log_potentials).sum((-2, -1))).sum()


def train_epoch(model: Translator, pairs: Sequence[tuple[Sentence, Sentence]], source_index: dict[str, int],
                index: dict[str, int], optimizer: torch.optim.Optimizer, rng: random.Random,
                tokens_per_batch: int = 800, teacher: Sequence[Tensor] | None = None, teacher_weight: float = 0.0,
                translation_weight: float = 1.0) -> float:
    """One pass over batches of pairs of similar source lengths; returns the mean cross-entropy per
    target word (``</s>`` included). The loss is ``translation_weight`` times that, plus, with
    ``teacher`` (arc marginals ``[n+1, n+1]`` per pair), ``teacher_weight`` times
    :func:`tree_cross_entropy` of the layer's trees per source word."""
    model.train()
    total, count = 0.0, 0
    for group in length_groups([s for s, _ in pairs], tokens_per_batch, rng):
        sources, targets = [pairs[i][0] for i in group], [pairs[i][1] for i in group]
        source, lengths = encode(sources, source_index, bucket=1)
        inputs, outputs = decoder_ids(targets, index)
        words = int((outputs != PAD).sum())
        loss, trees = model(source, lengths, inputs, outputs)
        objective = translation_weight * loss / words
        if teacher is not None:
            N = source.shape[1]
            target = torch.stack([nn.functional.pad(teacher[i], (0, N - pairs[i][0].n, 0, N - pairs[i][0].n)) for i in group])
            objective = objective + teacher_weight * tree_cross_entropy(trees, target) / lengths.sum()
        optimizer.zero_grad()
        objective.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        total += float(loss.detach())
        count += words
    return total / count


@torch.no_grad()
def induced_trees(model: Translator, sentences: Sequence[Sentence], index: dict[str, int],
                  tokens_per_batch: int = 4000) -> list[list[int]]:
    """The maximum spanning tree (single root) of the layer's arc scores on each plain sentence."""
    model.eval()
    out: list[list[int]] = [[] for _ in sentences]
    for group in length_groups(sentences, tokens_per_batch):
        source, lengths = encode([sentences[i] for i in group], index, bucket=1)
        heads = model.heads.structure(model.tree_scores(source, lengths), lengths, True).decode()
        for b, i in enumerate(group):
            out[i] = heads[b, :sentences[i].n].tolist()
    return out


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = command_line("translate", __doc__)
    p.add_argument("--source", choices=sorted(PUD), default="en", help="the source language; the target is the other one")
    p.add_argument("--attention", choices=ATTENTION, default="structured",
                   help="the source words' head selection: matrix-tree marginals (SA-NMT) or a softmax per word (FA-NMT)")
    p.add_argument("--hard", action="store_true", help="straight-through: the best tree forward, the marginals backward")
    p.add_argument("--head-input", choices=HEAD_INPUTS, default="states",
                   help="what the head selection's scores and values read: the BiLSTM states (the paper) or the word "
                        "embeddings (a bag of words, the change their §7.3 proposes: a state already summarizes its neighbours)")
    p.add_argument("--teacher-weight", type=float, default=0.0,
                   help="an auxiliary signal: add this weight times the cross-entropy of the layer's trees against the posterior "
                        "of a DMV fitted to the source language's POS tags (induce's DMV: 10 restarts, the most likely kept)")
    p.add_argument("--translation-weight", type=float, default=1.0,
                   help="the weight of the translation loss (0 with --teacher-weight: the teacher alone, the control)")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--dropout", type=float, default=0.3)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-sentences", type=int, default=None, help="use the first this many pairs")
    p.add_argument("--quick", action="store_true", help="40 pairs, 2 epochs, dimension 32 (seconds)")
    p.add_argument("--data-dir", type=Path, default=default_data_dir(),
                   help="the shared data sets (default: $STRUCTURES_DATA_DIR, else ../shared/data beside the checkout)")
    p.add_argument("--out", type=Path, default=Path("results/translate"))
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.quick:
        args.max_sentences, args.epochs, args.dim = args.max_sentences or 40, 2, 32
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    wall = time.perf_counter()

    target_language = next(lang for lang in PUD if lang != args.source)
    sources = read_conllu(args.data_dir / "ud" / PUD[args.source], args.max_sentences)
    targets = read_conllu(args.data_dir / "ud" / PUD[target_language], args.max_sentences)
    if [s.sent_id for s in sources] != [t.sent_id for t in targets]:
        raise SystemExit(f"translate: {PUD[args.source]} and {PUD[target_language]} are not sentence-aligned (sent_id)")
    pairs = list(zip(sources, targets))
    source_index, index = word_index(sources, min_count=1), target_index(targets)
    teacher = None
    if not (args.translation_weight or args.teacher_weight):
        p.error("--translation-weight 0: only with --teacher-weight (nothing would train the model)")
    if args.teacher_weight:
        if args.attention != "structured":
            p.error("--teacher-weight: the teacher's trees need the structured layer")
        text = [v for f in LANGUAGES[args.source][0] for s in read_conllu(args.data_dir / "ud" / f, args.max_sentences)
                if 0 < (v := without_punctuation(s)).n <= 60]
        tag_index = word_index(text, min_count=1, field="upos")
        dmv = fit_dmv(text, tag_index, 2 if args.quick else 12, 2, 0.01, 0.01, range(1 if args.quick else 10))[0]
        teacher = teacher_marginals(dmv, sources, tag_index)
    model = Translator(len(source_index), len(index), args.dim, args.attention, args.hard, args.dropout, args.head_input)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    name = f"{args.source}_{target_language}_{args.attention}" + ("_hard" if args.hard else "") + \
        ("_embeddings" if args.head_input == "embeddings" else "") + \
        (f"_dmv{args.teacher_weight:g}" if args.teacher_weight else "") + \
        (f"_translation{args.translation_weight:g}" if args.translation_weight != 1 else "") + f"_seed{args.seed}"
    args.out.mkdir(parents=True, exist_ok=True)

    def scores(trees: list[list[int]]) -> dict[str, float]:
        s = score_trees(sources, trees)
        return {"DA_p": 100 * s["directed_no_punct"], "UA_p": 100 * s["undirected_no_punct"], "DA": 100 * s["directed"],
                "UA": 100 * s["undirected"], "height": s["mean_height"], "adjacent_arcs": 100 * s["adjacent_arcs"],
                "same_upos_p": 100 * s["same_upos_no_punct"], "projective": 100 * s["projective"]}

    curve = [{"epoch": 0, "loss": float("nan"), "seconds": 0.0, **scores(induced_trees(model, sources, source_index))}]
    start = time.perf_counter()
    for epoch in (bar := Progress(range(args.epochs), desc=f"translate {args.source}->{target_language}")):
        loss = train_epoch(model, pairs, source_index, index, optimizer, rng, teacher=teacher, teacher_weight=args.teacher_weight,
                           translation_weight=args.translation_weight)
        curve.append({"epoch": epoch + 1, "loss": loss, "seconds": time.perf_counter() - start,
                      **scores(induced_trees(model, sources, source_index))})
        report(bar, epoch, loss=f"{loss:.3f}", DA_p=f"{curve[-1]['DA_p']:.1f}", UA_p=f"{curve[-1]['UA_p']:.1f}")

    induced = induced_trees(model, sources, source_index)
    wall = time.perf_counter() - wall
    trees = {"gold": [list(s.heads) for s in sources], "induced": induced, **chain_trees(sources)}
    rows = [{"source": args.source, "attention": args.attention, "hard": args.hard, "head_input": args.head_input,
             "teacher_weight": args.teacher_weight, "translation_weight": args.translation_weight, "seed": args.seed, "trees": k,
             "pairs": len(pairs), "epochs": args.epochs, **scores(v), "final_loss": curve[-1]["loss"],
             "perplexity": float(torch.tensor(curve[-1]["loss"]).exp()), "wall_s": wall}
            for k, v in trees.items()]
    for path, table in ((args.out / f"{name}.csv", [{**r, **provenance([args.seed])} for r in rows]),
                        (args.out / f"{name}_epochs.csv", curve)):
        write_csv(path, table)
    (args.out / f"{name}.md").write_text(markdown_table(rows) + "\n" + provenance_line([args.seed]))
    draw(model, sources, source_index, trees, curve, args.out, name)
    print(markdown_table(rows))
    return rows


@torch.no_grad()
def draw(model: Translator, sentences: Sequence[Sentence], index: dict[str, int], trees: dict[str, list[list[int]]],
         curve: list[dict], out: Path, name: str, shortest: int = 8, longest: int = 14) -> None:
    """Arc diagrams (gold, induced, chains) of one short sentence, the heatmap of the layer's arc
    marginals on it, and the learning curve (:func:`draw_curve`)."""
    from .arcs import draw_marginals, draw_trees

    i = next((k for k, s in enumerate(sentences) if shortest <= s.n <= longest), 0)
    s = sentences[i]
    draw_trees(s.words, {k: v[i] for k, v in trees.items()}, out / f"{name}_trees.png", title=f"{s.sent_id} (red: arcs not in gold)")
    source, lengths = encode([s], index, bucket=1)
    theta = model.tree_scores(source, lengths)
    marginals = model.heads.structure(theta, lengths, True).marginals if model.attention == "structured" else flat_marginals(theta, lengths)
    draw_marginals(s.words, marginals[0].tolist(), out / f"{name}_marginals.png", gold=list(s.heads), title="arc marginals (plain sentence)")
    draw_curve(curve, sentences, out / f"{name}_curve.png")


def draw_curve(curve: list[dict], sentences: Sequence[Sentence], path: Path) -> None:
    """The learning curve: the loss, and the induced trees' DA-p and UA-p after every epoch (rows of
    ``curve``, as in ``<name>_epochs.csv``) beside the chains' on ``sentences``."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    epochs = [c["epoch"] for c in curve]
    left.plot(epochs[1:], [c["loss"] for c in curve[1:]], marker=".")
    left.set_xlabel("epoch")
    left.set_ylabel("cross-entropy (nats a target word)")
    chains = {k: score_trees(sentences, v) for k, v in chain_trees(sentences).items()}
    for key, score, color in (("DA_p", "directed_no_punct", "C0"), ("UA_p", "undirected_no_punct", "C1")):
        right.plot(epochs, [c[key] for c in curve], marker=".", color=color, label=f"induced {key}")
        for k, style in (("left-branching", ":"), ("right-branching", "--")):  # the values in the legend: the UA_p lines may coincide
            value = 100 * chains[k][score]
            right.axhline(value, color=color, linestyle=style, alpha=0.6, label=f"{k} {key} {value:.1f}")
    right.set_xlabel("epoch")
    right.set_ylabel("attachment, no punctuation (%)")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
