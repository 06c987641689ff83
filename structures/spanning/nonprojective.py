"""The non-projective dependency CRF: the matrix-tree theorem, exactly (Koo et al. 2007; the
structured attention of Bisk & Tran 2018 and Liu & Lapata 2018).

Not a dynamic program: the class registers one algorithm per semiring (Log, Real, Max, KMax,
Sampled, Count; :func:`structures.base.algorithm`). Its numerics live beside it: log Z and
marginals exactly at any score scale in :mod:`structures.spanning._tree_partition` (over
:mod:`structures.spanning._certified` and :mod:`structures.spanning._matrix_tree`), their derivatives in
:mod:`structures.spanning._tree_autograd`, the number of trees in :mod:`structures.spanning._tree_count`; the best,
k best and sampled trees in :mod:`structures.spanning.decode`.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

import semiring as sr
from semiring.semirings import CountSemiring, KMax, LogSemiring, MaxSemiring, RealSemiring, SampledSemiring

from ..base import Distribution, _eager, _inner, algorithm
from ..trees import DependencyTrees, arcs
from ..validation import prefix_mask
from ._tree_autograd import LogPartition, Marginals
from ._tree_count import count_trees
from ._tree_partition import log_partition_and_marginals, masks
from .decode.arborescence import is_tree, kbest_arborescences, max_arborescence
from .decode.sampling import sample_arborescences

__all__ = ["NonProjectiveDependencyCRF"]


class NonProjectiveDependencyCRF(DependencyTrees, Distribution):
    """A distribution over non-projective dependency trees (spanning arborescences) of ``n`` words.

    ``log_potentials[b, h, m]`` (shape ``[B, N+1, N+1]``) scores the arc from head ``h`` to
    modifier ``m``; index 0 is the root symbol, words are ``1..n``. Column 0 (arcs into the root)
    and the diagonal are never used. ``lengths[b]`` in ``1..N`` is the number of words (default N);
    or ``mask [B, N+1]`` (SuPar's): column 0 the root (ignored), then True at each sentence's words.
    ``single_root=True`` lets the root take exactly one child (Koo et al. 2007; Bisk & Tran 2018),
    otherwise any number (Liu & Lapata 2018: root scores on a tree of sentences). ``-inf`` forbids
    an arc. Marginals and one-hot trees have the shape of ``log_potentials``; ``decode()`` gives
    heads ``[B, N]`` (``heads[b, m-1]`` is the head of word m, 0 = root; 0 past each length).

    Algorithms (not a dynamic program: one registered per semiring, see :attr:`algorithms`):
    log-partition and marginals by the matrix-tree theorem, exactly at any score scale
    (:mod:`structures.spanning._tree_partition`); the best and k best trees by Chu-Liu-Edmonds / Camerini
    et al. (:mod:`structures.spanning.decode.arborescence`); exact samples by Wilson's algorithm or
    sequential conditioning (:mod:`structures.spanning.decode.sampling`); the number of trees by the
    matrix-tree theorem on the allowed arcs (exact integers below 2**53).
    """

    shape = "B, N, N"
    torch_struct_multiroot = False  # torch-struct's NonProjectiveDependencyCRF: one root child by default

    def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None, single_root: bool = False, *,
                 mask: Tensor | None = None):
        self.single_root = bool(single_root)
        self._cache: dict = {}
        if isinstance(log_potentials, Tensor) and log_potentials.dim() == 3 and log_potentials.shape[-1] < 2:
            raise ValueError(f"log_potentials: expected shape [B, N+1, N+1] with N >= 1 words, got {list(log_potentials.shape)}")
        super().__init__(log_potentials, lengths, mask=mask)

    @property
    def max_length(self) -> int:
        """N, the number of words of a full example."""
        return self._theta.shape[-1] - 1

    def _len(self, lengths: Tensor | None, batch: int) -> Tensor:
        """``lengths`` of ``batch`` rows, every example full length where None."""
        if lengths is None:
            return torch.full((batch,), self.max_length, dtype=torch.long, device=self._theta.device)
        return lengths

    # ------------------------------------------------------------------ the algorithms

    def _exact_result(self, theta: Tensor, lengths: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """``(log Z, μ, certified)`` in float64, memoised for this distribution's own potentials;
        ``certified [B]``: the fast path answered (it decides how the marginals are differentiated)."""
        key = self._memo_key(theta, lengths)
        if key in self._cache:
            return self._cache[key]
        info: dict = {}
        logZ, mu = log_partition_and_marginals(theta, lengths, self.single_root, info=info)
        res = logZ, mu, info["certified"]
        if key is not None:
            self._cache = {key: res}
        return res

    def _memo_key(self, theta: Tensor, lengths: Tensor | None) -> tuple | None:
        """The key of :meth:`_exact_result`'s memo: None unless ``theta`` is this distribution's own
        and has a version counter (an inference tensor has none)."""
        if not theta.is_inference() and theta.data_ptr() == self._theta.data_ptr() and theta.shape == self._theta.shape and theta.stride() == self._theta.stride():
            return theta._version, None if lengths is None else tuple(lengths.tolist())
        return None

    @algorithm(LogSemiring)
    def _log_partition(self, semiring: sr.Semiring, theta: Tensor, lengths: Tensor | None) -> Tensor:
        """``[B]``: log Z by the matrix-tree theorem; its gradient is the exact marginals (twice
        differentiable), computed with log Z where θ requires grad (the backward will want them: one
        factorization for both), else only if the backward asks (log Z alone needs no inverse)."""
        if theta.requires_grad and torch.is_grad_enabled():
            res = self._exact_result(theta, lengths)
            return LogPartition.apply(theta, res[0], lambda: (*res, self._len(lengths, theta.shape[0])), self.single_root)
        key = self._memo_key(theta, lengths) if self._cache else None
        if key in self._cache:
            log_z = self._cache[key][0]
        else:
            log_z = log_partition_and_marginals(theta, lengths, self.single_root, marginals=False, dtype=theta.dtype)[0]
        if not theta.requires_grad:  # no backward to prepare
            return log_z.to(theta.dtype)
        return LogPartition.apply(theta, log_z, lambda: (*self._exact_result(theta, lengths), self._len(lengths, theta.shape[0])),
                                  self.single_root)

    @algorithm(RealSemiring)
    def _partition(self, semiring: sr.Semiring, theta: Tensor, lengths: Tensor | None) -> Tensor:
        """``[B]``: Z = exp(log Z)."""
        return self._log_partition(sr.Log, theta, lengths).exp()

    @algorithm(MaxSemiring)
    def _best(self, semiring: sr.Semiring, theta: Tensor, lengths: Tensor | None) -> Tensor:
        """``[B]``: ⟨θ, best tree⟩ (Chu-Liu-Edmonds; gradient: the tree)."""
        lengths = self._len(lengths, theta.shape[0])
        heads = max_arborescence(theta.detach(), lengths, self.single_root)
        score = self._score_trees(theta, heads, lengths)
        if self.single_root:  # where no single-root tree has a finite score, the best found has several root children
            words = prefix_mask(lengths, heads.shape[-1])
            score = score.masked_fill(((heads == 0) & words).sum(-1) != 1, -math.inf)
        return score

    @algorithm(KMax)
    def _k_best(self, semiring: KMax, theta: Tensor, lengths: Tensor | None) -> Tensor:
        """``[k, B]``: ⟨θ, j-th best tree⟩ (Camerini et al.; -inf past the number of trees)."""
        lengths = self._len(lengths, theta.shape[0])
        heads, _ = kbest_arborescences(theta.detach(), semiring.k, lengths, self.single_root)
        vals = self._score_trees(theta, heads.clamp_min(0), lengths)
        return vals.masked_fill((heads < 0).any(-1), -math.inf)

    @algorithm(SampledSemiring)
    def _sampled(self, semiring: SampledSemiring, theta: Tensor, lengths: Tensor | None) -> Tensor:
        """``[rows]``: ⟨θ, an exact sample⟩ per row (gradient: the sample)."""
        lengths = self._len(lengths, theta.shape[0])
        U, copies = theta.shape[0], 1
        base = self._theta.detach()
        if U > self._batch and U % self._batch == 0 and theta.shape[1:] == base.shape[1:]:
            k = U // self._batch  # sample() asks for k copies of the batch: solve it once
            if torch.equal(theta.detach().view(k, *base.shape), base.expand(k, *base.shape)) and torch.equal(
                    lengths.view(k, -1), self.lengths.expand(k, -1)):
                U, copies = self._batch, k
        heads = sample_arborescences(theta[:U], lengths[:U], self.single_root, copies, generator=semiring.generator)
        return self._score_trees(theta, heads, lengths)

    @algorithm(CountSemiring)
    def _count(self, semiring: sr.Semiring, theta: Tensor, lengths: Tensor | None) -> Tensor:
        """``[B]`` float64: the number of trees of finite score."""
        return count_trees(theta, self._len(lengths, theta.shape[0]), self.single_root)

    def _score_trees(self, theta: Tensor, heads: Tensor, lengths: Tensor) -> Tensor:
        """``[..., B]``: ⟨θ, tree⟩ for heads ``[..., B, N]`` (differentiable: the gradient is the tree)."""
        parts = self._parts(heads, lengths, theta.dtype)
        return _inner(theta, parts, 2)

    def _parts(self, heads: Tensor, lengths: Tensor, dtype) -> Tensor:
        return arcs(heads, lengths, self._theta.shape[-1], dtype)

    @_eager
    def _marginals_exact(self) -> Tensor:
        """The exact marginals, differentiable (through :class:`Marginals`) when θ requires grad;
        no autograd round trip through log Z otherwise."""
        theta = self._theta
        if not theta.requires_grad and not (self._cache and self._memo_key(theta, self._lengths) in self._cache):
            # no backward to prepare: the marginals in θ's dtype at once, not kept (no float64 copy)
            return log_partition_and_marginals(theta, self._lengths, self.single_root, dtype=theta.dtype)[1]
        _, mu, certified = self._exact_result(theta, self._lengths)
        if theta.requires_grad:
            return Marginals.apply(theta, mu, self.lengths, self.single_root, certified)
        return mu.to(theta.dtype) if mu.dtype != theta.dtype else mu.clone()

    def _expectation(self, theta: Tensor, v: Tensor, base: sr.Semiring) -> Tensor:
        """E_p⟨v, z⟩ = ⟨μ(θ), v⟩ (its gradient w.r.t. θ is the Hessian-vector product H v)."""
        lengths = self._len(self._lengths, theta.shape[0])
        if theta.requires_grad:
            mu = self._derivative(self.run(sr.Log, theta), theta, create_graph=True)
        else:
            mu = self._exact_result(theta, self._lengths)[1].to(theta.dtype)
        valid, _ = masks(theta.shape[-1] - 1, lengths, theta.device)
        return (mu * torch.where(valid, v.to(mu.dtype), torch.zeros_like(mu))).flatten(1).sum(1)

    # ------------------------------------------------------------------ trees

    has_enumerate_support = True

    def enumerate_structures(self, limit: int | None = None) -> tuple[Tensor, Tensor]:
        """Every tree of finite score (brute force over head assignments; ``(n+1)^n <= limit``, default
        2,000,000): ``(values [S, B, N+1, N+1], valid [S, B])``, trees of each example in
        lexicographic order of their heads, slots past its count 0 and invalid."""
        limit = 2_000_000 if limit is None else limit
        N = self.max_length
        lengths = self.lengths
        theta = self._theta.detach()
        per = []
        for b in range(self._batch):
            n = int(lengths[b])
            if (n + 1) ** n > limit:
                raise ValueError(f"enumerate_support: {(n + 1) ** n} head assignments for n = {n} exceed limit={limit}")
            cand = torch.tensor(list(itertools.product(range(n + 1), repeat=n)), dtype=torch.long).reshape(-1, n)
            cand = torch.cat([cand, torch.zeros(cand.shape[0], N - n, dtype=torch.long)], 1).to(theta.device)
            L = torch.full((cand.shape[0],), n, dtype=torch.long, device=theta.device)
            ok = is_tree(cand, L, self.single_root)
            cand = cand[ok]
            sc = _inner(theta[b].expand(cand.shape[0], -1, -1), self._parts(cand, L[: cand.shape[0]], theta.dtype), 2) if cand.shape[0] else torch.zeros(0)
            per.append(cand[torch.isfinite(sc)] if cand.shape[0] else cand)
        S = max(1, max((p.shape[0] for p in per), default=0))
        heads = torch.zeros(S, self._batch, N, dtype=torch.long, device=theta.device)
        valid = torch.zeros(S, self._batch, dtype=torch.bool, device=theta.device)
        for b, p in enumerate(per):
            heads[: p.shape[0], b] = p
            valid[: p.shape[0], b] = True
        values = self._parts(heads, lengths, theta.dtype) * valid[..., None, None]
        return self._out(values), valid
