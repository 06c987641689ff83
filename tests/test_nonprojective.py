"""NonProjectiveDependencyCRF: brute force at every small size, high-precision references at large
score scales, padding, gradients, sampling, constraints and bad input.

The oracles here are independent of the implementation: trees are listed with itertools, and
the large-scale references are the matrix-tree theorem evaluated in mpmath at 600+ digits (where
Koo's cancelling formulas are harmless).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.testing import assert_close

import structures.spanning._matrix_tree as mt
from structures import NonProjectiveDependencyCRF, ProjectiveDependencyCRF
from structures.spanning._tree_partition import exact, log_partition_and_marginals, masks, shift
from structures.spanning.decode.sampling import sample_arborescences
from matrix_tree_reference import high_precision_reference

NP = NonProjectiveDependencyCRF
try:  # the maximum spanning arborescences (argmax, k-best) live in structures.spanning.decode
    from structures.spanning.decode import arborescence
except ImportError:  # pragma: no cover
    arborescence = None
needs_decode = pytest.mark.skipif(arborescence is None, reason="structures.spanning.decode.arborescence is missing")


# ============================================================================== oracles


def trees(n: int, single_root: bool) -> list[tuple[int, ...]]:
    """Every arborescence of words 1..n rooted at 0, as heads (heads[m-1] = head of m)."""
    out = []
    for heads in itertools.product(range(n + 1), repeat=n):
        if any(h == m + 1 for m, h in enumerate(heads)):
            continue
        if single_root and sum(h == 0 for h in heads) != 1:
            continue
        ok = True
        for m in range(1, n + 1):
            seen, x = set(), m
            while x != 0 and ok:
                ok = x not in seen
                seen.add(x)
                x = heads[x - 1]
        if ok:
            out.append(heads)
    return out


def brute(theta: torch.Tensor, n: int, single_root: bool):
    """(log Z, marginals [N+1, N+1], scores [T], trees) of one example by enumeration."""
    ts = trees(n, single_root)
    scores = torch.stack([sum(theta[h, m + 1] for m, h in enumerate(t)) for t in ts])
    finite = torch.isfinite(scores)
    logz = torch.logsumexp(scores, 0) if finite.any() else torch.tensor(-math.inf, dtype=theta.dtype)
    mu = torch.zeros_like(theta)
    if finite.any():
        p = (scores - logz).exp()
        for pi, t in zip(p, ts):
            for m, h in enumerate(t):
                mu[h, m + 1] += pi
    return logz, mu, scores, ts


def mp_reference(theta: torch.Tensor, single_root: bool, dps: int = 700):
    """log Z and the marginals of one example by the matrix-tree theorem in mpmath at ``dps`` digits."""
    pytest.importorskip("mpmath")
    return high_precision_reference(theta, single_root, dps)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


ROOTS = pytest.mark.parametrize("single_root", [False, True], ids=["multi", "single"])


try:
    from structures.spanning import _matrix_tree_c

    C_PATHS = [f"c-{isa}" for isa in _matrix_tree_c.isas()]
except ImportError:
    C_PATHS = ["c"]


@pytest.fixture(params=["lapack", *C_PATHS])
def fast_path(request, monkeypatch):
    """The fast paths by torch and LAPACK (the certified path; log Z alone from the factors), or by
    the C extension on each instruction set the CPU runs (the same certified path for the
    marginals; log Z alone by the exact elimination), which is skipped where the extension is not
    built."""
    import structures.spanning._tree_partition as partition

    if request.param == "lapack":
        monkeypatch.setattr(partition, "_matrix_tree_c", None)
    elif partition._matrix_tree_c is None:
        pytest.skip("the C extension structures.spanning._matrix_tree_c is not built (setup.py build_ext --inplace)")
    else:
        was = partition._matrix_tree_c.isa()
        partition._matrix_tree_c.set_isa(request.param[2:])
        request.addfinalizer(lambda: partition._matrix_tree_c.set_isa(was))
    return request.param


# ============================================================================== brute force


@needs_decode
@ROOTS
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("scale", [1.0, 8.0])
def test_every_query_matches_enumeration(single_root, n, scale):
    g = gen(1000 * n + int(scale))
    theta = torch.randn(3, n + 1, n + 1, generator=g, dtype=torch.float64) * scale
    q_theta = torch.randn(3, n + 1, n + 1, generator=g, dtype=torch.float64) * scale
    d = NP(theta, single_root=single_root)
    q = NP(q_theta, single_root=single_root)
    count = len(trees(n, single_root))
    for b in range(3):
        logz, mu, scores, ts = brute(theta[b], n, single_root)
        q_logz, _, q_scores, _ = brute(q_theta[b], n, single_root)
        p = (scores - logz).exp()
        assert_close(d.log_partition[b], logz, atol=1e-10, rtol=1e-12)
        assert_close(d.marginals[b], mu, atol=1e-10, rtol=0)
        assert_close(d.entropy()[b], -(p * (scores - logz)).sum(), atol=1e-9, rtol=1e-9)
        assert_close(d.cross_entropy(q)[b], -(p * (q_scores - q_logz)).sum(), atol=1e-9, rtol=1e-9)
        assert_close(d.kl(q)[b], (p * (scores - logz - q_scores + q_logz)).sum(), atol=1e-9, rtol=1e-9)
        best = int(scores.argmax())
        assert_close(d.max[b], scores[best])
        assert d.decode()[b].tolist() == list(ts[best])
        k = min(4, count)
        assert_close(d.topk_scores(k)[:, b], scores.sort(descending=True).values[:k])
        assert float(d.count[b]) == count
        # log_prob of every tree sums to one
        heads = torch.tensor(ts).unsqueeze(1).expand(-1, 3, -1)
        assert_close(d.log_prob(heads)[:, b].exp().sum(), torch.tensor(1.0, dtype=torch.float64))
    topk = d.topk(2)
    assert_close(d.score(topk[0]), d.max)
    values, valid = d.enumerate_structures()
    assert values.shape[0] == count and bool(valid.all())
    assert_close(torch.logsumexp(d.score(values), 0), d.log_partition)


@ROOTS
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_every_path_matches_enumeration(single_root, n, fast_path):
    """The certified LAPACK path, the subtraction-free float64 path and the log-space path."""
    g = gen(7 + n)
    theta = torch.randn(4, n + 1, n + 1, generator=g, dtype=torch.float64) * 3
    lengths = torch.full((4,), n)
    valid, real = masks(n, lengths, theta.device)
    logw, c = shift(theta, valid)
    results = {"default": log_partition_and_marginals(theta, lengths, single_root),
               "exact": log_partition_and_marginals(theta, lengths, single_root, fast=False),
               "log Z alone": log_partition_and_marginals(theta, lengths, single_root, marginals=False)}
    z, m, _ = exact(logw, real, single_root, mt.LOG)
    results["log"] = (z + c.sum(1), m)
    for b in range(4):
        logz, mu, _, _ = brute(theta[b], n, single_root)
        for name, (z, m) in results.items():
            assert_close(z[b], logz, atol=1e-10, rtol=1e-12, msg=name)
            if m is not None:
                assert_close(m[b], mu, atol=1e-10, rtol=0, msg=name)


@ROOTS
def test_count_closed_forms(single_root):
    """Spanning arborescences of the complete graph on n words: (n+1)^(n-1) multi-root, n^(n-1) single."""
    for n in range(1, 9):
        d = NP(torch.zeros(2, n + 1, n + 1), single_root=single_root)
        expected = n ** (n - 1) if single_root else (n + 1) ** (n - 1)
        assert d.count.tolist() == [float(expected)] * 2
        assert_close(d.log_partition, torch.full((2,), math.log(expected)), rtol=1e-6, atol=1e-6)


# ============================================================================== large scales


@ROOTS
def test_std40_float32_marginals_match_high_precision(single_root, fast_path):
    """The issue's case: scores of standard deviation 40 on 20 words, float32 inputs; every
    marginal within 1e-5 of a 700-digit reference (measured: a few 1e-8, float32 rounding)."""
    g = gen(40 + single_root)
    theta = (torch.randn(3, 21, 21, generator=g, dtype=torch.float64) * 40).float()
    d = NP(theta, single_root=single_root)
    mu, logz = d.marginals, d.log_partition
    assert mu.dtype == torch.float32 and logz.dtype == torch.float32
    for b in range(3):
        ref_z, ref_mu = mp_reference(theta[b].double(), single_root)
        assert (mu[b].double() - ref_mu).abs().max() <= 1e-5
        assert abs(float(logz[b]) - ref_z) <= 1e-6 * abs(ref_z)
    # and in float64 the result is exact to float64 rounding, log Z alone too
    z64, mu64 = log_partition_and_marginals(theta, None, single_root)
    z_alone = log_partition_and_marginals(theta, None, single_root, marginals=False)[0]
    for b in range(3):
        ref_z, ref_mu = mp_reference(theta[b].double(), single_root)
        assert (mu64[b] - ref_mu).abs().max() <= 1e-12
        assert abs(float(z64[b]) - ref_z) <= 1e-13 * abs(ref_z)
        assert abs(float(z_alone[b]) - ref_z) <= 1e-13 * abs(ref_z)


@ROOTS
def test_extreme_scales_go_to_log_space(single_root, fast_path):
    """Scores of standard deviation 400: cycles outweigh trees beyond float64's range; the log-space
    path stays exact (and log Z alone, by either path)."""
    g = gen(400 + single_root)
    theta = torch.randn(2, 9, 9, generator=g, dtype=torch.float64) * 400
    info: dict = {}
    z, mu = log_partition_and_marginals(theta, None, single_root, info=info)
    z_alone = log_partition_and_marginals(theta, None, single_root, marginals=False)[0]
    assert torch.isfinite(z).all() and torch.isfinite(mu).all()
    for b in range(2):
        ref_z, ref_mu = mp_reference(theta[b], single_root, dps=3000)
        assert (mu[b] - ref_mu).abs().max() <= 1e-11
        assert abs(float(z[b]) - ref_z) <= 1e-13 * abs(ref_z)
        assert abs(float(z_alone[b]) - ref_z) <= 1e-13 * abs(ref_z)


@ROOTS
def test_fast_path_is_certified_and_exact_on_adversarial_inputs(single_root, fast_path):
    """Wherever the LAPACK path's certificate passes it agrees with the subtraction-free path to
    1e-9 (measured: ~1e-13), over inputs with clusters of words and weak roots at many scales."""
    g = gen(5 + single_root)
    used = used_alone = 0
    for n in (3, 12, 30):
        for scale in (0.5, 2.0, 5.0, 10.0, 40.0):
            theta = torch.randn(16, n + 1, n + 1, generator=g, dtype=torch.float64) * scale
            cluster = torch.randint(0, 3, (16, n + 1), generator=g)
            theta = theta + torch.where(cluster[:, :, None] == cluster[:, None, :], 2 * scale, 0.0)
            theta[:8, 0] -= 2 * scale
            info: dict = {}
            z, mu = log_partition_and_marginals(theta, None, single_root, info=info)
            ze, me = log_partition_and_marginals(theta, None, single_root, fast=False)
            fast = torch.tensor([m == "fast" for m in info["method"]])
            used += int(fast.sum())
            assert bool(((z - ze).abs()[fast] <= 1e-9).all())
            assert bool(((mu - me).abs().flatten(1).amax(1)[fast] <= 1e-9).all())
            # log Z alone: its own certificate (no inverse)
            z, _ = log_partition_and_marginals(theta, None, single_root, info=info, marginals=False)
            fast = torch.tensor([m == "fast" for m in info["method"]])
            used_alone += int(fast.sum())
            assert bool(((z - ze).abs()[fast] <= 1e-9).all())
            assert_close(z, ze, rtol=1e-12, atol=1e-9)
    assert used > 50 and used_alone > 50  # the certificate does pass on benign inputs


@ROOTS
def test_fast_path_on_mixed_lengths_matches_high_precision(single_root, fast_path):
    """Moderate scales (std 3), padded examples, float32 and float64 inputs: every example is
    certified, and log Z and every marginal are within 1e-9 of the 700-digit reference."""
    g = gen(30 + single_root)
    theta = torch.randn(4, 21, 21, generator=g, dtype=torch.float64) * 3
    lengths = torch.tensor([20, 13, 1, 7])
    for x in (theta, theta.float()):
        info: dict = {}
        z, mu = log_partition_and_marginals(x, lengths, single_root, info=info)
        z_alone = log_partition_and_marginals(x, lengths, single_root, marginals=False)[0]
        assert info["method"] == ["fast"] * 4
        for b, n in enumerate(lengths.tolist()):
            ref_z, ref_mu = mp_reference(x[b, : n + 1, : n + 1].double(), single_root)
            assert abs(float(z[b]) - ref_z) <= 1e-9 and abs(float(z_alone[b]) - ref_z) <= 1e-9
            assert (mu[b, : n + 1, : n + 1] - ref_mu).abs().max() <= 1e-9
            assert mu[b, n + 1 :].abs().sum() == 0 and mu[b, :, n + 1 :].abs().sum() == 0


@ROOTS
def test_results_in_float32_are_the_float64_ones_rounded_once(single_root, fast_path):
    """``dtype=float32`` (what a float32 distribution's queries ask for): the same numbers as log Z
    and the marginals in float64 rounded, on every path (the C path writes them at once; examples it does not
    certify, one without a tree and padding included), and the distribution's marginals are those."""
    g = gen(60 + single_root)
    theta = torch.randn(6, 12, 12, generator=g) * 3
    theta[1] *= 40  # large scales: the certificate fails, the exact path answers
    theta[4, 0] = -math.inf  # no arc from the root: no tree
    lengths = torch.tensor([11, 11, 1, 7, 11, 5])
    info: dict = {}
    z64, mu64 = log_partition_and_marginals(theta, lengths, single_root, info=info)
    z32, mu32 = log_partition_and_marginals(theta, lengths, single_root, dtype=torch.float32)
    alone = log_partition_and_marginals(theta, lengths, single_root, marginals=False)[0]
    alone32 = log_partition_and_marginals(theta, lengths, single_root, marginals=False, dtype=torch.float32)[0]
    assert info["method"][1] != "fast" and z32.dtype == mu32.dtype == alone32.dtype == torch.float32
    assert z64[4] == -math.inf and mu64[4].abs().sum() == 0
    assert torch.equal(z32, z64.float()) and torch.equal(mu32, mu64.float()) and torch.equal(alone32, alone.float())
    crf = NonProjectiveDependencyCRF(theta, lengths, single_root=single_root)
    assert torch.equal(crf.marginals, mu64.float()) and torch.equal(crf.log_partition, alone.float())


@ROOTS
@pytest.mark.parametrize("marginals", [False, True], ids=["log_partition", "marginals"])
def test_c_path_splits_the_batch_across_threads_with_the_same_bits(single_root, marginals, monkeypatch):
    """With torch's threads the C call splits the batch into parts, one thread each, and every
    example comes out bit for bit as on one thread (lengths and a NaN example included)."""
    import structures.spanning._tree_partition as partition

    if partition._matrix_tree_c is None:
        pytest.skip("the C extension structures.spanning._matrix_tree_c is not built")
    g = gen(40 + single_root)
    theta = torch.randn(7, 12, 12, generator=g) * 3
    theta[4, 2, 5] = math.nan
    lengths = torch.tensor([11, 3, 1, 7, 11, 5, 9])
    parts = []

    class Counting:
        def __getattr__(self, name):
            def call(*args):
                parts.append(args[-1])
                return getattr(partition._matrix_tree_c_module, name)(*args)

            return call

    monkeypatch.setattr(partition, "_matrix_tree_c_module", partition._matrix_tree_c, raising=False)
    monkeypatch.setattr(partition, "_matrix_tree_c", Counting())
    was = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = partition._in_c(theta, lengths, single_root, marginals, torch.float64)
        monkeypatch.setattr(partition, "_THREAD_WORK", 1)
        torch.set_num_threads(3)
        three = partition._in_c(theta, lengths, single_root, marginals, torch.float64)
    finally:
        torch.set_num_threads(was)
    assert parts == [1, 3]
    assert not one[2][4]  # the NaN example
    assert one[3] == three[3] == int((~one[2]).sum()) >= 1  # the count of examples not ok
    for a, b in zip(one[:3], three[:3]):
        assert (a is None and b is None) or torch.equal(a.nan_to_num(), b.nan_to_num())


# ============================================================================== padding and constraints


@needs_decode
@ROOTS
def test_padded_batch_equals_examples_one_by_one(single_root):
    g = gen(11)
    theta = torch.randn(5, 8, 8, generator=g, dtype=torch.float64) * 6
    lengths = torch.tensor([7, 3, 1, 5, 2])
    d = NP(theta, lengths, single_root=single_root)
    for b in range(5):
        n = int(lengths[b])
        one = NP(theta[b : b + 1, : n + 1, : n + 1].clone(), single_root=single_root)
        assert_close(d.log_partition[b], one.log_partition[0], rtol=1e-14, atol=1e-14)
        assert_close(d.marginals[b, : n + 1, : n + 1], one.marginals[0], rtol=0, atol=1e-14)
        assert d.marginals[b, n + 1 :].abs().sum() == 0 and d.marginals[b, :, n + 1 :].abs().sum() == 0
        assert_close(d.entropy()[b], one.entropy()[0], rtol=1e-12, atol=1e-12)
        assert d.decode()[b, :n].tolist() == one.decode()[0].tolist() and d.decode()[b, n:].abs().sum() == 0
        assert d.count[b] == one.count[0]


@ROOTS
def test_padding_leaves_the_log_partition_unchanged_at_every_scale(single_root):
    for scale in (1.0, 40.0, 400.0):
        theta = torch.randn(1, 6, 6, generator=gen(int(scale)), dtype=torch.float64) * scale
        padded = torch.randn(1, 11, 11, generator=gen(3), dtype=torch.float64) * scale
        padded[:, :6, :6] = theta
        a = log_partition_and_marginals(theta, None, single_root)
        b = log_partition_and_marginals(padded, torch.tensor([5]), single_root)
        assert_close(a[0], b[0], rtol=1e-14, atol=0)
        assert_close(a[1][0], b[1][0, :6, :6], rtol=0, atol=1e-14)


@ROOTS
def test_forbidden_arcs_match_enumeration(single_root):
    """-inf arcs are constraints: random masks (some leave no tree, some leave the words' graph
    not strongly connected, which single root answers by conditioning on the root's child)."""
    g = gen(13 + single_root)
    seen = set()
    for _ in range(60):
        n = int(torch.randint(1, 6, (), generator=g))
        theta = torch.randn(1, n + 1, n + 1, generator=g, dtype=torch.float64) * 3
        theta = theta.masked_fill(torch.rand(1, n + 1, n + 1, generator=g) < 0.45, -math.inf)
        # the same example padded with two words of garbage scores
        padded = torch.randn(1, n + 3, n + 3, generator=g, dtype=torch.float64) * 3
        padded = padded.masked_fill(torch.rand(1, n + 3, n + 3, generator=g) < 0.3, -math.inf)
        padded[:, : n + 1, : n + 1] = theta
        logz, ref, scores, _ = brute(theta[0], n, single_root)
        for x, lengths in ((theta, None), (padded, torch.tensor([n]))):
            info: dict = {}
            z, mu = log_partition_and_marginals(x, lengths, single_root, info=info)
            seen.add(info["method"][0])
            mu = mu[:, : n + 1, : n + 1]
            assert not torch.isnan(mu).any()
            if math.isinf(float(logz)):
                assert z[0] == -math.inf and mu.abs().sum() == 0
            else:
                assert_close(z[0], logz, atol=1e-10, rtol=1e-12)
                assert_close(mu[0], ref, atol=1e-10, rtol=0)
        assert float(NP(padded, torch.tensor([n]), single_root=single_root).count[0]) == int(torch.isfinite(scores).sum())
    assert "none" in seen
    if single_root:
        assert "conditioned" in seen


@needs_decode
@ROOTS
def test_nothing_left_gives_minus_inf_zero_marginals_and_no_nan(single_root):
    theta = torch.randn(2, 5, 5, dtype=torch.float64, requires_grad=True)
    block = torch.zeros(2, 5, 5, dtype=torch.float64)
    block[0, :, 3] = -math.inf  # word 3 has no head
    d = NP(theta + block, single_root=single_root)
    assert d.log_partition[0] == -math.inf and torch.isfinite(d.log_partition[1])
    assert d.marginals[0].abs().sum() == 0 and not torch.isnan(d.marginals).any()
    assert d.entropy()[0] == 0 and torch.isfinite(d.entropy()[1])
    assert d.argmax[0].abs().sum() == 0 and d.max[0] == -math.inf
    assert d.count[0] == 0
    assert d.sample((4,))[:, 0].abs().sum() == 0
    (g,) = torch.autograd.grad(d.log_partition[1], theta)
    assert not torch.isnan(g).any()


# ============================================================================== gradients


@ROOTS
@pytest.mark.parametrize("with_lengths", [False, True])
def test_gradcheck_and_gradgradcheck(single_root, with_lengths):
    g = gen(17)
    theta = torch.randn(2, 5, 5, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([4, 2]) if with_lengths else None

    def logz(t):
        return NP(t, lengths, single_root=single_root).log_partition

    def marginals(t):
        return NP(t, lengths, single_root=single_root).marginals

    assert torch.autograd.gradcheck(logz, (theta,))
    assert torch.autograd.gradgradcheck(logz, (theta,))
    assert torch.autograd.gradcheck(marginals, (theta,))


@ROOTS
def test_marginals_backward_and_expected_score(single_root):
    g = gen(19)
    theta = torch.randn(2, 6, 6, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 6, 6, generator=g, dtype=torch.float64)
    d = NP(theta, torch.tensor([5, 3]), single_root=single_root)
    (ref,) = torch.autograd.grad((d.marginals * v).sum(), theta)
    assert_close(d.marginals_backward(v), ref)
    assert_close(d.expected_score(v), (d.marginals * v).flatten(1).sum(1))


@ROOTS
@pytest.mark.parametrize("scale", [1.0, 40.0, 100.0])
def test_marginals_backward_is_exact_at_large_scales(single_root, scale):
    """The backward of the marginals (H G) against central differences of the exact marginals:
    at std 40 and 100 the LU pivots cancel (a plain slogdet derivative was off by O(1) to 1e16)."""
    g = gen(23)
    theta = torch.randn(3, 21, 21, generator=g, dtype=torch.float64) * scale
    G = torch.randn(3, 21, 21, generator=g, dtype=torch.float64)
    lengths = torch.tensor([20, 13, 7])
    x = theta.clone().requires_grad_()
    (hg,) = torch.autograd.grad((NP(x, lengths, single_root=single_root).marginals * G).sum(), x)
    eps = 1e-6
    up = NP(theta + eps * G, lengths, single_root=single_root).marginals
    down = NP(theta - eps * G, lengths, single_root=single_root).marginals
    assert_close(hg, (up - down) / (2 * eps), atol=1e-6, rtol=0)


# ============================================================================== sampling


@ROOTS
@pytest.mark.parametrize("sampler", ["wilson", "sequential"])
def test_sample_frequencies_match_tree_probabilities(single_root, sampler):
    """Chi-square over every tree of n = 4 (both samplers: Wilson's algorithm and sequential
    conditioning on exact marginals)."""
    g = gen(23)
    torch.manual_seed(23)
    n = 4
    theta = torch.randn(1, n + 1, n + 1, generator=g, dtype=torch.float64) * 1.5
    logz, _, scores, ts = brute(theta[0], n, single_root)
    p = (scores - logz).exp()
    S = 20000
    heads = sample_arborescences(theta, torch.full((1,), n), single_root, copies=S,
                          budget=None if sampler == "wilson" else 0.0)
    index = {t: i for i, t in enumerate(ts)}
    counts = torch.zeros(len(ts), dtype=torch.float64)
    for h in map(tuple, heads.tolist()):
        counts[index[h]] += 1  # KeyError if a sample is not a tree
    chi2 = float(((counts - S * p) ** 2 / (S * p)).sum())
    dof = len(ts) - 1
    assert chi2 < dof + 6 * math.sqrt(2 * dof)


@needs_decode
@ROOTS
def test_sample_api_shapes_and_padding(single_root):
    theta = torch.randn(3, 7, 7, dtype=torch.float64)
    lengths = torch.tensor([6, 2, 4])
    d = NP(theta, lengths, single_root=single_root)
    s = d.sample((5, 2))
    assert s.shape == (5, 2, 3, 7, 7)
    heads = d.heads(s)
    ok = arborescence.is_tree(heads.reshape(-1, 6), lengths.repeat(10), single_root, theta.repeat(10, 1, 1))
    assert bool(ok.all())
    assert torch.isfinite(d.log_prob(s)).all()


@ROOTS
def test_sample_api_frequencies_on_a_padded_batch(single_root):
    """``sample`` through the distribution API (the batch is solved once for all the copies)."""
    torch.manual_seed(31)
    theta = torch.randn(2, 6, 6, generator=gen(31), dtype=torch.float64) * 2
    d = NP(theta, torch.tensor([5, 3]), single_root=single_root)
    S = 8000
    freq = d.sample((S,)).mean(0)
    mu = d.marginals
    z = (freq - mu).abs() / (mu * (1 - mu) / S).sqrt().clamp_min(1e-12)
    assert float(z[mu > 0].max()) < 5.0
    assert freq[mu == 0].abs().sum() == 0


@ROOTS
@pytest.mark.parametrize("scale", [1.0, 40.0], ids=["wilson", "sequential"])
def test_samples_from_a_generator_repeat_and_leave_the_global_stream_alone(single_root, scale):
    """Both samplers (Wilson's walk at ordinary scores, sequential conditioning at std 40) and the
    single-root child draw take ``generator``; so do an empty and a bad ``sample_shape``."""
    d = NP(torch.randn(2, 6, 6, generator=gen(37), dtype=torch.float64) * scale, torch.tensor([5, 3]), single_root=single_root)
    torch.manual_seed(0)
    expected_global = torch.rand(3)
    torch.manual_seed(0)
    first = d.sample((20,), generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.rand(3), expected_global)
    assert torch.equal(d.sample((20,), generator=torch.Generator().manual_seed(1)), first)
    assert d.sample((0, 2)).shape == (0, 2, 2, 6, 6)
    with pytest.raises(ValueError, match="sample_shape"):
        d.sample((-1,))


@needs_decode
def test_single_root_with_only_multi_root_trees_left_has_no_best_tree():
    """Only arcs from the root remain: trees exist with several root children, none with one, so
    single root has log Z = max = -inf and an all-zero argmax (the decode gave the multi-root tree)."""
    theta = torch.full((1, 5, 5), -math.inf, dtype=torch.float64)
    theta[0, 0, 1:] = 1.0
    d = NP(theta, single_root=True)
    assert d.count[0] == 0 and torch.isneginf(d.log_partition[0]) and torch.isneginf(d.max[0])
    assert (d.argmax == 0).all() and (d.decode() == 0).all()
    assert NP(theta).max[0] == 4


@needs_decode
@ROOTS
def test_log_prob_of_heads_that_are_not_a_tree_is_minus_inf(single_root):
    """Random heads (cycles, self-heads, several root children under single_root) against
    ``arborescence.is_tree``; a word's head past the sentence is not a tree either."""
    g = gen(43)
    theta = torch.randn(4, 6, 6, generator=g, dtype=torch.float64)
    lengths = torch.tensor([5, 3, 4, 1])
    d = NP(theta, lengths, single_root=single_root)
    heads = torch.randint(0, 6, (200, 4, 5), generator=g) * (torch.arange(5) < lengths[:, None])
    heads = torch.minimum(heads, lengths[:, None])  # in range; past each length 0
    trees = arborescence.is_tree(heads.reshape(-1, 5), lengths.repeat(200), single_root, theta.repeat(200, 1, 1)).reshape(200, 4)
    assert trees.any() and not trees.all()
    assert torch.equal(d.is_structure(d.to_parts(heads)), trees)
    assert torch.isneginf(d.log_prob(heads)[~trees]).all() and torch.isfinite(d.log_prob(heads)[trees]).all()


@pytest.mark.parametrize("cls", [NP, ProjectiveDependencyCRF], ids=["nonprojective", "projective"])
def test_kl_between_root_modes_is_infinite_only_where_p_has_mass_outside_q(cls):
    """Single-root trees are multi-root trees too: KL(single‖multi) is finite (against the sum over
    the support); KL(multi‖single) is +inf wherever a tree with several root children has mass."""
    g = gen(47)
    theta, other = (torch.randn(3, 5, 5, generator=g, dtype=torch.float64) for _ in range(2))
    lengths = torch.tensor([4, 1, 3])
    single, multi = cls(theta, lengths, single_root=True), cls(other, lengths)
    values, valid = single.enumerate_structures()
    p = single.log_prob(values).exp() * valid
    expected = (p * (single.log_prob(values) - multi.log_prob(values)).masked_fill(~valid, 0)).sum(0)
    assert_close(single.kl(multi), expected)
    assert_close(torch.distributions.kl_divergence(single, multi), expected)
    assert multi.kl(single).tolist() == [math.inf, 0.0, math.inf]
    assert torch.isposinf(multi.cross_entropy(single)[[0, 2]]).all()


@ROOTS
def test_a_torch_distribution_with_kl_divergence_registered(single_root):
    g = gen(41)
    lengths = torch.tensor([5, 3])
    d, q = (NP(torch.randn(2, 6, 6, generator=g, dtype=torch.float64), lengths, single_root=single_root)
            for _ in range(2))
    assert isinstance(d, torch.distributions.Distribution)
    assert d.batch_shape == (2,) and d.event_shape == (6, 6)
    for b, n in enumerate(lengths.tolist()):  # kl_divergence is KL(p || q) and mean E_p[z], by enumeration
        logz, mu, scores, _ = brute(d.log_potentials[b], n, single_root)
        q_logz, _, q_scores, _ = brute(q.log_potentials[b], n, single_root)
        p = (scores - logz).exp()
        assert_close(torch.distributions.kl_divergence(d, q)[b], (p * ((scores - logz) - (q_scores - q_logz))).sum())
        assert_close(d.mean[b], mu)


@ROOTS
def test_an_empty_batch_answers_every_query_with_empty_results(single_root):
    d = NP(torch.zeros(0, 5, 5, dtype=torch.float64), single_root=single_root)
    for value in (d.log_partition, d.max, d.count, d.entropy()):
        assert value.shape == (0,)
    assert d.marginals.shape == d.argmax.shape == d.sample((2,)).shape[1:] == (0, 5, 5)
    values, valid = d.enumerate_structures()
    assert values.shape[1:] == (0, 5, 5) and valid.shape[1] == 0


@needs_decode
def test_sampling_at_large_scale_uses_the_exact_sequential_sampler():
    """Wilson's algorithm would run for ~e^100 steps here; the sampler switches by its expected time."""
    theta = torch.randn(2, 9, 9, generator=gen(29), dtype=torch.float64) * 40
    d = NP(theta)
    s = d.sample((3,))
    assert bool(arborescence.is_tree(d.heads(s).reshape(-1, 8), None, False, theta.repeat(3, 1, 1)).all())


# ============================================================================== API details


@ROOTS
def test_half_precision_is_computed_in_float32_and_returned_in_input_dtype(single_root):
    theta = torch.randn(2, 6, 6, dtype=torch.float64)
    ref = NP(theta, single_root=single_root)
    for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 2e-2)):
        d = NP(theta.to(dtype), single_root=single_root)
        assert d.log_partition.dtype == dtype and d.marginals.dtype == dtype
        exact = NP(theta.to(dtype).double(), single_root=single_root)
        assert_close(d.marginals.double(), exact.marginals, atol=tol, rtol=0)
        assert_close(d.log_partition.double(), exact.log_partition, atol=tol * 10, rtol=tol)
    assert ref.marginals.dtype == torch.float64


