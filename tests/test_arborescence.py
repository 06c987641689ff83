"""Maximum spanning arborescence and exact k-best (structures.spanning.decode.arborescence).

Oracles: networkx's ``maximum_spanning_arborescence`` (node 0 has no incoming arc, so it is the
root), the same restricted to one root arc at a time for the single-root optimum, and brute-force
enumeration of every head assignment for small n. Trees are compared by score: ties may pick
different trees.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

nx = pytest.importorskip("networkx")

import structures.spanning.decode.arborescence as arb  # noqa: E402
from structures.spanning.decode import is_tree, kbest_arborescences, max_arborescence, tree_score  # noqa: E402

TOL = 1e-9


@pytest.fixture(autouse=True, params=["numpy", "compiled"])
def tarjan_implementation(request, monkeypatch):
    """Every test runs with the numpy Tarjan and with the C one (skipped where it is not built)."""
    if request.param == "numpy":
        monkeypatch.setattr(arb, "_tarjan_c", None)
    elif arb._tarjan_c is None:
        pytest.skip("the C extension structures.spanning.decode._tarjan_c is not built (setup.py build_ext --inplace)")
    return request.param


# ----------------------------------------------------------------------------------------------
# oracles
# ----------------------------------------------------------------------------------------------


def nx_best(s: torch.Tensor, n: int, only_root_child: int | None = None) -> float:
    """Best arborescence score of words 1..n rooted at 0 (-inf if none), by networkx."""
    G = nx.DiGraph()
    G.add_nodes_from(range(n + 1))
    for h in range(n + 1):
        for m in range(1, n + 1):
            w = float(s[h, m])
            if h != m and math.isfinite(w) and (h != 0 or only_root_child is None or m == only_root_child):
                G.add_edge(h, m, weight=w)
    try:
        A = nx.maximum_spanning_arborescence(G, preserve_attrs=True)
    except nx.NetworkXException:
        return -math.inf
    if A.number_of_nodes() < n + 1 or A.in_degree(0) != 0:
        return -math.inf
    return sum(d["weight"] for _, _, d in A.edges(data=True))


def nx_best_single_root(s: torch.Tensor, n: int) -> float:
    """Best single-root tree: the best over root children c of the best tree with only 0->c from the root."""
    if n == 0:
        return 0.0
    return max(nx_best(s, n, c) for c in range(1, n + 1))


def brute_force(s: torch.Tensor, n: int, single_root: bool) -> list[tuple[float, tuple[int, ...]]]:
    """Every valid tree of words 1..n (no -inf arc), as (score, heads), best first."""
    N = s.shape[-1] - 1
    if n == 0:
        return [(0.0, (0,) * N)]
    cand = torch.tensor(list(itertools.product(range(n + 1), repeat=n)), dtype=torch.long)
    heads = torch.cat([cand, torch.zeros(len(cand), N - n, dtype=torch.long)], 1)
    ss = s.expand(len(cand), -1, -1).to(torch.float64)
    ln = torch.full((len(cand),), n)
    ok = is_tree(heads, ln, single_root, scores=ss)
    sc = tree_score(ss, heads, ln)
    out = [(float(sc[i]), tuple(heads[i].tolist())) for i in ok.nonzero().squeeze(1).tolist()]
    return sorted(out, key=lambda t: -t[0])


def random_batch(gen, B, N, forbid=0.0, scale=1.0):
    s = torch.randn(B, N + 1, N + 1, generator=gen, dtype=torch.float64) * scale
    if forbid:
        s = s.masked_fill(torch.rand(B, N + 1, N + 1, generator=gen, dtype=torch.float64) < forbid, -math.inf)
    return s


# ----------------------------------------------------------------------------------------------
# argmax against networkx
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("forbid", [0.0, 0.3])
def test_argmax_matches_networkx_multi_root(forbid):
    """Hundreds of random graphs up to n = 60, padded batches (lengths) and one by one."""
    gen = torch.Generator().manual_seed(1)
    checked = 0
    for N, B in [(6, 60), (15, 60), (30, 40), (60, 12)]:
        s = random_batch(gen, B, N, forbid)
        ln = torch.randint(1, N + 1, (B,), generator=gen)
        ln[0] = N
        heads = max_arborescence(s, ln)
        got = tree_score(s, heads, ln)
        valid = is_tree(heads, ln, scores=s)
        for b in range(B):
            n = int(ln[b])
            want = nx_best(s[b], n)
            if math.isinf(want):
                assert not valid[b] and got[b] == -math.inf
                assert is_tree(heads[b : b + 1], ln[b : b + 1])  # still a spanning tree
            else:
                assert valid[b]
                assert abs(float(got[b]) - want) < TOL * max(1.0, abs(want)), (N, b)
                checked += 1
            assert (heads[b, n:] == 0).all()
    assert checked > 100


def test_argmax_matches_networkx_single_root():
    gen = torch.Generator().manual_seed(2)
    checked = 0
    for N, B, forbid in [(4, 80, 0.0), (8, 60, 0.0), (12, 30, 0.0), (8, 60, 0.4), (12, 30, 0.3)]:
        s = random_batch(gen, B, N, forbid)
        ln = torch.randint(1, N + 1, (B,), generator=gen)
        heads = max_arborescence(s, ln, single_root=True)
        got = tree_score(s, heads, ln)
        for b in range(B):
            n = int(ln[b])
            want = nx_best_single_root(s[b], n)
            if math.isinf(want):
                assert not is_tree(heads[b : b + 1], ln[b : b + 1], True, scores=s[b : b + 1])
            else:
                assert is_tree(heads[b : b + 1], ln[b : b + 1], True, scores=s[b : b + 1])
                assert abs(float(got[b]) - want) < TOL * max(1.0, abs(want))
                checked += 1
    assert checked > 150


def test_single_root_large_n_against_reweighted_networkx():
    """n up to 60: oracle = networkx on root arcs lowered by c = 1 + n (max - min) (Stanojevic & Cohen)."""
    gen = torch.Generator().manual_seed(3)
    for N, B in [(30, 8), (60, 4)]:
        s = random_batch(gen, B, N)
        s[:, 0, 1:] += 1.0  # root arcs attractive: the unconstrained optimum has several root children
        heads = max_arborescence(s, single_root=True)
        assert is_tree(heads, single_root=True).all()
        got = tree_score(s, heads)
        multi = tree_score(s, max_arborescence(s))
        for b in range(B):
            c = 1.0 + N * float(s[b].max() - s[b].min())
            r = s[b].clone()
            r[0, 1:] -= c
            want = nx_best(r, N) + c
            assert abs(float(got[b]) - want) < 1e-7
            assert float(got[b]) <= float(multi[b]) + TOL


def test_adversarial_nested_cycles():
    """Each contraction creates the next cycle: n - 1 nested contractions."""
    for n in (10, 60):
        s = torch.full((1, n + 1, n + 1), -10.0 * n, dtype=torch.float64)  # never wins, root arcs too
        for m in range(2, n + 1):
            s[0, m - 1, m] = 10.0
            s[0, m, m - 1] = 5.0
        s[0] += 1e-3 * torch.randn(n + 1, n + 1, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
        c = 1.0 + n * float(s.max() - s.min())
        r = s[0].clone()
        r[0, 1:] -= c  # the single-root oracle of the test above
        for single, want in ((False, nx_best(s[0], n)), (True, nx_best(r, n) + c)):
            heads = max_arborescence(s, single_root=single)
            assert is_tree(heads, single_root=single).all()
            assert abs(float(tree_score(s, heads)) - want) < 1e-7 * abs(want)


def test_ties_and_large_scales():
    gen = torch.Generator().manual_seed(4)
    ints = torch.randint(-2, 3, (20, 13, 13), generator=gen).double()  # many ties
    big = random_batch(gen, 10, 12, scale=1e6)
    for s in (ints, big):
        for single in (False, True):
            heads = max_arborescence(s, single_root=single)
            got = tree_score(s, heads)
            assert is_tree(heads, single_root=single).all()
            for b in range(s.shape[0]):
                want = nx_best_single_root(s[b], 12) if single else nx_best(s[b], 12)
                assert abs(float(got[b]) - want) <= 1e-9 * max(1.0, abs(want))


# ----------------------------------------------------------------------------------------------
# the two paths, padding, conventions
# ----------------------------------------------------------------------------------------------


def planted(gen, B, N, margin=20.0):
    """Scores where a random tree (single root) is every word's best head by far."""
    s = torch.randn(B, N + 1, N + 1, generator=gen, dtype=torch.float64)
    heads = torch.zeros(B, N, dtype=torch.long)
    for b in range(B):
        order = (torch.randperm(N, generator=gen) + 1).tolist()
        for i, m in enumerate(order):
            heads[b, m - 1] = 0 if i == 0 else order[int(torch.randint(0, i, (1,), generator=gen))]
    s[:, :, 1:].scatter_add_(1, heads.unsqueeze(1), torch.full((B, 1, N), margin, dtype=torch.float64))
    s[:, :, 0] = 0.0
    return s, heads


