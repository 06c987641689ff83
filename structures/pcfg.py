"""Binary probabilistic context-free grammars: the dense PCFG (torch-struct's ``SentCFG``, SynJax's
``PCFG``) and its rank-R tensor decomposition, the TD-PCFG of Yang, Zhao and Tu (2021).

Both are distributions over the parse trees of a sentence given the grammar (Eisner 2016, §7.1: a
conditional distribution; ``log_partition`` is the sentence's log-likelihood under a normalized
grammar). A tree is binary: every nonterminal covers two or more words and has two children, every
word is covered by one preterminal, and the root is a nonterminal over the whole sentence, so a
sentence has at least 2 words.

**Parts.** The parts of a distribution must identify its structures (``log_prob``, ``sample``,
``argmax``, ``enumerate_support`` are parts), and neither the preterminal tags (``terms``: the
bracketing is lost) nor the rule counts do. A labelled chart does, as SynJax's event (chart, tags)
and torch-struct's ``from_parts`` spans: ``log_potentials [B, N, N, K]`` holds

* ``[b, i, i, p]``: preterminal ``p`` over word ``i`` (``p < T``): the ``terms``;
* ``[b, i, j, a]``, ``i < j``: nonterminal ``a`` over words ``i..j`` (``a < NT``): 0, the grammar
  has no score per span;
* (TD-PCFG) ``[b, j, i, r]``, ``i < j``: rank ``r`` at the node over ``i..j`` (``r < R``): 0;

with ``K`` the largest of ``NT``, ``T`` (and ``R``); other entries are never used. The constructors'
``chart [B, N, N, K]`` (optional) is added to these potentials: scores of labelled spans (or ranks),
e.g. -inf at ``[b, i, j, a]`` to forbid nonterminal ``a`` over words ``i..j`` (known brackets). The rules and the
root scores are *shared scores* (batch 1 or B: one grammar may serve the batch without copies): a
tree's use of them follows from its chart (``shared_counts``), so scores, entropy and KL count them.
Marginals are the posteriors of labelled spans and tags; the expected rule counts (torch-struct's
rule marginals) are ``expected_rules``.

Symbols are numbered as the rules' children: nonterminals ``0..NT-1``, preterminal ``p`` is
``NT + p``. ``decode()`` gives the best tree as ``(start, end, symbol)`` spans, words inclusive.
"""

from __future__ import annotations

import torch
from torch import Tensor

import semiring

from .distribution import LazyProgram, StructuredDistribution
from .validation import Lengths, check_shape

# The chart's label dimension is K = max(NT, T, R), not NT or T: the rules read it through the charts
# P (preterminals), C (nonterminals) and H (ranks), so that its size need not match the rules'.
_PCFG = semiring.program("""
    P[s, p]        = span[s, s, p]
    C[s, t, a]     = span[s, t, a]
    X[s, t, a]    += P[s, b] * P[t, c] * tt[a, b, c] * C[s, t, a]          if t == s+1
    X[s, t, a]    += P[s, b] * X[s+1, t, c] * tn[a, b, c] * C[s, t, a]
    X[s, t, a]    += X[s, t-1, b] * P[t, c] * nt[a, b, c] * C[s, t, a]
    S[s, t, b, c] += X[s, u, b] * X[u+1, t, c]                             for u in s+1..t-2
    Y[s, t, a]    += S[s, t, b, c] * nn[a, b, c]
    X[s, t, a]    += Y[s, t, a] * C[s, t, a]
    goal          += X[0, n-1, a] * root[a]
""")

# rule[a, b, c] = ⊕_r u[a, r] ⊗ v[b, r] ⊗ w[c, r]: each side of a split is first summed into rank space
# (L, R), so that a span costs O(width · R), not O(NT^3).
_TDPCFG = LazyProgram("""
    P[s, p]     = span[s, s, p]
    C[s, t, a]  = span[s, t, a]
    H[s, t, r]  = span[t, s, r]
    L[s, t, r] += X[s, t, b] * vn[b, r]
    L[s, s, r] += P[s, p] * vt[p, r]
    R[s, t, r] += X[s, t, c] * wn[c, r]
    R[s, s, r] += P[s, p] * wt[p, r]
    Z[s, t, r] += L[s, u, r] * R[u+1, t, r]                  for u in s..t-1
    X[s, t, a] += Z[s, t, r] * H[s, t, r] * u[a, r] * C[s, t, a]
    goal       += X[0, n-1, a] * root[a]
""")


