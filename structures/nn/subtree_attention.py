"""Attention over subtrees (Liu, Qiu & Huang 2016, §3.2, eqs. 25, 27-29: SAT-LSTM over dependency trees).

Two sentences, each encoded by a :class:`~structures.nn.TreeLSTM` over its dependency tree: the
memory ``h^x_i`` (one state per subtree of tree ``T^x``, e.g. the premise) and the queries
``h^y_j`` (the subtrees of ``T^y``, e.g. the hypothesis). Bottom-up over ``T^y``, every node
``j`` rereads ``T^x`` with what its children already gathered, ``R_j = {r_k : k ∈ C(j)}``:

    g(R_j) = W̃_r Σ_{k ∈ C(j)} r_k                               (eq. 27)
    e_ji   = w_eᵀ tanh(W_y h^y_j + W_x h^x_i + g(R_j))           (eq. 28)
    α_ji   = softmax_i(e_ji)                                     (eq. 29, over the subtrees of T^x)
    r_j    = Σ_i α_ji h^x_i + tanh(g(R_j))                      (eq. 25)

The paper's pair representation is then ``h* = tanh(W_x r_root + W_y h^y_root)`` (eq. 30), with
``root`` the top of ``T^y`` (:func:`~structures.nn.tree_lstm.tree_roots` of the context and of
the query states).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .attention import _shape, check_lengths, position_mask, zero_padding
from .output import AttentionOutput
from .tree_lstm import tree_levels


class SubtreeAttention(nn.Module):
    """``SubtreeAttention(memory_dim, query_dim)``.

    ``forward(memory [B, N, D], query [B, M, Q], heads [B, M], lengths [B] in 1..N,
    query_lengths [B] in 1..M)`` (or, keyword only, ``mask [B, N]`` and ``query_mask [B, M]``
    instead of the lengths: bool, True at the real words, a prefix of each row): ``memory`` the
    subtree states of ``T^x`` (``lengths``: its
    words), ``query`` those of ``T^y`` whose dependency tree is ``heads`` (0 = root, words 1..M;
    ``query_lengths``: its words). Returns ``AttentionOutput(context, attention, None)``:
    ``context`` = ``r [B, M, D]`` per node of ``T^y``, ``attention`` = ``α [B, M, N]`` (rows sum
    to 1; 0 at padded memory words and in the rows of padded query words, whose ``r`` is 0).
    """

    def __init__(self, memory_dim: int, query_dim: int):
        super().__init__()
        self.memory_dim, self.query_dim = memory_dim, query_dim
        self.memory_proj = nn.Linear(memory_dim, memory_dim, bias=False)  # W_x
        self.query_proj = nn.Linear(query_dim, memory_dim, bias=False)  # W_y
        self.children_proj = nn.Linear(memory_dim, memory_dim, bias=False)  # W̃_r
        self.score = nn.Linear(memory_dim, 1, bias=False)  # w_e

    def forward(self, memory: Tensor, query: Tensor, heads: Tensor, lengths: Tensor | None = None,
                query_lengths: Tensor | None = None, *, mask: Tensor | None = None,
                query_mask: Tensor | None = None) -> AttentionOutput:
        D = self.memory_dim
        if not isinstance(memory, Tensor) or memory.dim() != 3 or memory.shape[-1] != D or memory.shape[1] < 1:
            raise ValueError(f"memory: expected shape [B, N, D] = [B, N >= 1, {D}], got {_shape(memory)}")
        B, N = memory.shape[:2]
        if (not isinstance(query, Tensor) or query.dim() != 3 or query.shape[0] != B or query.shape[-1] != self.query_dim
                or query.shape[1] < 1):
            raise ValueError(f"query: expected shape [B, M, Q] = [{B}, M >= 1, {self.query_dim}], got {_shape(query)}")
        M = query.shape[1]
        if not isinstance(heads, Tensor) or heads.shape != (B, M):
            raise ValueError(f"heads: expected shape [B, M] = [{B}, {M}] (the query's trees), got {_shape(heads)}")
        lengths = check_lengths(lengths, B, 1, N, memory.device, mask)
        query_lengths = check_lengths(query_lengths, B, 1, M, memory.device, query_mask, name="query_")
        memory, query = zero_padding(memory, lengths), zero_padding(query, query_lengths)
        trees = tree_levels(heads, query_lengths)
        keys = self.memory_proj(memory)  # W_x h^x: [B, N, D]
        queries = self.query_proj(query).flatten(0, 1)  # W_y h^y: [B*M, D]
        real = position_mask(lengths, B, N, memory.device)
        example = torch.arange(B, device=memory.device).repeat_interleave(M)  # the example of each flat node
        gathered = memory.new_zeros(B * M, D)  # Σ_{k ∈ C(j)} r_k
        rs, alphas = [], []
        for idx in trees.levels:
            b = example[idx]
            g = self.children_proj(gathered[idx])  # [K, D]
            e = self.score(torch.tanh(queries[idx, None] + keys[b] + g[:, None])).squeeze(-1)  # [K, N]
            alpha = torch.softmax(e.masked_fill(~real[b], torch.finfo(e.dtype).min), -1) * real[b]
            r = (alpha.unsqueeze(1) @ memory[b]).squeeze(1) + torch.tanh(g)
            up = trees.parent[idx]
            has = up >= 0
            gathered = gathered.index_add(0, up[has], r[has])
            rs.append(r)
            alphas.append(alpha)
        return AttentionOutput(trees.by_word(rs, memory.new_zeros(0, D)), trees.by_word(alphas, memory.new_zeros(0, N)), None)
