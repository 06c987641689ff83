"""Maximum spanning arborescences (non-projective dependency trees): argmax and exact k-best.

Convention (the same as :class:`structures.ProjectiveDependencyCRF`): ``scores[b, h, m]``, shape
``[B, N+1, N+1]``, scores the arc from head ``h`` to modifier ``m``; position 0 is the root
symbol, words are ``1..n`` with ``n = lengths[b]`` (``N`` when ``lengths`` is None). Column 0
(arcs into the root), the diagonal and every arc touching a position past ``n`` are ignored.
``-inf`` marks a forbidden arc. A tree is returned as heads ``[B, N]`` long: ``heads[b, m-1]`` is
the head of word ``m`` (0 = root), and 0 past each length.

The algorithm
-------------
1. The shortcut, for the whole batch at once: every word takes its best head (one max over
   the ``N+1`` candidate heads of every word of every example); pointer jumping (``ceil(log2(N+1))`` gathers) checks that every word
   then reaches the root, and with ``single_root`` that the root has one child. Such examples
   are done: the per-word maxima are an upper bound that this tree attains. For a trained parser
   this is most sentences.
2. The other examples go one by one through Tarjan's (1977) dense-graph form of Edmonds' (1967)
   algorithm, with the expansion of Camerini, Fratta & Maffioli (1979): grow a path along best
   incoming arcs; when it closes a cycle, contract the cycle into a new super-node whose row of
   incoming weights (indexed by the *original* source nodes, reduced by each member's chosen
   arc) is the elementwise max of its members' rows; when the path reaches the finished part,
   it is final. At most ``n - 1`` contractions of ``k`` super-nodes cost ``O(k n)`` each, and
   every super-node picks its best incoming arc once, so a tree costs ``O(n^2)`` time and
   memory, in ``O(n)`` numpy operations on whole rows. Undoing the contractions (outermost
   first: the member holding the entering arc's modifier takes that arc, the others keep their
   cycle arcs) is a Python loop of ``O(n)`` steps, ``O(n^2)`` for the deepest nestings.
   Where the optional C extension is built (``_tarjan.c``, at install time), the same algorithm
   with the same tie-breaking runs there instead, 3-6x faster at n = 128: the numpy version pays
   a few microseconds per operation on a row. (numba was measured too: as fast once warm, but its
   first call in every process loads its on-disk cache for ~0.5 s, and it is a 200 MB
   dependency; a C extension costs nothing at the first call and nothing to depend on.)

Everything runs on CPU in numpy, on one copy of the scores laid out by incoming arcs (float32
or float64 as given; float16 and bfloat16 become float32, exactly): the shortcut compares the
scores as given, Tarjan's algorithm and every score sum work in float64. Heads come back on the
scores' device. The input is never modified.

Exactness, single root and forbidden arcs
-----------------------------------------
Edmonds' algorithm is exact over any totally ordered abelian group, so arcs carry a
lexicographic weight ``(tier, score)``: an integer tier, compared first, and the float64 score.
Tiers are exact integers, never mixed with scores, so no big constant is added to a score:

* a forbidden (``-inf``) arc has tier ``-(N+1)`` (its score is taken as 0);
* with ``single_root=True`` an arc out of the root has one more ``-1``.

A tree's tier is ``-(N+1) * #forbidden - #root_children`` (with ``single_root``), so the maximum
has, in this order, the fewest forbidden arcs, the fewest root children, then the highest
score. When a valid tree exists this is exactly the best valid tree: the single-root constraint
is solved exactly. (This is the reweighting of Stanojevic & Cohen 2021 with its constant taken
infinitely large: their constant ``c`` on root arcs is correct only if it exceeds the gap between
the best tree and the best single-root tree, e.g. ``c > n * (max - min)`` over allowed arcs, and a
large ``c`` costs float precision; a tier has neither problem.) Scores are summed in float64;
trees whose scores differ only by float64 rounding are ties, and ties may be broken either way.
Examples without forbidden arcs and without the root constraint use the scores alone (every tier
is 0), which is faster.

If no valid tree exists (some word cannot be reached from the root through allowed arcs, or,
with ``single_root``, no allowed tree gives the root one child), :func:`max_arborescence` still
returns a spanning tree: the one with the fewest forbidden arcs, then the fewest root children,
then the best score of its allowed arcs. Its :func:`tree_score` is ``-inf`` if it uses a
forbidden arc; :func:`is_tree` (given ``scores`` and ``single_root``) is False for it.

k-best
------
:func:`kbest_arborescences` is exact: Lawler's (1972) partition scheme as used by Camerini,
Fratta & Maffioli (1980) -- pop the best subspace, emit its tree ``t``, split the rest of the
subspace into disjoint subspaces (arc ``e_i`` of ``t`` banned, ``e_1..e_{i-1}`` forced), solve
each with the exact constrained argmax above (a banned arc, and every other head of a forced
word, gets a tier below every other tier; a subspace whose best tree has such an arc, a
forbidden arc or, with ``single_root``, two root children, is empty), and keep them in a heap.
That is up to ``n`` constrained argmax problems per emitted tree: ``O(k n^3)`` per example,
against the ``O(k n^2)`` of Camerini et al. (1980) / Zmigrod, Vieira & Cotterell (2021), with
exactly the same trees in the same order (up to ties).
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import torch
from torch import Tensor

try:  # the compiled Tarjan (_tarjan.c, built at install time when a C compiler is there)
    from . import _tarjan_c
except ImportError:
    _tarjan_c = None

__all__ = ["is_tree", "kbest_arborescences", "max_arborescence", "tree_score"]

# tier of the arcs that do not exist (diagonal, into the root, padding, inside a super-node);
# an exact float64 integer far below any sum of real tiers
_EXCL = float(-(1 << 50))


# ----------------------------------------------------------------------------------------------
# input checks and weights (numpy, CPU). Internally every array is laid out by *incoming* arcs:
# a[b, m, h] = scores[b, h, m], so that a word's candidate heads are one contiguous row.
# ----------------------------------------------------------------------------------------------


def _check(scores: Tensor, lengths: Tensor | None) -> tuple[np.ndarray, np.ndarray]:
    """Validate; return the transposed scores ``a[b, m, h]`` (a numpy copy in float32 or float64)
    and the lengths (int64 numpy)."""
    if not isinstance(scores, Tensor) or scores.dim() != 3 or scores.shape[1] != scores.shape[2] or scores.shape[1] < 1:
        shape = list(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(f"scores: expected a tensor of shape [B, N+1, N+1], got {shape}")
    if not scores.is_floating_point():
        raise ValueError(f"scores: expected a floating-point tensor, got {scores.dtype}")
    t = scores.detach().cpu()
    if t.dtype not in (torch.float32, torch.float64):
        t = t.float()  # float16, bfloat16: float32 holds them exactly
    # a contiguous copy by incoming arcs (numpy's copy: torch's conversions are slow on a loaded CPU)
    a = np.ascontiguousarray(np.swapaxes(t.numpy(), 1, 2))
    if np.may_share_memory(a, t.numpy()):  # the input was a transposed view: never write into it
        a = a.copy()
    top = a.max() if a.size else 0.0  # NaN propagates through max
    if math.isnan(top):
        raise ValueError("scores: NaN scores (use -inf to forbid an arc)")
    if top == math.inf:
        raise ValueError("scores: +inf scores are not allowed (use -inf to forbid an arc)")
    B, n1 = a.shape[0], a.shape[1]
    if lengths is None:
        ln = np.full(B, n1 - 1, dtype=np.int64)
    else:
        lt = torch.as_tensor(lengths)
        if lt.shape != (B,) or lt.is_floating_point() or lt.is_complex() or lt.dtype == torch.bool:
            raise ValueError(f"lengths: expected an integer tensor of shape [{B}], got {list(lt.shape)} {lt.dtype}")
        ln = lt.to("cpu", torch.int64).numpy()
        if B and (ln.min() < 0 or ln.max() > n1 - 1):
            raise ValueError(f"lengths: expected values in 0..{n1 - 1}, got {ln.tolist()}")
    return a, ln


def _prepare(a: np.ndarray, ln: np.ndarray) -> None:
    """Mask, in place, the arcs that do not exist with ``-inf``.

    The arcs that do not exist: into the root, self loops, and from or into a padding word,
    except that a padding word hangs from the root by an arc of score 0 (so it gets head 0 and
    never joins a cycle).
    """
    B, n1, _ = a.shape
    N = n1 - 1
    a[:, 0, :] = -math.inf
    a.reshape(B, n1 * n1)[:, :: n1 + 1] = -math.inf
    for b in np.flatnonzero(ln < N).tolist():
        L1 = int(ln[b]) + 1
        a[b, L1:, :] = -math.inf
        a[b, :, L1:] = -math.inf
        a[b, L1:, 0] = 0.0


def _tiers(w: np.ndarray, single_root: bool, forbidden_tier: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lexicographic weights of one prepared example ``w[m, h]`` ``[L+1, L+1]`` (no padding).

    Returns ``(T, base, S)`` laid out like ``w``: tiers with the root penalty, tiers without
    (exact integers in float64, ``_EXCL`` at the arcs that do not exist), and finite float64
    scores (0 where forbidden).
    """
    allowed = w > -math.inf
    base = np.where(allowed, 0.0, forbidden_tier)
    base[0, :] = _EXCL
    np.fill_diagonal(base, _EXCL)
    S = np.where(allowed, w, 0.0).astype(np.float64)
    T = base
    if single_root:
        T = base.copy()
        T[1:, 0] -= 1.0
    return T, base, S


