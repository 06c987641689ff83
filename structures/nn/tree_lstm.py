"""Child-sum Tree-LSTM over given dependency trees (Tai et al. 2015, §3.1; Liu, Qiu & Huang 2016,
eqs. 17-21), batched bottom-up by depth.

Trees are heads ``[B, N]`` as :meth:`~structures.NonProjectiveDependencyCRF.decode` returns them:
``heads[b, m-1]`` is the head of word ``m`` (0 = the root symbol), words ``1..n``. Every word's
state summarizes its subtree:

    h̃_j = Σ_{k ∈ C(j)} h_k
    i_j = σ(W_i x_j + U_i h̃_j + b_i),  o_j = σ(W_o x_j + U_o h̃_j + b_o),  u_j = tanh(W_u x_j + U_u h̃_j + b_u)
    f_jk = σ(W_f x_j + U_f h_k + b_f)                        (one forget gate per child)
    c_j = i_j ⊙ u_j + Σ_{k ∈ C(j)} f_jk ⊙ c_k,   h_j = o_j ⊙ tanh(c_j)

All the words of one depth are computed at once across the batch, deepest first (one step per
level of the deepest tree); each level hands its states and gated cells to its heads by an
index-add, so a word's children are complete when its level comes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from ..spanning.decode.arborescence import is_tree
from .attention import _shape, check_lengths, position_mask


class TreeLevels(NamedTuple):
    """A batch of trees as a bottom-up schedule over the flattened words (``b * N + m - 1``).

    ``levels``: flat indices of the words of each depth, deepest first; ``parent [B*N]``: the flat
    index of each word's head (-1 for the root's children and for padding); ``roots [B, N]`` bool:
    the root's children (the top of each tree).
    """

    levels: list[Tensor]
    parent: Tensor
    roots: Tensor

    def by_word(self, rows: list[Tensor], none: Tensor) -> Tensor:
        """``[B, N, *]`` from per-level rows (``rows[i]`` for the words of ``levels[i]``), 0 at padding;
        ``none [0, *]``: no rows, for the shape and type when there are none (an empty batch)."""
        B, N = self.roots.shape
        flat = torch.cat([none, *rows])
        words = torch.cat([self.parent.new_zeros(0), *self.levels])
        out = flat.new_zeros(B * N, *flat.shape[1:]).index_copy(0, words, flat)
        return out.view(B, N, *flat.shape[1:])


def tree_levels(heads: Tensor, lengths: Tensor | None = None, name: str = "heads") -> TreeLevels:
    """The bottom-up schedule of dependency trees ``heads [B, N]`` (0 = root; entries past each
    length ignored). ``ValueError`` naming ``name`` unless every example is a tree."""
    if not isinstance(heads, Tensor) or heads.dim() != 2 or heads.dtype.is_floating_point or heads.dtype == torch.bool:
        raise ValueError(f"{name}: expected integer heads of shape [B, N], got {_shape(heads)}")
    B, N = heads.shape
    real = position_mask(lengths, B, N, heads.device)
    heads = heads.long() * real
    if B and not bool(is_tree(heads, lengths).all()):
        raise ValueError(f"{name}: expected trees (every word reaches the root 0 by its heads, heads in 0..length)")
    # depth of every word: the number of its ancestors that are words (the root's children: 1)
    up = torch.cat([heads.new_zeros(B, 1), heads], 1)  # [B, N+1], node 0 the root
    node = torch.arange(1, N + 1, device=heads.device).expand(B, N) * real
    depth = torch.zeros(B, N, dtype=torch.long, device=heads.device)
    while bool((node > 0).any()):
        depth += node > 0
        node = up.gather(1, node)
    offset = torch.arange(B, device=heads.device).unsqueeze(1) * N
    parent = torch.where(heads > 0, heads - 1 + offset, -1).flatten()
    flat_depth = depth.flatten()
    deepest = int(flat_depth.max()) if flat_depth.numel() else 0
    levels = [(flat_depth == d).nonzero().squeeze(1) for d in range(deepest, 0, -1)]
    return TreeLevels(levels, parent, (heads == 0) & real)


def tree_roots(values: Tensor, trees: TreeLevels) -> Tensor:
    """``[B, D]``: the sum of ``values [B, N, D]`` over the root's children (with a single root,
    the state of the whole tree)."""
    return (values * trees.roots.unsqueeze(-1).to(values.dtype)).sum(1)


class TreeStates(NamedTuple):
    """``hidden [B, N, H]`` and ``cell [B, N, H]``: every word's subtree (0 at padded words);
    ``root [B, H]``: the hidden state of the root's child (summed if several)."""

    hidden: Tensor
    cell: Tensor
    root: Tensor


