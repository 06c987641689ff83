"""Universal Dependencies CoNLL-U files: reading sentences, writing them back with predicted trees.

Only the *syntactic words* (integer ids ``1..n``) form the tree. Multiword tokens (ids like
``3-4``) and empty nodes (ids like ``5.1``) are kept in each sentence's token list, out of the
tree, and written back unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import conllu
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
    """The :class:`Sentence` of a token list; raises ``ValueError`` if word ids are not ``1..n``."""
    words = [t for t in tokens if is_word(t)]
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
    """The sentences of a CoNLL-U file (the first ``max_sentences`` if given)."""
    sentences = []
    with open(path, encoding="utf-8") as f:
        for tokens in conllu.parse_incr(f):
            if max_sentences is not None and len(sentences) >= max_sentences:
                break
            sentences.append(sentence(tokens))
    return sentences


def with_tree(s: Sentence, heads: Sequence[int], deprels: Sequence[str] | None = None) -> TokenList:
    """A copy of the sentence's token list whose words carry ``heads`` (and ``deprels`` if given).

    Multiword tokens, empty nodes (with their enhanced ``deps``) and the metadata are copied as
    they are; the input is not modified.
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
        out.append(t)
    return TokenList(out, metadata=dict(s.tokens.metadata))


def write_conllu(path: str | Path, sentences: Sequence[Sentence], heads: Sequence[Sequence[int]] | None = None,
                 deprels: Sequence[Sequence[str]] | None = None) -> None:
    """Write sentences as CoNLL-U, with the given heads (and labels) per sentence, or as read."""
    with open(path, "w", encoding="utf-8") as f:
        for i, s in enumerate(sentences):
            tokens = s.tokens if heads is None else with_tree(s, heads[i], None if deprels is None else deprels[i])
            f.write(tokens.serialize())
