"""Universal Dependencies CoNLL-U files: reading sentences, writing them back with predicted trees;
reading raw tokenized text as sentences without trees.

Only the *syntactic words* (integer ids ``1..n``) form the tree. Multiword tokens (ids like
``3-4``) and empty nodes (ids like ``5.1``) are kept in each sentence's token list, out of the
tree, and written back unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, TextIO

import conllu
import conllu.exceptions
from conllu.models import Token, TokenList

TREEBANKS = {
    "ewt": ("UD_English-EWT/en_ewt-ud-dev.conllu", "UD_English-EWT/en_ewt-ud-test.conllu"),
    "lassysmall": ("UD_Dutch-LassySmall/nl_lassysmall-ud-dev.conllu", "UD_Dutch-LassySmall/nl_lassysmall-ud-test.conllu"),
}
"""(train file, evaluation file) of each treebank, relative to ``<data-dir>/ud``: only dev and test
files are available, so the dev file is the training file."""

PUD = {"en": "UD_English-PUD/en_pud-ud-test.conllu", "de": "UD_German-PUD/de_pud-ud-test.conllu"}


def is_word(token: Token) -> bool:
    """True for a syntactic word (integer id); False for a multiword token or an empty node."""
    return isinstance(token["id"], int)


@dataclass(frozen=True)
class Sentence:
    """One sentence: its full token list as read, and the tree over its ``n`` syntactic words.

    ``heads[i]`` is the head of word ``i+1`` (0 = the root); ``words``, ``upos``, ``deprels`` are
    per word, in order.
    """

    tokens: TokenList
    words: tuple[str, ...]
    upos: tuple[str, ...]
    heads: tuple[int, ...]
    deprels: tuple[str, ...]

    @property
    def n(self) -> int:
        return len(self.words)

    @property
    def sent_id(self) -> str | None:
        return self.tokens.metadata.get("sent_id")


def sentence(tokens: TokenList) -> Sentence:
    """The :class:`Sentence` of a token list; raises ``ValueError`` if word ids are not ``1..n`` or a
    word lacks a column of the tree."""
    words = [t for t in tokens if is_word(t)]
    for t in words:
        if missing := [c for c in ("form", "upos", "head", "deprel") if c not in t]:
            raise ValueError(f"tokens: word {t['id']} has no {', '.join(missing)} column (expected CoNLL-U's 10 columns)")
    if [t["id"] for t in words] != list(range(1, len(words) + 1)):
        raise ValueError(f"tokens: expected word ids 1..n in order, got {[t['id'] for t in words]}")
    return Sentence(
        tokens=tokens,
        words=tuple(t["form"] for t in words),
        upos=tuple(t["upos"] for t in words),
        heads=tuple(int(t["head"]) if t["head"] is not None else 0 for t in words),
        deprels=tuple(t["deprel"] for t in words),
    )


def read_conllu(path: str | Path, max_sentences: int | None = None) -> list[Sentence]:
    """The sentences of a CoNLL-U file (the first ``max_sentences`` if given); ``ValueError`` if it
    is not CoNLL-U."""
    sentences = []
    with open(path, encoding="utf-8") as f:
        try:
            for tokens in conllu.parse_incr(f):
                if max_sentences is not None and len(sentences) >= max_sentences:
                    break
                sentences.append(sentence(tokens))
        except conllu.exceptions.ParseException as e:
            raise ValueError(f"{path}: not CoNLL-U ({e})") from e
    return sentences


def read_tokenized(path: str | Path, max_sentences: int | None = None) -> list[Sentence]:
    """The sentences of raw tokenized text: one sentence per line, tokens separated by whitespace
    (blank lines skipped). Each token is a syntactic word with no annotation (``_``; head 0);
    ``sent_id`` is the line number and ``text`` the tokens joined by single spaces."""
    sentences = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if max_sentences is not None and len(sentences) >= max_sentences:
                break
            words = line.split()
            if not words:
                continue
            tokens = [Token(id=i, form=w, lemma="_", upos="_", xpos=None, feats=None, head=None, deprel="_",
                            deps=None, misc=None) for i, w in enumerate(words, 1)]
            sentences.append(sentence(TokenList(tokens, metadata={"sent_id": str(number), "text": " ".join(words)})))
    return sentences


def looks_like_conllu(path: str | Path) -> bool:
    """True if the first line that is neither blank nor a ``#`` comment has CoNLL-U's 10
    tab-separated fields (raw tokenized text is then read as CoNLL-U, so check ``--format``)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                return len(line.rstrip("\n").split("\t")) == 10
    return False


def read_sentences(path: str | Path, format: str = "auto", max_sentences: int | None = None) -> list[Sentence]:
    """Sentences of a file in ``format``: ``conllu``, ``text`` (:func:`read_tokenized`) or ``auto``
    (:func:`looks_like_conllu` decides)."""
    if format == "auto":
        format = "conllu" if looks_like_conllu(path) else "text"
    if format == "conllu":
        return read_conllu(path, max_sentences)
    if format == "text":
        return read_tokenized(path, max_sentences)
    raise ValueError(f"format: expected auto, conllu or text, got {format!r}")


def with_tree(s: Sentence, heads: Sequence[int], deprels: Sequence[str] | None = None) -> TokenList:
    """A copy of the sentence's token list whose words carry ``heads`` (and ``deprels`` if given).

    Where a word has enhanced ``deps``, they are recomputed as its one basic arc ``head:deprel``: the
    graph read would contradict the new heads. Multiword tokens, empty nodes and the metadata are
    copied as they are; the input is not modified.
    """
    if len(heads) != s.n or (deprels is not None and len(deprels) != s.n):
        raise ValueError(f"heads, deprels: expected {s.n} entries (one per word), got {len(heads)}"
                         + ("" if deprels is None else f" and {len(deprels)}"))
    out = []
    for t in s.tokens:
        t = Token(t)
        if is_word(t):
            t["head"] = int(heads[t["id"] - 1])
            if deprels is not None:
                t["deprel"] = deprels[t["id"] - 1]
            if t["deps"] is not None:
                t["deps"] = [(t["deprel"], t["head"])]
        out.append(t)
    return TokenList(out, metadata=dict(s.tokens.metadata))


def write_conllu(target: str | Path | TextIO, sentences: Sequence[Sentence], heads: Sequence[Sequence[int]] | None = None,
                 deprels: Sequence[Sequence[str]] | None = None) -> None:
    """Write sentences as CoNLL-U to a path or an open text stream, with the given heads (and
    labels) per sentence, or as read."""
    if isinstance(target, (str, Path)):
        with open(target, "w", encoding="utf-8") as f:
            write_conllu(f, sentences, heads, deprels)
        return
    for i, s in enumerate(sentences):
        tokens = s.tokens if heads is None else with_tree(s, heads[i], None if deprels is None else deprels[i])
        target.write(tokens.serialize())
