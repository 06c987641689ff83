"""Tarjan's dense maximum arborescence (:func:`structures.decode.arborescence._tarjan`) compiled
with numba: the same algorithm, the same weights and the same tie-breaking, as one loop in
machine code instead of ``O(n)`` numpy calls on rows.

Optional: importing this module raises ``ImportError`` without numba (``pip install
structures[fast]``), and :mod:`structures.decode.arborescence` then runs its numpy version. The
compiled code is cached on disk (numba's ``cache=True``, in ``__pycache__`` or numba's cache
directory): the first call in a process loads it, only the first call ever compiles it.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["tarjan"]

_NEG = -np.inf


@numba.njit(cache=True, nogil=True)
def _best_in(x: int, Is: np.ndarray, It: np.ndarray, lex: bool, root_last: bool) -> tuple[int, float, float]:
    """The best incoming arc of super-node x: (original source, tier, score)."""
    n1 = Is.shape[1]
    u = 0
    if lex:
        tm = _NEG
        for j in range(n1):
            if It[x, j] > tm:
                tm = It[x, j]
        best = _NEG
        found = False
        for j in range(n1):
            if It[x, j] == tm and (not found or Is[x, j] > best):
                best = Is[x, j]
                u = j
                found = True
        return u, tm, best
    start = 1 if root_last else 0
    best = _NEG
    u = -1
    for j in range(start, n1):
        if u < 0 or Is[x, j] > best:
            best = Is[x, j]
            u = j
    if root_last and best == _NEG:
        u = 0
        best = Is[x, 0]
    return u, 0.0, best


@numba.njit(cache=True, nogil=True)
def _tarjan(Wt: np.ndarray, Ws: np.ndarray, lex: bool, root_last: bool) -> np.ndarray:
    n1 = Ws.shape[0]
    heads = np.zeros(n1, dtype=np.int64)
    if n1 <= 1:
        return heads
    cap = 2 * n1
    Is = np.empty((cap, n1))
    Is[:n1] = Ws
    It = np.zeros((cap if lex else 1, n1))
    if lex:
        It[:n1] = Wt
    Im = np.empty((cap, n1), dtype=np.int64)
    for v in range(n1):
        Im[v, :] = v
    top = np.arange(n1)
    # members of every super-node: a linked list over the original nodes (first, last, next)
    first = np.full(cap, -1, dtype=np.int64)
    last = np.full(cap, -1, dtype=np.int64)
    nxt_mem = np.full(n1, -1, dtype=np.int64)
    for v in range(n1):
        first[v] = v
        last[v] = v
    # the cycle of every contracted super-node: a slice of cyc_nodes
    cyc_nodes = np.empty(cap, dtype=np.int64)
    cyc_start = np.zeros(cap, dtype=np.int64)
    cyc_len = np.zeros(cap, dtype=np.int64)
    n_cyc = 0
    in_h = np.zeros(cap, dtype=np.int64)
    in_m = np.zeros(cap, dtype=np.int64)
    in_t = np.zeros(cap)
    in_s = np.zeros(cap)
    done = np.zeros(cap, dtype=np.bool_)
    done[0] = True
    onpath = np.zeros(cap, dtype=np.bool_)
    path = np.empty(cap, dtype=np.int64)
    rows_s = np.empty(n1)
    rows_t = np.empty(n1)
    nxt = n1
    for start in range(1, n1):
        x = top[start]
        if done[x]:
            continue
        plen = 1
        path[0] = x
        onpath[x] = True
        while True:
            u, tm, bs = _best_in(x, Is, It, lex, root_last)
            in_t[x] = tm
            in_s[x] = bs
            in_h[x] = u
            in_m[x] = Im[x, u]
            y = top[u]
            if done[y]:  # the path hangs from the finished part: it is final
                for i in range(plen):
                    done[path[i]] = True
                    onpath[path[i]] = False
                break
            if not onpath[y]:
                path[plen] = y
                plen += 1
                onpath[y] = True
                x = y
                continue
            # a cycle: contract the path from y on into a new super-node c
            i = plen - 1
            while path[i] != y:
                i -= 1
            c = nxt
            nxt += 1
            cyc_start[c] = n_cyc
            cyc_len[c] = plen - i
            for k in range(i, plen):
                v = path[k]
                cyc_nodes[n_cyc] = v
                n_cyc += 1
                onpath[v] = False
            plen = i
            # the row of c: for every source, the best reduced arc into any member (first member wins ties)
            for j in range(n1):
                bt = _NEG
                bsc = _NEG
                bm = -1
                for k in range(cyc_len[c]):
                    v = cyc_nodes[cyc_start[c] + k]
                    st = It[v, j] - in_t[v] if lex else 0.0
                    ss = Is[v, j] - in_s[v]
                    if bm < 0 or st > bt or (st == bt and ss > bsc):
                        bt = st
                        bsc = ss
                        bm = Im[v, j]
                rows_t[j] = bt
                rows_s[j] = bsc
                Im[c, j] = bm
            Is[c] = rows_s
            if lex:
                It[c] = rows_t
            # members of c: the members of its cycle, in cycle order
            prev = -1
            for k in range(cyc_len[c]):
                v = cyc_nodes[cyc_start[c] + k]
                if prev < 0:
                    first[c] = first[v]
                else:
                    nxt_mem[last[prev]] = first[v]
                prev = v
            last[c] = last[prev]
            w = first[c]
            while True:
                top[w] = c
                if lex:
                    It[c, w] = -(2.0**50)
                else:
                    Is[c, w] = _NEG
                if w == last[c]:
                    break
                w = nxt_mem[w]
            path[plen] = c
            plen += 1
            onpath[c] = True
            x = c
    # expansion, outermost super-node first: the child holding the entering arc's modifier takes
    # that arc, the other children of the cycle keep their cycle arcs
    fh = in_h.copy()
    fm = in_m.copy()
    cur = top
    for c in range(nxt - 1, n1 - 1, -1):
        for k in range(cyc_len[c]):
            w = cyc_nodes[cyc_start[c] + k]
            m = first[w]
            while True:
                cur[m] = w
                if m == last[w]:
                    break
                m = nxt_mem[m]
        v = cur[fm[c]]
        for k in range(cyc_len[c]):
            w = cyc_nodes[cyc_start[c] + k]
            if w == v:
                fh[w] = fh[c]
                fm[w] = fm[c]
            else:
                fh[w] = in_h[w]
                fm[w] = in_m[w]
    for v in range(1, n1):
        heads[v] = fh[v]
    return heads


def tarjan(Wt: np.ndarray | None, Ws: np.ndarray, root_last: bool = False) -> list[int]:
    """:func:`structures.decode.arborescence._tarjan`, compiled: heads (entry 0 is 0)."""
    lex = Wt is not None
    T = np.ascontiguousarray(Wt, dtype=np.float64) if lex else np.zeros((1, 1))
    return _tarjan(T, np.ascontiguousarray(Ws, dtype=np.float64), lex, root_last).tolist()