@needs_decode
@ROOTS
def test_decode_to_parts_and_networkx(single_root):
    nx = pytest.importorskip("networkx")
    theta = torch.randn(2, 6, 6, dtype=torch.float64)
    d = NP(theta, torch.tensor([5, 3]), single_root=single_root)
    heads = d.decode()
    assert heads.shape == (2, 5) and heads[1, 3:].abs().sum() == 0
    assert torch.equal(d.to_parts(heads), d.argmax)
    graphs = d.to_networkx()
    assert len(graphs) == 2
    for b, gr in enumerate(graphs):
        n = int(d.lengths[b])
        assert isinstance(gr, nx.DiGraph) and nx.is_arborescence(gr) and gr.number_of_nodes() == n + 1
        assert {(h, m) for h, m in gr.edges} == {(int(heads[b, m - 1]), m) for m in range(1, n + 1)}
        if single_root:
            assert gr.out_degree(0) == 1


def test_bad_input_raises_value_error_naming_the_argument():
    good = torch.randn(2, 5, 5)
    cases = [
        (lambda: NP(torch.randn(2, 5)), "log_potentials"),
        (lambda: NP(torch.randn(2, 5, 4)), "log_potentials"),
        (lambda: NP(torch.randn(2, 1, 1)), "log_potentials"),
        (lambda: NP(torch.full((2, 5, 5), float("nan"))), "log_potentials"),
        (lambda: NP(torch.full((2, 5, 5), float("inf"))), "log_potentials"),
        (lambda: NP(torch.zeros(2, 5, 5, dtype=torch.long)), "log_potentials"),
        (lambda: NP(good, torch.tensor([0, 3])), "lengths"),
        (lambda: NP(good, torch.tensor([5, 3])), "lengths"),
        (lambda: NP(good, torch.tensor([4.0, 3.0])), "lengths"),
        (lambda: NP(good, torch.tensor([4, 3, 2])), "lengths"),
        (lambda: NP(good).expected_score(torch.randn(2, 4, 4)), "v"),
        (lambda: NP(good).log_prob(torch.zeros(2, 3, dtype=torch.long)), "value"),
    ]
    for make, name in cases:
        with pytest.raises(ValueError, match=name):
            make()