_ONE_WORD = ("(a one-word sentence has no tree: the root is a nonterminal, which has two children, and "
             "roots score nonterminals only; drop such sentences or score them apart)")


def _check_sizes(name: str, x: Tensor, spec: str, sizes: tuple[int, ...], batch: int) -> None:
    """``ValueError`` naming ``x`` unless its shape is ``[B or 1, *sizes]`` (after ``check_shape``)."""
    if tuple(x.shape[1:]) != sizes or x.shape[0] not in (1, batch):
        expected = ", ".join(map(str, sizes))
        raise ValueError(f"{name}: expected shape [{spec}] = [{batch} or 1, {expected}], got {list(x.shape)}")


def _chart(terms: Tensor, K: int, chart: Tensor | None) -> Tensor:
    """The potentials ``[B, N, N, K]``: ``terms [B, N, T]`` on the diagonal, 0 elsewhere, plus ``chart``."""
    B, N, T = terms.shape
    theta = terms.new_zeros(B, N, N, K)
    theta.diagonal(0, 1, 2)[:, :T] = terms.transpose(1, 2)
    if chart is None:
        return theta
    check_shape("chart", chart, "B, N, N, K")
    if tuple(chart.shape) != (B, N, N, K):
        raise ValueError(f"chart: expected shape [B, N, N, K] = [{B}, {N}, {N}, {K}], got {list(chart.shape)}")
    return theta + chart


class Grammar(StructuredDistribution):
    """The base of :class:`PCFG` and :class:`TDPCFG` (not built directly): a distribution over the
    binary trees of sentences under a grammar with ``NT`` nonterminals and ``T`` preterminals, whose
    parts are the labelled chart ``[B, N, N, K]`` of the module docstring and whose rules are the
    subclass's shared scores. It gives both the trees' decoding into ``(start, end, symbol)`` spans
    and the refusal of one-word sentences (which have no binary tree)."""

    shape = "B, N, N, K"
    potentials = "span"

    def __init__(self, terms: Tensor, NT: int, K: int, lengths: Tensor | None, shared: dict[str, Tensor],
                 mask: Tensor | None = None, chart: Tensor | None = None):
        self.NT, self.T = NT, terms.shape[-1]
        if terms.shape[1] < 2:
            raise ValueError(f"terms: expected N >= 2 words, got shape {list(terms.shape)} {_ONE_WORD}")
        super().__init__(_chart(terms, K, chart), lengths, shared, mask=mask)

    def _check_lengths(self, lengths: Lengths) -> Tensor | dict[str, Tensor] | None:
        """The program's check of ``lengths`` (``2..N``), its message saying why where a length is 1."""
        try:
            return super()._check_lengths(lengths)
        except ValueError as error:
            integer = isinstance(lengths, Tensor) and not (lengths.dtype.is_floating_point or lengths.dtype == torch.bool)
            if integer and bool((lengths == 1).any()):
                raise ValueError(f"{error} {_ONE_WORD}") from None
            raise

    def _tree(self, parts: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Of one-hot charts ``[..., B, N, N, K]``: the nonterminal nodes ``[..., N, N, NT]``
        (``i < j``), every node in the rules' child numbering ``F [..., N, N, NT+T]`` (preterminals
        on the diagonal), and the split mask ``[N, N, N]``: ``M[i, k, j] = i <= k < j``."""
        N = parts.shape[-2]
        upper = torch.ones(N, N, dtype=parts.dtype, device=parts.device).triu(1)
        nodes = parts[..., : self.NT] * upper[..., None]
        tags = torch.diag_embed(parts.diagonal(0, -3, -2)[..., : self.T, :]).movedim(-3, -1)
        i, k, j = torch.meshgrid(*[torch.arange(N, device=parts.device)] * 3, indexing="ij")
        return nodes, torch.cat([nodes, tags], -1), ((i <= k) & (k < j)).to(parts.dtype)

    @staticmethod
    def _right(F: Tensor) -> Tensor:
        """``F[..., k+1, j, :]`` at ``[..., k, j, :]`` (0 at k = N-1): the right sibling of a left child ending at k."""
        return torch.cat([F[..., 1:, :, :], torch.zeros_like(F[..., :1, :, :])], -3)

    def _root_counts(self, nodes: Tensor) -> Tensor:
        """``[..., B, NT]``: the label of each example's node over its whole sentence."""
        last = (self.lengths.to(nodes.device) - 1).reshape(-1, 1, 1)
        top = nodes[..., 0, :, :]  # [..., B, N, NT]
        return top.gather(-2, last.expand(*top.shape[:-2], 1, self.NT)).squeeze(-2)

    def decode(self) -> list[list[tuple[int, int, int]]]:
        """The best tree of each example as ``(start, end, symbol)`` spans (words inclusive, preorder)."""
        return self.spans(self.argmax)

    def spans(self, parts: Tensor) -> list[list[tuple[int, int, int]]]:
        """The ``(start, end, symbol)`` spans of trees given as one-hot charts ``[B, N, N, K]`` (preorder:
        by start, the longer first); a preterminal ``p`` is the symbol ``NT + p``."""
        nodes, F, _ = self._tree(parts)
        out: list[list[tuple[int, int, int]]] = [[] for _ in range(parts.shape[0])]
        for b, i, j, x in F.nonzero().tolist():
            out[b].append((i, j, x))
        return [sorted(s, key=lambda span: (span[0], -span[1])) for s in out]


