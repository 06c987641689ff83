"""The biaffine dependency parser's model (Dozat & Manning 2017) on tensors of ids: no vocabulary,
data format or conllu (``structures.experiments.biaffine`` builds it from a vocabulary and trains
it on CoNLL-U; ``python -m structures.experiments.parse`` is its command line)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .biaffine import MLP, Biaffine

PAD, UNK, ROOT = 0, 1, 2  # the special ids of words and characters: padding, unknown, the root symbol


class CharCNN(nn.Module):
    """A word's characters -> one vector: embeddings, a width-3 convolution, max over positions."""

    def __init__(self, n_chars: int, dim: int = 32, out: int = 100):
        super().__init__()
        self.embed = nn.Embedding(n_chars, dim, padding_idx=PAD)
        self.conv = nn.Conv1d(dim, out, 3, padding=1)

    def forward(self, chars: Tensor) -> Tensor:
        """``chars [B, T, C]`` -> ``[B, T, out]``."""
        B, T, C = chars.shape
        x = self.conv(self.embed(chars.view(B * T, C)).transpose(1, 2))
        x = x.masked_fill((chars.view(B * T, 1, C) == PAD), float("-inf")).amax(-1)
        return torch.nan_to_num(x, neginf=0.0).view(B, T, -1)


class BiaffineParser(nn.Module):
    """Arc scores ``[B, N+1, N+1]`` (``[b, h, m]``) and label scores of a batch of sentences given as
    word ids ``[B, N+1]`` and character ids ``[B, N+1, C]`` (position 0 the root, ids :data:`PAD`,
    :data:`UNK`, :data:`ROOT` reserved) with ``lengths [B]`` (words, the root not counted)."""

    def __init__(self, n_words: int, n_chars: int, n_labels: int, word_dim: int = 100, char_dim: int = 100,
                 hidden: int = 200, layers: int = 2, arc_dim: int = 200, label_dim: int = 100, dropout: float = 0.33):
        super().__init__()
        self.config = {"word_dim": word_dim, "char_dim": char_dim, "hidden": hidden, "layers": layers,
                       "arc_dim": arc_dim, "label_dim": label_dim, "dropout": dropout}
        self.word = nn.Embedding(n_words, word_dim, padding_idx=PAD)
        self.char = CharCNN(n_chars, out=char_dim)
        self.lstm = nn.LSTM(word_dim + char_dim, hidden, layers, batch_first=True, bidirectional=True, dropout=dropout)
        self.dropout = nn.Dropout(dropout)
        self.arc_head, self.arc_dep = MLP(2 * hidden, arc_dim, dropout), MLP(2 * hidden, arc_dim, dropout)
        self.label_head, self.label_dep = MLP(2 * hidden, label_dim, dropout), MLP(2 * hidden, label_dim, dropout)
        self.biaffine = Biaffine(arc_dim)
        self.label = nn.Bilinear(label_dim, label_dim, n_labels)
        self.word_dropout = dropout

    def encode(self, words: Tensor, chars: Tensor, lengths: Tensor) -> Tensor:
        """BiLSTM states ``[B, N+1, 2*hidden]`` (position 0 the root)."""
        if self.training:  # word dropout: the embedding learns an <unk> that stands for rare words
            words = words.masked_fill((torch.rand(words.shape) < self.word_dropout) & (words > ROOT), UNK)
        x = self.dropout(torch.cat([self.word(words), self.char(chars)], -1))
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths + 1, batch_first=True, enforce_sorted=False)
        h, _ = self.lstm(packed)
        h, _ = nn.utils.rnn.pad_packed_sequence(h, batch_first=True, total_length=x.shape[1])
        return self.dropout(h)

    def arc_scores(self, h: Tensor) -> Tensor:
        """``scores[b, h, m]`` ``[B, N+1, N+1]`` of the states ``h`` (:class:`Biaffine`)."""
        return self.biaffine(self.arc_head(h), self.arc_dep(h))

    def label_scores(self, h: Tensor, heads: Tensor) -> Tensor:
        """Label scores ``[B, N, L]`` of every word ``1..N`` given its head ``heads [B, N]``."""
        head, dep = self.label_head(h), self.label_dep(h)
        head_of = head.gather(1, heads.unsqueeze(-1).expand(-1, -1, head.shape[-1]))
        return self.label(dep[:, 1:].contiguous(), head_of.contiguous())