def _reach_root(f: np.ndarray) -> np.ndarray:
    """``f[b, x]``: parent of x, with ``f[b, 0] = 0``. True where every node reaches 0."""
    B, n1 = f.shape
    off = np.arange(B)[:, None] * n1
    g = (f + off).ravel()  # pointer jumping on the flattened batch
    for _ in range(max(1, math.ceil(math.log2(n1)))):
        g = g[g]
    return (g.reshape(B, n1) == off).all(1)


def _tarjan(Wt: np.ndarray | None, Ws: np.ndarray, root_last: bool = False) -> list[int]:
    """Maximum arborescence rooted at 0 of one graph given by incoming arcs ``W[m, h]``, nodes ``0..n``.

    Tarjan's (1977) dense-graph form of Edmonds' algorithm, with the expansion of Camerini et al.
    (1979). Weights are lexicographic ``(Wt, Ws)``: ``Wt`` holds exact integer tiers (``_EXCL``
    at the arcs that do not exist) and ``Ws`` finite scores. Two cheaper encodings of special
    cases, with ``Wt`` None and ``-inf`` in ``Ws`` at the arcs that do not exist:

    * every tier 0 (multi-root, no forbidden arc);
    * ``root_last``: arcs out of the root have tier -1, all others 0, and every arc between words
      exists (single root, no forbidden arc). A super-node then takes an arc from the root only
      when it has no other incoming arc, i.e. when it holds every word, so a chosen arc of tier
      -1 never gets contracted and the tiers never need to be stored.

    Every super-node keeps one row of reduced incoming weights indexed by the *original* source
    node, so contracting a cycle of ``k`` super-nodes is one ``k x (n+1)`` reduction and a tree
    costs ``O(n^2)`` arithmetic in ``O(n)`` array operations. Returns heads (entry 0 is 0).
    """
    n1 = Ws.shape[0]
    if n1 <= 1:
        return [0] * n1
    cap = 2 * n1
    ar = np.arange(n1)
    lex = Wt is not None
    Is = np.empty((cap, n1))
    Is[:n1] = Ws  # Is[v, u]: reduced weight of the best arc from original node u into super-node v
    if lex:
        It = np.empty((cap, n1))
        It[:n1] = Wt
    Im = np.empty((cap, n1), dtype=np.int64)
    Im[:n1] = ar[:, None]  # ... and the modifier (original node) of that arc
    top = ar.copy()  # original node -> the super-node it is in now
    members: list = [ar[v : v + 1] for v in range(n1)] + [None] * n1  # original nodes of each super-node
    children: dict[int, list[int]] = {}
    in_h = [0] * cap  # chosen incoming arc of every super-node (original head and modifier) ...
    in_m = [0] * cap
    in_t = [0.0] * cap  # ... and its reduced weight when it was chosen
    in_s = [0.0] * cap
    done = [False] * cap
    done[0] = True
    nxt = n1
    for start in range(1, n1):
        x = int(top[start])
        if done[x]:
            continue
        path = [x]
        onpath = {x}
        while True:
            if lex:
                rt = It[x]
                tm = rt.max()
                rs = np.where(rt == tm, Is[x], -math.inf)
                u = int(rs.argmax())
                in_t[x] = tm
            elif root_last:
                rs = Is[x]
                u = int(rs[1:].argmax()) + 1
                if rs[u] == -math.inf:
                    u = 0
            else:
                rs = Is[x]
                u = int(rs.argmax())
            in_s[x] = rs[u]
            in_h[x] = u
            in_m[x] = int(Im[x, u])
            y = int(top[u])
            if done[y]:  # the path hangs from the finished part: it is final
                for v in path:
                    done[v] = True
                break
            if y not in onpath:
                path.append(y)
                onpath.add(y)
                x = y
                continue
            # a cycle: contract path[i:] into a new super-node c
            i = path.index(y)
            cyc = path[i:]
            del path[i:]
            onpath.difference_update(cyc)
            c = nxt
            nxt += 1
            ca = np.array(cyc)
            rows_s = Is[ca] - np.array([in_s[v] for v in cyc])[:, None]
            if lex:
                rows_t = It[ca] - np.array([in_t[v] for v in cyc])[:, None]
                tmax = rows_t.max(0)
                rows_s = np.where(rows_t == tmax, rows_s, -math.inf)
                r = rows_s.argmax(0)
                It[c] = tmax
            else:
                r = rows_s.argmax(0)
            Is[c] = rows_s[r, ar]
            Im[c] = Im[ca[r], ar]
            mem = np.concatenate([members[v] for v in cyc])
            members[c] = mem
            top[mem] = c
            if lex:
                It[c, mem] = _EXCL
            else:
                Is[c, mem] = -math.inf
            children[c] = cyc
            path.append(c)
            onpath.add(c)
            x = c
    # expansion, outermost super-node first (a parent's id is above its children's): the child
    # holding the entering arc's modifier takes that arc, the other children of the cycle keep
    # their cycle arcs. cur[w]: the super-node holding original node w at the level being undone.
    fh = in_h[:]
    fm = in_m[:]
    cur = top
    for c in range(nxt - 1, n1 - 1, -1):
        for w in children[c]:
            cur[members[w]] = w
        v = int(cur[fm[c]])
        for w in children[c]:
            if w == v:
                fh[w], fm[w] = fh[c], fm[c]
            else:
                fh[w], fm[w] = in_h[w], in_m[w]
    fh[0] = 0
    return fh[:n1]