class PCFG(Grammar):
    """A distribution over the binary parse trees of sentences of ``n`` words under a grammar with
    ``NT`` nonterminals and ``T`` preterminals (torch-struct ``SentCFG``'s conventions):

    * ``terms [B, N, T]``: ``terms[b, i, p]`` scores preterminal ``p`` over word ``i``;
    * ``rules [B or 1, NT, NT+T, NT+T]``: ``rules[b, a, x, y]`` scores ``a -> x y`` (children below
      ``NT`` are nonterminals, ``NT + p`` is preterminal ``p``);
    * ``roots [B or 1, NT]``: ``roots[b, a]`` scores ``a`` at the root;
    * ``lengths [B]`` in ``2..N``, or ``mask [B, N]`` (bool, True at each sentence's words: a prefix);
    * ``chart [B, N, N, max(NT, T)]`` (optional): scores added to the parts, e.g. -inf to forbid a
      labelled span (the module docstring).

    The parts are the labelled chart ``[B, N, N, max(NT, T)]`` of the module docstring, so
    ``marginals`` are span and tag posteriors; ``decode()`` gives ``(start, end, symbol)`` spans.
    The inside algorithm costs O(N^3 NT^2 + N^2 NT^3 + N^2 NT^2 T + N NT T^2): a split of two
    nonterminals is summed over split points, then over child pairs; a child that is a preterminal is
    summed with its rule once per word, not once per span.
    """

    program = _PCFG

    def __init__(self, terms: Tensor, rules: Tensor, roots: Tensor, lengths: Tensor | None = None, *,
                 mask: Tensor | None = None, chart: Tensor | None = None):
        check_shape("terms", terms, "B, N, T")
        B, _, T = terms.shape
        check_shape("rules", rules, "B, NT, NT+T, NT+T")
        check_shape("roots", roots, "B, NT")
        NT = rules.shape[1]
        _check_sizes("rules", rules, "B, NT, NT+T, NT+T", (NT, NT + T, NT + T), B)
        _check_sizes("roots", roots, "B, NT", (NT,), B)
        blocks = {"nn": (slice(None, NT), slice(None, NT)), "nt": (slice(None, NT), slice(NT, None)),
                  "tn": (slice(NT, None), slice(None, NT)), "tt": (slice(NT, None), slice(NT, None))}
        self._blocks = blocks
        shared = {name: rules[:, :, x, y] for name, (x, y) in blocks.items()}
        super().__init__(terms, NT, max(NT, T), lengths, {**shared, "root": roots}, mask, chart)

    def shared_counts(self, parts: Tensor) -> dict[str, Tensor]:
        """Rules used, as the four blocks of ``rules`` (``nn``, ``nt``, ``tn``, ``tt``: which children
        are preterminals) ``[..., B, NT, ·, ·]``, and the root ``[..., B, NT]``."""
        nodes, F, M = self._tree(parts)
        rules = torch.einsum("...ija,...ikx,...kjy,ikj->...axy", nodes, F, self._right(F), M)
        counts = {name: rules[..., x, y] for name, (x, y) in self._blocks.items()}
        return {**counts, "root": self._root_counts(nodes)}

    @property
    def expected_rules(self) -> Tensor:
        """``[B, NT, NT+T, NT+T]``: the expected number of uses of each rule (torch-struct's rule marginals)."""
        counts = self._expected_counts()
        out = counts["nn"].new_zeros(self._batch, self.NT, self.NT + self.T, self.NT + self.T)
        for name, (x, y) in self._blocks.items():
            out[:, :, x, y] = counts[name]
        return self._out(out)


