"""Is one system better than another? A paired bootstrap over test items and Welch's t-test over seeds.

    python -m structures.experiments.significance parses GOLD.conllu A.conllu B.conllu [--no-punct]
    python -m structures.experiments.significance questions A/babi_questions.csv B/babi_questions.csv [--facts] [--models binary memn2n]
    python -m structures.experiments.significance formulas RUN/formulas.csv --a structured --b simple
    python -m structures.experiments.significance seeds --a 76.99 77.08 77.25 --b 77.13 76.61 76.48

``parses`` compares two parsers' predicted CoNLL-U files (as ``structures.experiments.parse``
writes them) on the same gold file by a paired bootstrap over sentences of the corpus-level UAS;
``questions`` compares two bAbI runs over their test questions and ``formulas`` two models of one
transduction run over its test formulas, each by a paired bootstrap of the mean per group (task,
depth) and over all; ``seeds`` compares two lists of per-seed scores by Welch's t-test. The rule they serve is in
docs/protocol.md: wherever two systems are compared, the comparison states its significance.

The bootstrap (Efron & Tibshirani 1993; for NLP, Koehn 2004 and Berg-Kirkpatrick et al. 2012)
resamples the test items with replacement, the same items for both systems, and recomputes the
difference of their scores. Its two-sided p-value is the share of resampled differences at least as
far from the observed difference as the observed difference is from zero (the bootstrap
distribution shifted to the null hypothesis of no difference); its confidence interval is the
percentile interval of the resampled differences.
"""

from __future__ import annotations

import argparse
import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from . import command_line

CHUNK = 1000  # resamples drawn at once: bounds the index array at CHUNK × items


@dataclass(frozen=True)
class Comparison:
    """The difference ``score(a) - score(b)``, its ``confidence`` interval ``[low, high]`` and the
    two-sided ``p_value`` of the hypothesis that the two systems score the same."""

    difference: float
    low: float
    high: float
    p_value: float
    confidence: float

    def __str__(self) -> str:
        pct = round(100 * self.confidence)
        return f"difference {self.difference:+.4g} ({pct}% CI {self.low:+.4g} to {self.high:+.4g}), p = {self.p_value:.3g}"


def _score(values: np.ndarray, totals: np.ndarray | None) -> np.ndarray:
    """Per row of ``values`` (resamples × items): the mean, or sum(values) / sum(totals)."""
    if totals is None:
        return values.mean(axis=-1)
    return values.sum(axis=-1) / totals.sum(axis=-1)


def paired_bootstrap(a: Sequence[float], b: Sequence[float], totals: Sequence[float] | None = None, *,
                     samples: int = 10_000, confidence: float = 0.95, seed: int = 0) -> Comparison:
    """Paired bootstrap of the difference between two systems scored on the same items.

    ``a[i]``, ``b[i]``: the two systems' scores on item ``i`` (a sentence, a question). Without
    ``totals`` a system's score is the mean of its item scores (accuracy over questions); with
    ``totals`` it is ``sum(a) / sum(totals)``, a corpus-level ratio such as UAS with ``a[i]`` the
    correctly attached words of sentence ``i`` and ``totals[i]`` its words. ``samples`` resamples
    of the items, drawn from a generator seeded with ``seed`` (the result is reproducible).
    """
    a_, b_ = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    t_ = None if totals is None else np.asarray(totals, dtype=np.float64)
    if a_.ndim != 1 or a_.shape != b_.shape or (t_ is not None and t_.shape != a_.shape):
        raise ValueError(f"a, b, totals: expected equal 1-d lengths, got {a_.shape}, {b_.shape}, "
                         f"{None if t_ is None else t_.shape}")
    if len(a_) == 0:
        raise ValueError("a, b: expected at least one item, got none")
    if samples < 1 or not 0 < confidence < 1:
        raise ValueError(f"samples, confidence: expected >= 1 and in (0, 1), got {samples}, {confidence}")
    observed = float(_score(a_ - b_, t_))
    rng = np.random.default_rng(seed)
    resampled = []
    for start in range(0, samples, CHUNK):
        index = rng.integers(0, len(a_), size=(min(CHUNK, samples - start), len(a_)))
        resampled.append(_score((a_ - b_)[index], None if t_ is None else t_[index]))
    differences = np.concatenate(resampled)
    # a tie with the observed distance counts as "at least as far" (the distribution is discrete)
    far = np.abs(differences - observed) >= abs(observed) * (1 - 1e-9)
    p_value = (1 + int(far.sum())) / (samples + 1)
    low, high = np.quantile(differences, [(1 - confidence) / 2, (1 + confidence) / 2])
    return Comparison(observed, float(low), float(high), min(p_value, 1.0), confidence)