def test_shortcut_and_contraction_paths(monkeypatch):
    calls = []
    real = arb._tarjan_any
    monkeypatch.setattr(arb, "_tarjan_any", lambda *a, **k: calls.append(1) or real(*a, **k))
    gen = torch.Generator().manual_seed(5)
    s, tree = planted(gen, 8, 40)
    for single in (False, True):
        assert torch.equal(max_arborescence(s, single_root=single), tree)
    assert not calls  # the shortcut settled every example
    # the contraction path finds the same trees when forced to run
    for b in range(8):
        w = torch.where(torch.eye(41, dtype=torch.bool) | (torch.arange(41) == 0), -math.inf, s[b])
        h = real(None, w.T.contiguous().numpy())  # incoming layout: w.T[m, h]
        assert h[1:] == tree[b].tolist()
    # random scores: per-word best heads mostly have cycles; exactly those take the contraction path
    s = random_batch(gen, 16, 40)
    best = s.masked_fill(torch.eye(41, dtype=torch.bool), -math.inf)[:, :, 1:].argmax(1)
    cyclic = int((~is_tree(best)).sum())
    heads = max_arborescence(s)
    assert len(calls) == cyclic >= 12 and is_tree(heads).all()
    assert torch.allclose(tree_score(s, heads), torch.tensor([nx_best(s[b], 40) for b in range(16)], dtype=torch.float64))
    # single root: the shortcut's tree has several root children -> contraction path
    s, tree = planted(gen, 4, 20)
    s[:, 0, 1:] += 40.0
    calls.clear()
    assert (max_arborescence(s) == 0).all()  # every word under the root: shortcut
    assert not calls
    h1 = max_arborescence(s, single_root=True)
    assert len(calls) == 4 and is_tree(h1, single_root=True).all()