class TDPCFG(Grammar):
    """The PCFG whose rules are a rank-``R`` tensor decomposition (Yang, Zhao and Tu 2021):
    ``exp rules[a, b, c] = Σ_r exp(U[a, r] + V[b, r] + W[c, r])`` (``rules()``), so that the inside
    algorithm costs O(N^3 R + N^2 (NT+T) R), never forming the ``NT (NT+T)^2`` rules.

    * ``terms [B, N, T]``, ``roots [B or 1, NT]``, ``lengths [B]`` in ``2..N``, ``chart`` (optional,
      ``[B, N, N, max(NT, T, R)]``, ranks included): as ``PCFG``;
    * ``U [B or 1, NT, R]`` (parents), ``V [B or 1, NT+T, R]`` (left children), ``W [B or 1, NT+T, R]``
      (right children), log-space, children numbered as ``PCFG``'s.

    A structure is a *derivation*: a tree in which every nonterminal node also picks a rank ``r``,
    scored ``U[a, r] + V[b, r] + W[c, r]``. Summing over the ranks gives the PCFG of ``rules()``, so
    ``log_partition``, and the marginals and samples of labelled spans and tags equal that PCFG's; the
    best, k best, count, entropy and support are over derivations. The parts are the module's chart
    ``[B, N, N, max(NT, T, R)]`` with the ranks below the diagonal.
    """

    program = _TDPCFG

    def __init__(self, terms: Tensor, U: Tensor, V: Tensor, W: Tensor, roots: Tensor, lengths: Tensor | None = None,
                 *, mask: Tensor | None = None, chart: Tensor | None = None):
        check_shape("terms", terms, "B, N, T")
        B, _, T = terms.shape
        specs = {"U": (U, "B, NT, R"), "V": (V, "B, NT+T, R"), "W": (W, "B, NT+T, R"), "roots": (roots, "B, NT")}
        for name, (x, spec) in specs.items():
            check_shape(name, x, spec)
        NT, R = U.shape[1:]
        for (name, (x, spec)), sizes in zip(specs.items(), [(NT, R), (NT + T, R), (NT + T, R), (NT,)]):
            _check_sizes(name, x, spec, sizes, B)
        self.R = R
        self._factors = (U, V, W)
        shared = {"u": U, "vn": V[:, :NT], "vt": V[:, NT:], "wn": W[:, :NT], "wt": W[:, NT:], "root": roots}
        super().__init__(terms, NT, max(NT, T, R), lengths, shared, mask, chart)

    def rules(self) -> Tensor:
        """``[B or 1, NT, NT+T, NT+T]``: the rule scores the factors define, ``logsumexp_r U + V + W``."""
        U, V, W = self._factors
        return torch.logsumexp(U[:, :, None, None] + V[:, None, :, None] + W[:, None, None], -1)

    def shared_counts(self, parts: Tensor) -> dict[str, Tensor]:
        """Factor entries used ``[..., B, ·, R]`` (``u``; ``vn``, ``vt``, ``wn``, ``wt``: the nonterminal
        and preterminal rows of V and W) and the root ``[..., B, NT]``."""
        nodes, F, M = self._tree(parts)
        N = parts.shape[-2]
        upper = torch.ones(N, N, dtype=parts.dtype, device=parts.device).triu(1)
        ranks = parts.transpose(-3, -2)[..., : self.R] * upper[..., None]  # [..., i, j, r]
        node = F.sum(-1)
        v = torch.einsum("...ijr,...ikx,...kj,ikj->...xr", ranks, F, self._right(node[..., None]).squeeze(-1), M)
        w = torch.einsum("...ijr,...ik,...kjy,ikj->...yr", ranks, node, self._right(F), M)
        NT = self.NT
        return {"u": torch.einsum("...ija,...ijr->...ar", nodes, ranks), "vn": v[..., :NT, :], "vt": v[..., NT:, :],
                "wn": w[..., :NT, :], "wt": w[..., NT:, :], "root": self._root_counts(nodes)}