def _incomplete_beta(x: float, p: float, q: float) -> float:
    """The regularized incomplete beta function I_x(p, q), by its continued fraction (modified Lentz)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (p + 1) / (p + q + 2):  # the fraction converges fast only below the mean
        return 1.0 - _incomplete_beta(1 - x, q, p)
    front = math.exp(math.lgamma(p + q) - math.lgamma(p) - math.lgamma(q) + p * math.log(x) + q * math.log1p(-x)) / p
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            numerator = 1.0
        elif i % 2 == 0:
            numerator = m * (q - m) * x / ((p + 2 * m - 1) * (p + 2 * m))
        else:
            numerator = -(p + m) * (p + q + m) * x / ((p + 2 * m) * (p + 2 * m + 1))
        d = 1.0 + numerator * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + numerator / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-15:
            break
    return front * (f - 1.0)


def t_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t distribution with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"df: expected > 0, got {df}")
    return _incomplete_beta(df / (df + t * t), df / 2, 0.5)


@dataclass(frozen=True)
class Welch:
    """Welch's t-test of ``mean(a) - mean(b)``: the statistic ``t``, its degrees of freedom ``df``
    (Welch-Satterthwaite) and the two-sided ``p_value``."""

    difference: float
    t: float
    df: float
    p_value: float

    def __str__(self) -> str:
        return f"difference {self.difference:+.4g}, Welch t = {self.t:.3f}, df = {self.df:.2f}, p = {self.p_value:.3g}"


def welch(a: Sequence[float], b: Sequence[float]) -> Welch:
    """Welch's unequal-variance t-test between two samples of per-seed scores (at least two each)."""
    a_, b_ = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a_.ndim != 1 or b_.ndim != 1 or len(a_) < 2 or len(b_) < 2:
        raise ValueError(f"a, b: expected two 1-d samples of at least 2 scores, got shapes {a_.shape}, {b_.shape}")
    va, vb = a_.var(ddof=1) / len(a_), b_.var(ddof=1) / len(b_)
    difference = float(a_.mean() - b_.mean())
    if va + vb == 0:
        return Welch(difference, math.copysign(math.inf, difference) if difference else 0.0, math.inf,
                     1.0 if difference == 0 else 0.0)
    t = difference / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a_) - 1) + vb ** 2 / (len(b_) - 1))
    return Welch(difference, t, df, t_two_sided(t, df))


def attached_per_sentence(gold: Sequence, predicted: Sequence, no_punct: bool = False) -> tuple[list[int], list[int]]:
    """Per sentence, the words whose predicted head is the gold one, and the words scored (all
    syntactic words, or those whose gold UPOS is not PUNCT): UAS is ``sum(first) / sum(second)``.
    ``gold`` and ``predicted`` are :class:`~structures.experiments.ud.Sentence` lists of the same text."""
    if len(gold) != len(predicted):
        raise ValueError(f"predicted: expected {len(gold)} sentences, as the gold file, got {len(predicted)}")
    right, words = [], []
    for i, (g, p) in enumerate(zip(gold, predicted)):
        if g.words != p.words:
            raise ValueError(f"predicted: sentence {i + 1} has other words than the gold one")
        kept = [k for k in range(g.n) if not (no_punct and g.upos[k] == "PUNCT")]
        right.append(sum(g.heads[k] == p.heads[k] for k in kept))
        words.append(len(kept))
    return right, words