def _tarjan_any(Wt: np.ndarray | None, Ws: np.ndarray, root_last: bool = False) -> list[int]:
    """:func:`_tarjan`, compiled where the C extension is built (the same heads, ties broken alike)."""
    if _tarjan_c is None:
        return _tarjan(Wt, Ws, root_last)
    S = np.ascontiguousarray(Ws, dtype=np.float64)
    heads = np.empty(S.shape[0], dtype=np.int64)
    _tarjan_c.tarjan(S if Wt is None else np.ascontiguousarray(Wt, dtype=np.float64), S, Wt is not None, root_last, heads)
    return heads.tolist()


def _shortcut(a: np.ndarray, ln: np.ndarray, single_root: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-word best heads ``[B, n1]`` of prepared scores, and whether they are the answer.

    They are when they use no forbidden arc and form a tree (with ``single_root``, one with one
    root child): every word then has its best arc, an upper bound that the tree attains.
    """
    heads = a.argmax(2)
    heads[:, 0] = 0
    best = np.take_along_axis(a, heads[:, :, None], 2)[:, 1:, 0]
    ok = (best > -math.inf).all(1) & _reach_root(heads)
    if single_root:
        words = np.arange(a.shape[1])[None, :]
        ok &= ((heads == 0) & (words >= 1) & (words <= ln[:, None])).sum(1) <= 1
    return heads, ok


def _solve(a: np.ndarray, ln: np.ndarray, single_root: bool) -> np.ndarray:
    """Heads ``[B, n1]`` (int64, entry 0 is 0) of prepared scores: shortcut, else Tarjan."""
    B, n1, _ = a.shape
    heads, ok = _shortcut(a, ln, single_root)
    for b in np.flatnonzero(~ok).tolist():
        L1 = int(ln[b]) + 1
        w = a[b, :L1, :L1]
        # a forbidden arc: more -inf than the masking made (row 0, into the root; the diagonal)
        if int((w == -math.inf).sum()) > 2 * L1 - 1:
            T, _, S = _tiers(w, single_root, -float(n1))
            h = _tarjan_any(T, S)
        else:  # every arc between positions 0..n exists: no tier beyond the root penalty
            h = _tarjan_any(None, w.astype(np.float64), root_last=single_root)
        heads[b, :L1] = h
        heads[b, L1:] = 0
    return heads


def _solve_lex(T: np.ndarray, base: np.ndarray, S: np.ndarray, single_root: bool) -> np.ndarray:
    """Heads ``[P, n1]`` of problems given by lexicographic weights (no padding)."""
    tmax = base.max(2, keepdims=True)
    heads = np.where(base == tmax, S, -math.inf).argmax(2)
    heads[:, 0] = 0
    ok = _reach_root(heads)
    if single_root:
        ok &= (heads[:, 1:] == 0).sum(1) <= 1
    for p in np.flatnonzero(~ok).tolist():
        heads[p] = _tarjan_any(T[p], S[p])
    return heads


def _arc_values(M: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """``[P, n1-1]``: ``M[p, m, heads[p, m-1]]`` (incoming layout) for heads ``[P, n1-1]`` in ``0..n1-1``."""
    return np.take_along_axis(M[:, 1:, :], heads[:, :, None], 2)[:, :, 0]


# ----------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------


def max_arborescence(scores: Tensor, lengths: Tensor | None = None, single_root: bool = False) -> Tensor:
    """The maximum spanning arborescence rooted at 0 of every example: heads ``[B, N]`` long.

    Args:
        scores: ``[B, N+1, N+1]``; ``scores[b, h, m]`` scores the arc head ``h`` -> modifier
            ``m`` (0 is the root). Column 0 and the diagonal are ignored; ``-inf`` forbids an arc;
            NaN or ``+inf`` is a ``ValueError``. Not modified; any float dtype (computed in
            float64 on CPU); any device.
        lengths: ``[B]`` integers in ``0..N``: the number of words of each example (default N).
        single_root: exactly one word attaches to the root (solved exactly; see the module doc).

    Returns:
        ``heads[b, m-1]`` = head of word ``m`` (0 = root), 0 past each length, on scores' device.
        If an example has no valid tree, a spanning tree with the fewest forbidden arcs, then the
        fewest root children, then the best score is returned (see the module doc).

    Time: ``O(B n^2)`` for the shortcut check, plus ``O(n^2)`` for each example it does not settle.
    """
    a, ln = _check(scores, lengths)
    _prepare(a, ln)
    heads = _solve(a, ln, single_root)
    return torch.from_numpy(np.ascontiguousarray(heads[:, 1:])).to(scores.device)


def tree_score(scores: Tensor, heads: Tensor, lengths: Tensor | None = None) -> Tensor:
    """``[B]``: the sum of the arc scores of each tree (summed in float64, returned in scores' dtype).

    ``-inf`` if a tree uses a forbidden arc or has a head outside ``0..n`` (e.g. the ``-1`` of an
    empty k-best slot). Entries past each length are ignored. Does not check that ``heads`` is a
    tree; see :func:`is_tree`.
    """
    a, ln = _check(scores, lengths)
    B, n1, _ = a.shape
    if not isinstance(heads, Tensor) or heads.shape != (B, n1 - 1):
        shape = list(heads.shape) if isinstance(heads, Tensor) else type(heads).__name__
        raise ValueError(f"heads: expected shape [{B}, {n1 - 1}], got {shape}")
    h = heads.detach().to("cpu", torch.int64).numpy()
    inside = np.arange(1, n1)[None, :] <= ln[:, None]
    bad = (inside & ((h < 0) | (h > ln[:, None]))).any(1)
    vals = _arc_values(a, np.clip(h, 0, n1 - 1)).astype(np.float64)
    total = np.where(inside, vals, 0.0).sum(1)
    total[bad] = -math.inf
    return torch.from_numpy(total).to(device=scores.device, dtype=scores.dtype)


def is_tree(
    heads: Tensor, lengths: Tensor | None = None, single_root: bool = False, scores: Tensor | None = None
) -> Tensor:
    """``[B]`` bool: whether ``heads`` ``[B, N]`` is an arborescence rooted at 0 over words ``1..n``.

    Every word's head must be in ``0..n`` and not itself, following heads from any word must reach
    the root, and with ``single_root`` exactly one word (none if ``n = 0``) has head 0. Entries
    past each length are ignored. With ``scores``, a tree that uses a forbidden (``-inf``) arc is
    not valid either.
    """
    if not isinstance(heads, Tensor) or heads.dim() != 2:
        shape = list(heads.shape) if isinstance(heads, Tensor) else type(heads).__name__
        raise ValueError(f"heads: expected shape [B, N], got {shape}")
    B, N = heads.shape
    if lengths is None:
        ln = np.full(B, N, dtype=np.int64)
    else:
        lt = torch.as_tensor(lengths)
        if lt.shape != (B,):
            raise ValueError(f"lengths: expected shape [{B}], got {list(lt.shape)}")
        ln = lt.to("cpu", torch.int64).numpy()
    h = heads.detach().to("cpu", torch.int64).numpy()
    words = np.arange(1, N + 1)[None, :]
    inside = words <= ln[:, None]
    ok = ~(inside & ((h < 0) | (h > ln[:, None]) | (h == words))).any(1)
    f = np.concatenate([np.zeros((B, 1), dtype=np.int64), np.where(inside, np.clip(h, 0, N), 0)], 1)
    ok &= _reach_root(f)
    if single_root:
        ok &= ((h == 0) & inside).sum(1) == (ln > 0)
    out = torch.from_numpy(ok)
    if scores is not None:
        sc = tree_score(scores, torch.from_numpy(np.where(inside, h, 0)), torch.from_numpy(ln))
        out &= torch.isfinite(sc.cpu())
    return out.to(heads.device)


def kbest_arborescences(
    scores: Tensor, k: int, lengths: Tensor | None = None, single_root: bool = False
) -> tuple[Tensor, Tensor]:
    """The ``k`` best arborescences of every example, exactly, best first.

    Returns ``(heads, tree_scores)``: ``heads`` ``[k, B, N]`` long (0 past each length) and
    ``tree_scores`` ``[k, B]`` in scores' dtype. Only valid trees are listed (no forbidden arc; one
    root child with ``single_root``); an example with fewer than ``k`` of them has heads ``-1``
    and score ``-inf`` in the slots past them. Distinct slots hold distinct trees; trees of equal
    score may come in either order.

    Exact Lawler / Camerini et al. (1980) partitioning over the exact constrained argmax (see the
    module doc): up to ``n`` constrained ``O(n^2)`` problems per emitted tree, ``O(k n^3)`` per
    example.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected a positive integer, got {k!r}")
    a, ln = _check(scores, lengths)
    B, n1, _ = a.shape
    _prepare(a, ln)
    # a forbidden arc is banned outright, like an arc banned by the partition: only valid trees
    # are enumerated. A ban outweighs any number of root children.
    ban = -float(n1 * n1)
    out_heads = np.full((k, B, n1 - 1), -1, dtype=np.int64)
    out_scores = np.full((k, B), -math.inf)
    counter = 0
    for b in range(B):
        L = int(ln[b])
        L1 = L + 1
        pos = np.arange(L1)
        T, base, S = _tiers(a[b, :L1, :L1], single_root, ban)
        target = -1.0 if (single_root and L > 0) else 0.0  # the tier of a valid tree

        def solve(forced: np.ndarray, banned: np.ndarray):
            """Best trees with heads forced (``forced[p, m] >= 0``) and arcs banned (``banned[p, m, h]``).

            Returns heads ``[P, L1]``, validity ``[P]`` and float64 scores ``[P]``.
            """
            off = banned | ((forced[:, :, None] >= 0) & (pos[None, None, :] != forced[:, :, None]))
            Tc = np.where(off, np.minimum(T, ban), T)
            bc = np.where(off, np.minimum(base, ban), base)
            Sc = np.broadcast_to(S, Tc.shape)
            h = _solve_lex(Tc, bc, Sc, single_root)
            tier = _arc_values(Tc, h[:, 1:]).sum(1)
            return h, tier == target, _arc_values(Sc, h[:, 1:]).sum(1)

        heap: list = []
        f0 = np.full((1, L1), -1, dtype=np.int64)
        z0 = np.zeros((1, L1, L1), dtype=bool)
        h, v, sc = solve(f0, z0)
        if v[0]:
            heap.append((-float(sc[0]), counter, h[0], f0[0], z0[0]))
            counter += 1
        for r in range(k):
            if not heap:
                break
            negs, _, h, fo, ba = heapq.heappop(heap)
            out_heads[r, b, :L] = h[1:]
            out_heads[r, b, L:] = 0
            out_scores[r, b] = -negs
            if r == k - 1:
                break
            # split the rest of this subspace: free arc i of the tree banned, free arcs before it forced
            free = np.flatnonzero(fo[1:] < 0) + 1
            P = free.size
            if P == 0:
                continue
            fc = np.repeat(fo[None], P, 0)
            tri = np.tril(np.ones((P, P), dtype=bool), -1)  # [i, j]: j < i, arc j forced in child i
            fc[:, free] = np.where(tri, h[free][None, :], fc[:, free])
            bc = np.repeat(ba[None], P, 0)
            bc[np.arange(P), free, h[free]] = True
            hc, vc, scc = solve(fc, bc)
            for i in np.flatnonzero(vc).tolist():
                heapq.heappush(heap, (-float(scc[i]), counter, hc[i], fc[i], bc[i]))
                counter += 1
    dev = scores.device
    return torch.from_numpy(out_heads).to(dev), torch.from_numpy(out_scores).to(device=dev, dtype=scores.dtype)
