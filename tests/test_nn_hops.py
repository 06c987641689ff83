"""structures.nn.HopAttention and MemoryHopAttention: attention over facts in K hops (Kim et al. 2017, §4.3)."""

import itertools

import pytest
import torch

from structures import HopChainCRF
from structures.nn import AttentionOutput, HopAttention, MemoryHopAttention

B, K, F, D = 3, 3, 5, 4


def facts(batch=B, hops=K, n=F, dim=D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    return make(batch, hops, n, dim), make(batch, hops, n, dim), make(batch, hops, dim)


LAYERS = [HopAttention("binary"), HopAttention("unary"), HopAttention("binary", linear=True), HopAttention("unary", no_repeat=True),
          HopAttention("binary", link="outputs"), HopAttention("binary", linear=True, link="outputs"), HopAttention("unary", linear=True)]


def name(layer) -> str:
    if isinstance(layer, MemoryHopAttention):
        return f"memn2n-linear={layer.linear}"
    return f"{layer.kind}-no_repeat={layer.no_repeat}-linear={layer.linear}-link={layer.link}"


def run(layer, inputs, outputs, queries, lengths=None):
    if isinstance(layer, MemoryHopAttention):
        return layer(inputs, outputs, queries[:, 0], lengths)
    return layer(inputs, outputs, queries, lengths)


@pytest.mark.parametrize("layer", LAYERS + [MemoryHopAttention(), MemoryHopAttention(linear=True)], ids=name)
def test_shapes(layer):
    out = run(layer, *facts())
    assert isinstance(out, AttentionOutput)
    assert out.context.shape == (B, D) and out.attention.shape == (B, K, F)
    if isinstance(layer, HopAttention) and not layer.linear:
        assert out.distribution.decode().shape == (B, K)
        torch.testing.assert_close(out.attention.sum(-1), torch.ones(B, K))
    else:
        assert out.distribution is None


@pytest.mark.parametrize("layer", LAYERS + [MemoryHopAttention(), MemoryHopAttention(linear=True)], ids=name)
def test_padded_facts_get_no_attention_and_a_padded_batch_equals_one_by_one(layer):
    inputs, outputs, queries = facts()
    lengths = torch.tensor([5, 2, 3])
    out = run(layer, inputs, outputs, queries, lengths)
    for b, n in enumerate(lengths.tolist()):
        assert (out.attention[b, :, n:] == 0).all()
        alone = run(layer, inputs[b:b + 1, :, :n], outputs[b:b + 1, :, :n], queries[b:b + 1])
        torch.testing.assert_close(out.context[b], alone.context[0])
        torch.testing.assert_close(out.attention[b, :, :n], alone.attention[0])
        if out.distribution is not None:
            assert out.distribution.decode()[b].tolist() == alone.distribution.decode()[0].tolist()


def test_context_is_the_expected_output_embedding_under_the_hop_marginals():
    """context = Σ_k Σ_f p(z_k = f) o^k_f, with p(z_k = f) enumerated (the paper's chain, A.4)."""
    inputs, outputs, queries = facts(batch=1, dtype=torch.float64)
    out = HopAttention("binary")(inputs, outputs, queries)
    weights = papers_chain_hop_marginals(inputs, outputs, queries, "inputs")
    torch.testing.assert_close(out.context[0], torch.einsum("kf,kfd->d", weights, outputs[0]))


def papers_chain_hop_marginals(inputs, outputs, queries, link):
    """p(z_k = f) [K, F] of example 0 by enumeration of every fact sequence z."""
    s = torch.log_softmax(torch.einsum("kfd,kd->kf", inputs[0], queries[0]), -1)
    source = {"inputs": inputs, "outputs": outputs, "both": inputs + outputs}[link]
    weights = torch.zeros(K, F, dtype=torch.float64)
    total = 0.0
    for z in itertools.product(range(F), repeat=K):
        if any(z[k] == z[k + 1] for k in range(K - 1)):
            continue
        score = sum(s[k, z[k]] + source[0, k, z[k]] @ inputs[0, k + 1, z[k + 1]] + s[k + 1, z[k + 1]] for k in range(K - 1))
        p = torch.exp(score)
        total += p
        for k in range(K):
            weights[k, z[k]] += p
    return weights / total


@pytest.mark.parametrize("link", ["inputs", "outputs", "both"])
def test_binary_marginals_are_those_of_the_papers_chain_by_enumeration(link):
    """p(z) ∝ exp Σ_k θ_{k,k+1}(z_k, z_{k+1}) with θ from A.4 (log_softmax query scores), no repeats;
    the link term x^k_i · x^{k+1}_j (A.4), o^k_i · x^{k+1}_j or their sum."""
    inputs, outputs, queries = facts(batch=1, dtype=torch.float64)
    out = HopAttention("binary", link=link)(inputs, outputs, queries)
    torch.testing.assert_close(out.attention[0], papers_chain_hop_marginals(inputs, outputs, queries, link))


def test_unary_marginals_are_per_hop_softmaxes():
    inputs, outputs, queries = facts()
    out = HopAttention("unary")(inputs, outputs, queries, torch.tensor([5, 4, 2]))
    scores = torch.einsum("bkfd,bkd->bkf", inputs, queries)
    mask = torch.arange(F) < torch.tensor([5, 4, 2])[:, None, None]
    torch.testing.assert_close(out.attention, torch.softmax(scores.masked_fill(~mask, float("-inf")), -1))


def test_binary_never_decodes_or_weighs_the_same_fact_twice_in_a_row():
    inputs, outputs, queries = facts(seed=3)
    inputs[:, 1] = inputs[:, 0]  # make repeating the first hop's fact attractive
    out = HopAttention("binary")(inputs, outputs, queries)
    pairs = out.distribution.marginals[:, 1:]
    assert (pairs.diagonal(dim1=-2, dim2=-1) == 0).all()
    z = out.distribution.decode()
    assert (z[:, 1:] != z[:, :-1]).all()


def test_the_crfs_linear_start_is_not_a_no_op():
    """A.4's linear start (query scores without log_softmax) leaves a chain CRF's marginals as they
    are; ours takes the hops linearly, so its weights are the raw scores' recursion instead."""
    inputs, outputs, queries = facts()
    for kind in ("unary", "binary"):
        structured = HopAttention(kind)(inputs, outputs, queries)
        linear = HopAttention(kind, linear=True)(inputs, outputs, queries)
        assert linear.distribution is None and not torch.allclose(linear.attention, structured.attention)


def test_linear_start_weights_follow_the_links():
    """``w_1 = s_1``, ``w_{k+1}(j) = s_{k+1}(j) + Σ_{i ≠ j} w_k(i) l_k(i, j)``; padded facts get 0."""
    inputs, outputs, queries = facts(dtype=torch.float64)
    lengths = torch.tensor([5, 2, 3])
    out = HopAttention("binary", linear=True, link="outputs")(inputs, outputs, queries, lengths)
    for b, n in enumerate(lengths.tolist()):
        x, o, q = inputs[b, :, :n], outputs[b, :, :n], queries[b]
        w = x[0] @ q[0]
        torch.testing.assert_close(out.attention[b, 0, :n], w)
        for k in range(1, K):
            link = (o[k - 1] @ x[k].T).fill_diagonal_(0)
            w = x[k] @ q[k] + w @ link
            torch.testing.assert_close(out.attention[b, k, :n], w)
        assert (out.attention[b, :, n:] == 0).all()
    unary = HopAttention("unary", linear=True)(inputs, outputs, queries)
    torch.testing.assert_close(unary.attention, torch.einsum("bkfd,bkd->bkf", inputs, queries))


def test_two_hop_linear_start_with_output_links_is_memn2ns():
    """With one query for both hops and repeats allowed, the binary chain's linear start with the
    ``outputs`` link is MemN2N's linear start: ``w_2(j) = x^2_j · (q + Σ_i w_1(i) o^1_i)``."""
    inputs, outputs, queries = facts(hops=2)
    queries = queries[:, :1].expand(-1, 2, -1)
    crf = HopAttention("binary", no_repeat=False, linear=True, link="outputs")(inputs, outputs, queries)
    memn2n = MemoryHopAttention(linear=True)(inputs, outputs, queries[:, 0])
    torch.testing.assert_close(crf.attention, memn2n.attention)
    torch.testing.assert_close(crf.context, memn2n.context)


def test_memn2n_hops_follow_the_updated_query():
    inputs, outputs, queries = facts()
    out = MemoryHopAttention()(inputs, outputs, queries[:, 0])
    u = queries[:, 0]
    for k in range(K):
        w = torch.softmax(torch.einsum("bfd,bd->bf", inputs[:, k], u), -1)
        torch.testing.assert_close(out.attention[:, k], w)
        u = u + torch.einsum("bf,bfd->bd", w, outputs[:, k])
    torch.testing.assert_close(queries[:, 0] + out.context, u)


@pytest.mark.parametrize("layer", LAYERS + [MemoryHopAttention()], ids=name)
def test_gradients(layer):
    inputs, outputs, queries = (t.requires_grad_() for t in facts(batch=2, hops=2, n=4, dim=3, dtype=torch.float64))
    lengths = torch.tensor([4, 3])
    assert torch.autograd.gradcheck(lambda x, o, q: run(layer, x, o, q, lengths).context, (inputs, outputs, queries))


def test_inputs_are_not_mutated():
    inputs, outputs, queries = facts()
    copies = [t.clone() for t in (inputs, outputs, queries)]
    HopAttention("binary")(inputs, outputs, queries, torch.tensor([5, 2, 3]))
    for t, c in zip((inputs, outputs, queries), copies):
        assert torch.equal(t, c)


@pytest.mark.parametrize("call, name", [
    (lambda x, o, q: HopAttention()(x[0], o, q), "inputs"),
    (lambda x, o, q: HopAttention()(x, o[..., :2], q), "outputs"),
    (lambda x, o, q: HopAttention()(x, o, q[:, 0]), "queries"),
    (lambda x, o, q: HopAttention()(x, o, q, torch.tensor([5, 6, 1])), "lengths"),
    (lambda x, o, q: HopAttention()(x, o, q, torch.tensor([5, 1, 2])), "lengths"),  # no_repeat needs 2 facts
    (lambda x, o, q: HopAttention()(x[:, :1], o[:, :1], q[:, :1]), "inputs"),  # binary needs 2 hops
    (lambda x, o, q: MemoryHopAttention()(x, o, q), "query"),
    (lambda x, o, q: HopAttention("ternary"), "kind"),
    (lambda x, o, q: HopAttention("binary", link="queries"), "link"),
])
def test_bad_input_raises_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call(*facts())


def test_structure_is_the_hop_chain_crf():
    out = HopAttention("unary")(*facts())
    assert isinstance(out.distribution, HopChainCRF)