class TreeLSTM(nn.Module):
    """Child-sum Tree-LSTM: ``TreeLSTM(input_dim, hidden_dim)``.

    ``forward(inputs [B, N, D], heads [B, N], lengths [B] in 1..N) -> TreeStates(hidden [B, N, H],
    cell [B, N, H], root [B, H])``; ``mask [B, N]`` (keyword, bool, True at the real words, a
    prefix of each row) may replace ``lengths``. ``heads`` are dependency trees (0 = root, words 1..N);
    several children of the root are allowed. An encoder, not an attention layer: it returns the
    subtree states that :class:`~structures.nn.SubtreeAttention` attends over.
    """

    def __init__(self, input_dim: int, hidden_dim: int):
        super().__init__()
        self.input_dim, self.hidden_dim = input_dim, hidden_dim
        self.input = nn.Linear(input_dim, 4 * hidden_dim)  # W_i, W_o, W_u, W_f and the biases
        self.children_gates = nn.Linear(hidden_dim, 3 * hidden_dim, bias=False)  # U_i, U_o, U_u
        self.child_forget = nn.Linear(hidden_dim, hidden_dim, bias=False)  # U_f

    def forward(self, inputs: Tensor, heads: Tensor, lengths: Tensor | None = None, *,
                mask: Tensor | None = None) -> TreeStates:
        if not isinstance(inputs, Tensor) or inputs.dim() != 3 or inputs.shape[-1] != self.input_dim or inputs.shape[1] < 1:
            raise ValueError(f"inputs: expected shape [B, N, D] = [B, N >= 1, {self.input_dim}], got {_shape(inputs)}")
        B, N = inputs.shape[:2]
        lengths = check_lengths(lengths, B, 1, N, inputs.device, mask)
        if not isinstance(heads, Tensor) or heads.shape != (B, N):
            raise ValueError(f"heads: expected shape [B, N] = [{B}, {N}], got {_shape(heads)}")
        trees = tree_levels(heads, lengths)
        H = self.hidden_dim
        x = self.input(inputs).flatten(0, 1)  # [B*N, 4H]
        child_h = x.new_zeros(B * N, H)  # Σ_k h_k
        child_c = x.new_zeros(B * N, H)  # Σ_k f_jk ⊙ c_k
        hs, cs = [], []
        for idx in trees.levels:
            i, o, u = (x[idx, : 3 * H] + self.children_gates(child_h[idx])).chunk(3, -1)
            c = torch.sigmoid(i) * torch.tanh(u) + child_c[idx]
            h = torch.sigmoid(o) * torch.tanh(c)
            up = trees.parent[idx]
            has = up >= 0
            if bool(has.any()):
                to = up[has]
                forget = torch.sigmoid(x[to, 3 * H :] + self.child_forget(h[has]))
                child_h = child_h.index_add(0, to, h[has])
                child_c = child_c.index_add(0, to, forget * c[has])
            hs.append(h)
            cs.append(c)
        hidden = trees.by_word(hs, x.new_zeros(0, H))
        return TreeStates(hidden, trees.by_word(cs, x.new_zeros(0, H)), tree_roots(hidden, trees))