def test_padded_batch_equals_one_by_one():
    gen = torch.Generator().manual_seed(6)
    N = 25
    s = random_batch(gen, 12, N, forbid=0.1)
    ln = torch.tensor([0, 1, 2, 3, 5, 8, 13, 20, 25, 25, 17, 9])
    for single in (False, True):
        heads = max_arborescence(s, ln, single_root=single)
        for b in range(12):
            n = int(ln[b])
            one = max_arborescence(s[b : b + 1, : n + 1, : n + 1].clone(), single_root=single)
            assert torch.equal(heads[b, :n], one[0])
            assert (heads[b, n:] == 0).all()
        # garbage past the lengths changes nothing
        t = s.clone()
        pad = (torch.arange(N + 1)[None, :] > ln[:, None])
        t[pad.unsqueeze(1).expand_as(t) | pad.unsqueeze(2).expand_as(t)] = 100.0
        assert torch.equal(max_arborescence(t, ln, single_root=single), heads)


def test_conventions_dtypes_and_no_mutation():
    gen = torch.Generator().manual_seed(7)
    s = random_batch(gen, 3, 10, forbid=0.2).float()
    s[:, :, 0] = 1e3  # column 0 and the diagonal are ignored
    s.diagonal(0, 1, 2).fill_(1e3)
    copy = s.clone()
    heads = max_arborescence(s)
    assert torch.equal(s, copy)
    assert heads.dtype == torch.long and heads.shape == (3, 10)
    assert is_tree(heads).all()
    for dt in (torch.float16, torch.bfloat16, torch.float64):
        h = max_arborescence(s.to(dt).clamp(min=-6e4))
        assert h.shape == (3, 10) and is_tree(h).all()
    assert tree_score(s, heads).dtype == torch.float32
    # a transposed view is read, never written (the internal copy is laid out by incoming arcs)
    t = s.transpose(1, 2).contiguous()
    view = t.transpose(1, 2)
    assert torch.equal(max_arborescence(view), heads)
    assert torch.equal(t.transpose(1, 2), copy)
    # the root word of a one-word sentence
    assert max_arborescence(torch.zeros(2, 2, 2)).tolist() == [[0], [0]]
    assert max_arborescence(torch.zeros(1, 1, 1)).shape == (1, 0)


