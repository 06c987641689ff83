"""Scores of a clustering against gold classes (induced tags against gold tags, one pair per token)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Hashable, Sequence


def _pairs(predicted: Sequence[Hashable], gold: Sequence[Hashable]) -> Counter:
    if len(predicted) != len(gold) or not gold:
        raise ValueError(f"predicted, gold: expected two non-empty sequences of one length, got {len(predicted)} and {len(gold)}")
    return Counter(zip(predicted, gold))


def many_to_one(predicted: Sequence[Hashable], gold: Sequence[Hashable]) -> float:
    """The accuracy once every cluster is mapped to the gold class it most often meets (several
    clusters may map to one class)."""
    best: dict[Hashable, int] = {}
    for (k, _), count in _pairs(predicted, gold).items():
        best[k] = max(best.get(k, 0), count)
    return sum(best.values()) / len(gold)


def _entropy(counts: Counter, total: int) -> float:
    return -sum(c / total * math.log(c / total) for c in counts.values())


def v_measure(predicted: Sequence[Hashable], gold: Sequence[Hashable], beta: float = 1.0) -> tuple[float, float, float]:
    """``(homogeneity, completeness, V)`` of Rosenberg & Hirschberg (2007): ``h = 1 - H(gold | cluster) / H(gold)``,
    ``c = 1 - H(cluster | gold) / H(cluster)`` (1 where the denominator is 0), ``V = (1 + β) h c / (β h + c)``."""
    pairs = _pairs(predicted, gold)
    total = len(gold)
    clusters, classes = Counter(predicted), Counter(gold)
    joint = _entropy(pairs, total)
    h_gold, h_cluster = _entropy(classes, total), _entropy(clusters, total)
    h = 1.0 if h_gold == 0 else 1 - (joint - h_cluster) / h_gold
    c = 1.0 if h_cluster == 0 else 1 - (joint - h_gold) / h_cluster
    return h, c, 0.0 if h + c == 0 else (1 + beta) * h * c / (beta * h + c)
