"""Word and tag vocabularies and their id tensors, for the induced-tree experiments."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import torch
from torch import Tensor

from .ud import Sentence

PAD, UNK, MASK = 0, 1, 2


def word_index(sentences: Sequence[Sentence], min_count: int = 2, field: str = "words") -> dict[str, int]:
    """Lower-cased words (``field="upos"``: tags) seen ``min_count`` times, after ``<pad>``,
    ``<unk>``, ``<mask>``."""
    counts = Counter(w.lower() for s in sentences for w in getattr(s, field))
    kept = sorted(w for w, c in counts.items() if c >= min_count)
    return {"<pad>": PAD, "<unk>": UNK, "<mask>": MASK, **{w: i + 3 for i, w in enumerate(kept)}}


def encode(sentences: Sequence[Sentence], index: dict[str, int], bucket: int = 8, field: str = "words") -> tuple[Tensor, Tensor]:
    """Word (``field="upos"``: tag) ids ``[B, N]`` (``N`` the longest length rounded up to
    ``bucket``) and lengths ``[B]``."""
    N = -(-max(s.n for s in sentences) // bucket) * bucket
    words = torch.full((len(sentences), N), PAD, dtype=torch.long)
    for b, s in enumerate(sentences):
        words[b, :s.n] = torch.tensor([index.get(w.lower(), UNK) for w in getattr(s, field)])
    return words, torch.tensor([s.n for s in sentences])