def test_semirings_without_an_algorithm_raise():
    import semiring as sr

    theta = torch.randn(1, 4, 4, generator=gen(43), dtype=torch.float64)
    d = NP(theta)
    with pytest.raises(NotImplementedError, match="SignedLog"):
        d.run(sr.SignedLog)
    _, _, scores, _ = brute(theta[0], 3, single_root=False)
    assert_close(d.run(sr.Real), scores.exp().sum().reshape(1))  # the Real semiring: the sum over trees of exp(score)


@needs_decode
def test_inputs_are_not_modified():
    theta = torch.randn(2, 6, 6)
    theta[0, 2, 3] = -math.inf
    keep = theta.clone()
    lengths = torch.tensor([5, 4])
    d = NP(theta, lengths, single_root=True)
    _ = (d.log_partition, d.marginals, d.entropy(), d.argmax, d.sample((2,)), d.count, d.topk(2))
    assert torch.equal(theta, keep) and torch.equal(lengths, torch.tensor([5, 4]))


# ============================================================================== slow


@pytest.mark.slow
@ROOTS
def test_large_batch_speed_and_memory_scale(single_root):
    theta = torch.randn(16, 129, 129)
    d = NP(theta, single_root=single_root)
    mu = d.marginals
    assert_close(mu.sum(1)[:, 1:], torch.ones(16, 128), atol=1e-5, rtol=0)
    ze, me = log_partition_and_marginals(theta, None, single_root, fast=False)
    assert (me.float() - mu).abs().max() < 1e-6


@pytest.mark.slow
@ROOTS
def test_std40_n40_matches_high_precision(single_root):
    theta = (torch.randn(2, 41, 41, generator=gen(41), dtype=torch.float64) * 40).float()
    z, mu = log_partition_and_marginals(theta, None, single_root)
    for b in range(2):
        ref_z, ref_mu = mp_reference(theta[b].double(), single_root, dps=1200)
        assert (mu[b] - ref_mu).abs().max() <= 1e-12
        assert abs(float(z[b]) - ref_z) <= 1e-13 * abs(ref_z)