def test_infeasible_graphs_return_a_tree():
    s = torch.randn(2, 5, 5, dtype=torch.float64)
    s[0, :, 3] = -math.inf  # word 3 has no allowed head
    s[1, 0, :] = -math.inf  # nothing may attach to the root
    for single in (False, True):
        heads = max_arborescence(s, single_root=single)
        assert is_tree(heads, single_root=single).all()  # a spanning tree, with one forbidden arc
        assert not is_tree(heads, single_root=single, scores=s).any()
        assert (tree_score(s, heads) == -math.inf).all()
    # single root impossible: the root may only take words 1 and 2, neither can head the other's subtree
    s = torch.full((1, 4, 4), -math.inf, dtype=torch.float64)
    s[0, 0, 1] = s[0, 0, 2] = 0.0
    s[0, 1, 3] = 1.0
    heads = max_arborescence(s, single_root=True)
    assert heads.tolist() == [[0, 0, 1]]  # fewest forbidden arcs first, then fewest root children
    assert not is_tree(heads, single_root=True, scores=s)


def test_is_tree_and_tree_score():
    heads = torch.tensor([[0, 1, 2], [2, 1, 0], [0, 0, 0], [2, 0, 9], [1, 0, 0]])
    ln = torch.tensor([3, 3, 3, 2, 0])
    assert is_tree(heads, ln).tolist() == [True, False, True, True, True]
    assert is_tree(heads, ln, single_root=True).tolist() == [True, False, False, True, True]
    s = torch.arange(16.0).view(1, 4, 4).expand(5, 4, 4)
    sc = tree_score(s, heads, ln)
    assert sc[0] == s[0, 0, 1] + s[0, 1, 2] + s[0, 2, 3]
    assert sc[4] == 0
    assert tree_score(s[:1], torch.tensor([[-1, -1, -1]]))[0] == -math.inf
    assert is_tree(torch.tensor([[1, 0]])).tolist() == [False]  # self loop


def test_bad_input():
    with pytest.raises(ValueError, match="scores"):
        max_arborescence(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="scores"):
        max_arborescence(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="scores"):
        max_arborescence(torch.full((1, 3, 3), math.nan))
    with pytest.raises(ValueError, match="lengths"):
        max_arborescence(torch.zeros(2, 3, 3), torch.tensor([1, 3]))
    with pytest.raises(ValueError, match="lengths"):
        max_arborescence(torch.zeros(2, 3, 3), torch.tensor([1]))
    with pytest.raises(ValueError, match="k"):
        kbest_arborescences(torch.zeros(1, 3, 3), 0)
    with pytest.raises(ValueError, match="heads"):
        tree_score(torch.zeros(1, 3, 3), torch.zeros(1, 3, dtype=torch.long))


