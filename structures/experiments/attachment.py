"""Attachment scores of predicted trees against gold trees, and what kind of tree a head list is.

Trees are head lists: ``heads[i]`` is the head of word ``i+1``, 0 the root.

UAS and LAS are those of the CoNLL 2018 shared task's evaluation script (``conll18_ud_eval.py``)
on gold tokenization: over the syntactic words only (multiword tokens and empty nodes are not
words, see :mod:`structures.experiments.ud`), punctuation included, and LAS compares only the
universal part of a label (``nmod:poss`` counts as ``nmod``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .ud import Sentence

PUNCT = "PUNCT"


def universal(label: str) -> str:
    """The universal dependency relation of a label: the part before any ``:`` subtype."""
    return label.split(":", 1)[0]


@dataclass
class Attachment:
    """Counts of correctly attached words, all words and words other than punctuation (UPOS PUNCT).

    ``uas``, ``las``: the CoNLL 2018 scores (see the module docstring); the ``_no_punct`` variants
    leave out words whose gold UPOS is PUNCT."""

    words: int = 0
    heads: int = 0
    labelled: int = 0
    words_no_punct: int = 0
    heads_no_punct: int = 0
    labelled_no_punct: int = 0
    undirected: int = 0

    @property
    def uas(self) -> float:
        return self.heads / max(self.words, 1)

    @property
    def las(self) -> float:
        return self.labelled / max(self.words, 1)

    @property
    def uas_no_punct(self) -> float:
        return self.heads_no_punct / max(self.words_no_punct, 1)

    @property
    def las_no_punct(self) -> float:
        return self.labelled_no_punct / max(self.words_no_punct, 1)

    @property
    def undirected_accuracy(self) -> float:
        """Words whose predicted arc joins the same two nodes as a gold arc, either direction."""
        return self.undirected / max(self.words, 1)

    def add(self, gold_heads: Sequence[int], heads: Sequence[int], upos: Sequence[str],
            gold_labels: Sequence[str] | None = None, labels: Sequence[str] | None = None) -> None:
        """Count one sentence (all sequences have one entry per syntactic word); a label is right
        when its universal part is."""
        if not len(gold_heads) == len(heads) == len(upos):
            raise ValueError(f"gold_heads, heads, upos: expected one entry per word, got {len(gold_heads)}, {len(heads)}, {len(upos)}")
        gold_arcs = {frozenset((h, m)) for m, h in enumerate(gold_heads, 1)}
        for i, (g, h, pos) in enumerate(zip(gold_heads, heads, upos)):
            right = int(g == h)
            labelled = right * int(labels is not None and gold_labels is not None and universal(labels[i]) == universal(gold_labels[i]))
            self.words += 1
            self.heads += right
            self.labelled += labelled
            self.undirected += int(frozenset((h, i + 1)) in gold_arcs)
            if pos != PUNCT:
                self.words_no_punct += 1
                self.heads_no_punct += right
                self.labelled_no_punct += labelled


def is_tree(heads: Sequence[int]) -> bool:
    """Every head in ``0..n``, no self-loop, and every word reaches the root (no cycle)."""
    n = len(heads)
    if any(not 0 <= h <= n or h == m for m, h in enumerate(heads, 1)):
        return False
    state = [0] * (n + 1)  # 0 unvisited, 1 on the current path, 2 reaches the root
    state[0] = 2
    for start in range(1, n + 1):
        path, m = [], start
        while state[m] == 0:
            state[m] = 1
            path.append(m)
            m = heads[m - 1]
        if state[m] == 1:
            return False
        for p in path:
            state[p] = 2
    return True


def root_children(heads: Sequence[int]) -> int:
    return sum(h == 0 for h in heads)


def is_projective(heads: Sequence[int]) -> bool:
    """No two arcs cross (with the root at position 0 as in the usual arc drawing), for a tree."""
    arcs = [(min(h, m), max(h, m)) for m, h in enumerate(heads, 1)]
    for a, b in arcs:
        for c, d in arcs:
            if a < c < b < d:
                return False
    return True


@dataclass
class TreeShapes:
    """How many predicted head lists are trees, single-rooted trees and projective trees."""

    total: int = 0
    trees: int = 0
    single_root: int = 0
    projective: int = 0

    def add(self, heads: Sequence[int]) -> None:
        self.total += 1
        if is_tree(heads):
            self.trees += 1
            self.single_root += int(root_children(heads) == 1)
            self.projective += int(is_projective(heads))

    def fractions(self) -> dict[str, float]:
        t = max(self.total, 1)
        return {"valid": self.trees / t, "single_root": self.single_root / t, "projective": self.projective / t,
                "non_projective": (self.trees - self.projective) / t}


def depths(heads: Sequence[int]) -> list[int]:
    """The depth of every word of a tree (a child of the root has depth 1)."""
    out = [0] * (len(heads) + 1)  # out[0]: the root
    for m in range(1, len(heads) + 1):
        path = []
        while m != 0 and out[m] == 0:  # climb to a known depth (iterative: chains may be long)
            path.append(m)
            m = heads[m - 1]
        for p in reversed(path):
            out[p] = out[heads[p - 1]] + 1
    return out[1:]


@dataclass
class TreeStatistics:
    """Shape statistics of a set of trees: mean height, depth distribution, share projective,
    mean arc length, share of arcs between adjacent words."""

    trees: int = 0
    words: int = 0
    height: int = 0
    projective: int = 0
    arc_length: int = 0
    adjacent: int = 0
    depth_counts: dict[int, int] = field(default_factory=dict)

    def add(self, heads: Sequence[int]) -> None:
        if not is_tree(heads):
            raise ValueError(f"heads: expected a tree, got {list(heads)}")
        d = depths(heads)
        self.trees += 1
        self.words += len(heads)
        self.height += max(d)
        self.projective += int(is_projective(heads))
        self.arc_length += sum(abs(h - m) for m, h in enumerate(heads, 1) if h != 0)
        self.adjacent += sum(abs(h - m) == 1 for m, h in enumerate(heads, 1) if h != 0)
        for x in d:
            self.depth_counts[x] = self.depth_counts.get(x, 0) + 1

    def summary(self) -> dict[str, float]:
        arcs = max(self.words - self.trees, 1)  # arcs between words (one root arc per tree)
        return {"mean_height": self.height / max(self.trees, 1), "projective": self.projective / max(self.trees, 1),
                "mean_arc_length": self.arc_length / arcs, "adjacent_arcs": self.adjacent / arcs,
                "mean_depth": sum(k * v for k, v in self.depth_counts.items()) / max(self.words, 1)}


def chain_trees(sentences: Sequence[Sentence]) -> dict[str, list[list[int]]]:
    """``right-branching``: word m headed by word m-1 (word 1 the root's child);
    ``left-branching``: word m headed by word m+1 (the last word the root's child)."""
    return {"right-branching": [list(range(s.n)) for s in sentences],
            "left-branching": [[m + 1 for m in range(1, s.n)] + [0] for s in sentences]}


def score_trees(sentences: Sequence[Sentence], trees: Sequence[Sequence[int]]) -> dict[str, float]:
    """Directed and undirected attachment accuracy, with and without punctuation (``_no_punct``:
    over the words whose gold UPOS is not PUNCT, as Bisk & Tran's Table 3), tree statistics, and
    ``same_upos_no_punct``: the share of those words whose head has their own gold UPOS."""
    a, stats = Attachment(), TreeStatistics()
    undirected, same, words = 0, 0, 0
    for s, heads in zip(sentences, trees):
        a.add(s.heads, heads, s.upos)
        stats.add(heads)
        gold = {frozenset((h, m)) for m, h in enumerate(s.heads, 1)}
        for m, (h, pos) in enumerate(zip(heads, s.upos), 1):
            if pos != "PUNCT":
                words += 1
                undirected += frozenset((h, m)) in gold
                same += h > 0 and s.upos[h - 1] == pos
    return {"directed": a.uas, "directed_no_punct": a.uas_no_punct, "undirected": a.undirected_accuracy,
            "undirected_no_punct": undirected / max(words, 1), "same_upos_no_punct": same / max(words, 1), **stats.summary()}