def compare_parses(gold: Path, a: Path, b: Path, no_punct: bool = False, samples: int = 10_000,
                   seed: int = 0) -> tuple[float, float, Comparison]:
    """UAS of parses ``a`` and ``b`` of the gold file's sentences, and their paired bootstrap over sentences."""
    from .ud import read_conllu

    reference = read_conllu(gold)
    right_a, words = attached_per_sentence(reference, read_conllu(a), no_punct)
    right_b, _ = attached_per_sentence(reference, read_conllu(b), no_punct)
    total = sum(words)
    return (sum(right_a) / total, sum(right_b) / total,
            paired_bootstrap(right_a, right_b, words, samples=samples, seed=seed))


def compare_groups(groups: dict[str, tuple[Sequence[float], Sequence[float]]], samples: int = 10_000,
                   seed: int = 0) -> dict[str, tuple[float, float, Comparison]]:
    """A paired bootstrap of the mean item score for each group of items: ``{name: (a's items,
    b's items)}`` with scores in [0, 1] gives ``{name: (mean a, mean b, a - b)}`` in %."""
    out = {}
    for name, (xa, xb) in groups.items():
        c = paired_bootstrap(xa, xb, samples=samples, seed=seed)
        out[name] = (100 * float(np.mean(xa)), 100 * float(np.mean(xb)),
                     Comparison(100 * c.difference, 100 * c.low, 100 * c.high, c.p_value, c.confidence))
    return out


def compare_questions(a: Path, b: Path, column: str = "answer_correct", samples: int = 10_000,
                      seed: int = 0, models: tuple[str | None, str | None] = (None, None)
                      ) -> dict[str, tuple[float, float, Comparison]]:
    """Paired bootstraps over the test questions of two bAbI runs' ``babi_questions.csv`` files
    (:func:`structures.experiments.babi.write_questions`), per task and model and over all of them:
    ``{"task 2 binary": (accuracy a, accuracy b, a - b), ..., "all": ...}`` (accuracies in %). The
    two files must score the same questions. ``models`` (a's, b's) compares one model of each file,
    e.g. ``("binary", "memn2n")``, question by question (groups ``"task 2 binary - memn2n"``)."""

    label = " - ".join(str(m) for m in models) if models[0] is not None else ""
    if (models[0] is None) != (models[1] is None):
        raise ValueError(f"models: expected both files' models or neither, got {models}")

    def read(path: Path, model: str | None) -> dict[tuple[str, str, str], float]:
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if model is None or r["model"] == model]
        if model is not None and not rows:
            raise ValueError(f"models: expected a model that {path} scores, got {model!r}")
        return {(r["task"], r["model"] if model is None else label, r["question"]): float(r[column]) for r in rows}

    ra, rb = read(a, models[0]), read(b, models[1])
    if ra.keys() != rb.keys():
        raise ValueError(f"a, b: expected the same tasks, models and questions, got {len(ra)} and {len(rb)} "
                         f"({len(ra.keys() ^ rb.keys())} not in both)")
    groups: dict[str, list[tuple[str, str, str]]] = {}
    for key in ra:
        groups.setdefault(f"task {key[0]} {key[1]}", []).append(key)
    groups["all"] = list(ra)
    return compare_groups({name: ([ra[k] for k in keys], [rb[k] for k in keys]) for name, keys in groups.items()},
                          samples, seed)