# ----------------------------------------------------------------------------------------------
# k-best against brute force
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("single_root", [False, True])
def test_kbest_matches_brute_force(single_root):
    gen = torch.Generator().manual_seed(8)
    for N in range(1, 6):
        B = 6
        s = random_batch(gen, B, N, forbid=0.0)
        s[3:] = random_batch(gen, 3, N, forbid=0.25)
        s[2] = torch.randint(-1, 2, (N + 1, N + 1), generator=gen).double()  # ties
        ln = torch.randint(0, N + 1, (B,), generator=gen)
        ln[0] = N
        k = 40
        heads, scores = kbest_arborescences(s, k, ln, single_root=single_root)
        assert heads.shape == (k, B, N) and scores.shape == (k, B)
        for b in range(B):
            want = brute_force(s[b], int(ln[b]), single_root)
            cnt = min(k, len(want))
            assert torch.allclose(scores[:cnt, b], torch.tensor([w[0] for w in want[:cnt]], dtype=torch.float64), atol=1e-9)
            assert (scores[cnt:, b] == -math.inf).all() and (heads[cnt:, b] == -1).all()
            trees = {tuple(heads[r, b].tolist()) for r in range(cnt)}
            assert len(trees) == cnt  # distinct
            allowed = {w[1] for w in want}
            assert trees <= allowed  # valid trees
            assert torch.allclose(tree_score(s[b : b + 1].expand(cnt, -1, -1), heads[:cnt, b], ln[b].expand(cnt)), scores[:cnt, b])
            if cnt < k:
                assert trees == allowed  # all of them


def test_kbest_counts_and_first_is_argmax():
    """n^(n-1) multi-root trees on n words, (n-1)^(n-1) single-root; slot 0 has the argmax score."""
    gen = torch.Generator().manual_seed(9)
    for n in (1, 2, 3, 4):
        s = random_batch(gen, 2, n)
        h, sc = kbest_arborescences(s, 200)
        assert int((sc[:, 0] > -math.inf).sum()) == (n + 1) ** (n - 1)
        h1, sc1 = kbest_arborescences(s, 200, single_root=True)
        assert int((sc1[:, 0] > -math.inf).sum()) == n ** (n - 1)
        for single, scores in ((False, sc), (True, sc1)):
            best = tree_score(s, max_arborescence(s, single_root=single))
            assert torch.allclose(scores[0], best)
    gen = torch.Generator().manual_seed(10)
    s = random_batch(gen, 2, 30)
    h, sc = kbest_arborescences(s, 5, single_root=True)
    assert (sc[1:] <= sc[:-1] + 1e-12).all()
    assert torch.allclose(sc[0], tree_score(s, max_arborescence(s, single_root=True)))
    for r in range(5):
        assert is_tree(h[r], single_root=True).all()


def test_compiled_tarjan_gives_the_numpy_heads(tarjan_implementation):
    """The compiled Tarjan is the numpy one in machine code: the same heads, ties broken alike."""
    tarjan = arb._tarjan_any
    gen = torch.Generator().manual_seed(9)
    for n in (1, 2, 5, 30, 64):
        for trial in range(4):
            w = torch.randn(n + 1, n + 1, generator=gen, dtype=torch.float64)
            if trial == 3:
                w = w.round()  # ties
            w[0] = -math.inf  # incoming layout w[m, h]: nothing enters the root
            w.fill_diagonal_(-math.inf)
            a = w.numpy()
            for root_last in (False, True):
                assert tarjan(None, a, root_last) == arb._tarjan(None, a, root_last)
            forbid = torch.rand(n + 1, n + 1, generator=gen) < 0.3
            T, _, S = arb._tiers(w.masked_fill(forbid, -math.inf).numpy(), True, -float(n + 1))
            assert tarjan(T, S) == arb._tarjan(T, S)