def compare_formulas(path: Path, a: str, b: str, samples: int = 10_000,
                     seed: int = 0) -> dict[str, tuple[float, float, Comparison]]:
    """Paired bootstraps over the test formulas of a transduction run's ``formulas.csv``
    (:func:`structures.experiments.transduction.write_tables`) between its models ``a`` and ``b``,
    per nesting depth and over all: ``{"depth 2": (length to failure a, b, a - b), ..., "all": ...}`` (in %)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for model in (a, b):
        if not rows or model not in rows[0]:
            raise ValueError(f"a, b: expected models of {path} ({', '.join(list(rows[0])[3:]) if rows else 'none'}), "
                             f"got {model!r}")
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(f"depth {r['depth']}", []).append(r)
    groups["all"] = rows
    return compare_groups({name: ([float(r[a]) for r in rs], [float(r[b]) for r in rs]) for name, rs in groups.items()},
                          samples, seed)


def main(argv: Sequence[str] | None = None) -> None:
    p = command_line("significance", __doc__)
    sub = p.add_subparsers(dest="command", required=True)
    parses = sub.add_parser("parses", help="paired bootstrap over sentences of two parses' UAS",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parses.add_argument("gold", type=Path)
    parses.add_argument("a", type=Path)
    parses.add_argument("b", type=Path)
    parses.add_argument("--no-punct", action="store_true", help="leave out words whose gold UPOS is PUNCT")
    parses.add_argument("--samples", type=int, default=10_000, help="bootstrap resamples of the sentences")
    parses.add_argument("--seed", type=int, default=0, help="the resampling generator's seed")
    questions = sub.add_parser("questions", help="paired bootstrap over the questions of two bAbI runs' babi_questions.csv",
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    questions.add_argument("a", type=Path)
    questions.add_argument("b", type=Path)
    questions.add_argument("--facts", action="store_true", help="compare supporting-fact accuracy, not answer accuracy")
    questions.add_argument("--models", nargs=2, metavar=("A_MODEL", "B_MODEL"), default=(None, None),
                           help="compare a's model A_MODEL with b's model B_MODEL (e.g. binary memn2n)")
    questions.add_argument("--samples", type=int, default=10_000, help="bootstrap resamples of the questions")
    questions.add_argument("--seed", type=int, default=0, help="the resampling generator's seed")
    formulas = sub.add_parser("formulas", help="paired bootstrap over the test formulas of two models of a transduction run",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    formulas.add_argument("csv", type=Path, help="the run's formulas.csv")
    formulas.add_argument("--a", required=True, help="a model column, e.g. structured")
    formulas.add_argument("--b", required=True, help="another model column, e.g. simple")
    formulas.add_argument("--samples", type=int, default=10_000, help="bootstrap resamples of the formulas")
    formulas.add_argument("--seed", type=int, default=0, help="the resampling generator's seed")
    seeds = sub.add_parser("seeds", help="Welch's t-test between two systems' per-seed scores")
    seeds.add_argument("--a", type=float, nargs="+", required=True)
    seeds.add_argument("--b", type=float, nargs="+", required=True)
    args = p.parse_args(argv)
    if args.command == "parses":
        uas_a, uas_b, result = compare_parses(args.gold, args.a, args.b, args.no_punct, args.samples, args.seed)
        print(f"UAS a {100 * uas_a:.2f}, b {100 * uas_b:.2f}; a - b: {result} "
              f"({args.samples} resamples of the sentences)")
    elif args.command == "questions":
        column = "fact_correct" if args.facts else "answer_correct"
        compared = compare_questions(args.a, args.b, column, args.samples, args.seed, tuple(args.models))
        for name, (acc_a, acc_b, result) in compared.items():
            print(f"{name}: a {acc_a:.1f}, b {acc_b:.1f}; a - b: {result}")
    elif args.command == "formulas":
        for name, (score_a, score_b, result) in compare_formulas(args.csv, args.a, args.b, args.samples, args.seed).items():
            print(f"{name}: {args.a} {score_a:.1f}, {args.b} {score_b:.1f}; a - b: {result}")
    else:
        print(f"mean a {np.mean(args.a):.4g} (sd {np.std(args.a, ddof=1):.3g}, n {len(args.a)}), "
              f"mean b {np.mean(args.b):.4g} (sd {np.std(args.b, ddof=1):.3g}, n {len(args.b)}); a - b: {welch(args.a, args.b)}")


if __name__ == "__main__":
    main()
