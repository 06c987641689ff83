"""The attention layers of structures.nn: softmax, sigmoid, segmentation and syntactic attention."""

import pytest
import torch

from structures import EmissionCRF, ProjectiveDependencyCRF
from structures.nn import (AttentionOutput, SegmentationAttention, SigmoidAttention, SoftmaxAttention,
                           SyntacticAttention)

QUERY_LAYERS = [SoftmaxAttention, SigmoidAttention, SegmentationAttention,
                lambda d, q: SegmentationAttention(d, q, normalize=2.0)]
QUERY_IDS = ["softmax", "sigmoid", "segmentation", "segmentation-normalized"]


def make(layer, *args, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return layer(*args).to(dtype)


# ------------------------------------------------------------------------------ query attention


@pytest.mark.parametrize("layer", QUERY_LAYERS, ids=QUERY_IDS)
def test_query_attention_shapes_one_query_and_many(layer):
    attn = make(layer, 5, 3)
    memory, lengths = torch.randn(4, 7, 5), torch.tensor([7, 2, 5, 1])
    out = attn(memory, torch.randn(4, 3), lengths)
    assert isinstance(out, AttentionOutput)
    assert out.context.shape == (4, 5) and out.attention.shape == (4, 7)
    out = attn(memory, torch.randn(4, 6, 3), lengths)
    assert out.context.shape == (4, 6, 5) and out.attention.shape == (4, 6, 7)
    assert torch.allclose(out.context, out.attention @ memory, atol=1e-6)


@pytest.mark.parametrize("layer", QUERY_LAYERS, ids=QUERY_IDS)
def test_query_attention_padding_gets_no_weight_and_equals_one_by_one(layer):
    attn = make(layer, 5, 3, dtype=torch.float64)
    memory, query = torch.randn(3, 6, 5, dtype=torch.float64), torch.randn(3, 4, 3, dtype=torch.float64)
    lengths = torch.tensor([6, 3, 1])
    memory[1, 3:] = 1e3  # whatever padding holds must not matter
    out = attn(memory, query, lengths)
    for b, n in enumerate(lengths.tolist()):
        assert (out.attention[b, :, n:] == 0).all()
        alone = attn(memory[b:b + 1, :n], query[b:b + 1])
        assert torch.allclose(out.attention[b, :, :n], alone.attention[0])
        assert torch.allclose(out.context[b], alone.context[0])


def test_softmax_weights_sum_to_one_and_sigmoid_is_elementwise():
    memory, query = torch.randn(2, 5, 4), torch.randn(2, 4)
    soft = make(SoftmaxAttention, 4, 4)(memory, query, torch.tensor([5, 2]))
    assert torch.allclose(soft.attention.sum(-1), torch.ones(2))
    sig = make(SigmoidAttention, 4, 4)
    scores = torch.einsum("bnd,de,be->bn", memory, sig.weight, query)
    assert torch.allclose(sig(memory, query).attention, torch.sigmoid(scores), atol=1e-6)


def test_segmentation_marginals_are_the_emission_crfs():
    attn = make(SegmentationAttention, 4, 3, dtype=torch.float64)
    with torch.no_grad():
        attn.pairwise.copy_(torch.tensor([[0.5, -1.0], [0.3, 2.0]]))
    memory, query = torch.randn(2, 5, 4, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    lengths = torch.tensor([5, 3])
    out = attn(memory, query, lengths)
    scores = torch.einsum("bnd,de,be->bn", memory, attn.weight, query)
    crf = EmissionCRF(torch.stack([torch.zeros_like(scores), scores], -1), attn.pairwise.detach(), lengths=lengths)
    assert torch.allclose(out.attention, crf.marginals[..., 1])
    assert isinstance(out.distribution, EmissionCRF)
    assert torch.equal(out.distribution.decode(), crf.decode())


def test_segmentation_normalized_weights_sum_to_lambda():
    attn = make(SegmentationAttention, 4, 3, 2.0)
    out = attn(torch.randn(3, 6, 4), torch.randn(3, 5, 3), torch.tensor([6, 4, 1]))
    assert torch.allclose(out.attention.sum(-1), torch.full((3, 5), 2.0), atol=1e-5)


def test_segmentation_attention_gradcheck():
    attn = make(SegmentationAttention, 3, 2, dtype=torch.float64)
    memory = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    query = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    weight = attn.weight.detach().clone().requires_grad_()
    pairwise = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([4, 2])

    def context(memory, query, weight, pairwise):
        params = {"weight": weight, "pairwise": pairwise}
        return torch.func.functional_call(attn, params, (memory, query, lengths)).context

    assert torch.autograd.gradcheck(context, (memory, query, weight, pairwise))


@pytest.mark.parametrize("layer", QUERY_LAYERS, ids=QUERY_IDS)
def test_query_attention_rejects_bad_input(layer):
    attn = make(layer, 5, 3)
    memory, query = torch.randn(2, 4, 5), torch.randn(2, 3)
    with pytest.raises(ValueError, match="memory"):
        attn(torch.randn(2, 4, 6), query)
    with pytest.raises(ValueError, match="memory"):
        attn(torch.randn(4, 5), query)
    with pytest.raises(ValueError, match="query"):
        attn(memory, torch.randn(3, 3))
    with pytest.raises(ValueError, match="query"):
        attn(memory, torch.randn(2, 4))
    with pytest.raises(ValueError, match="lengths"):
        attn(memory, query, torch.tensor([4, 5]))
    with pytest.raises(ValueError, match="lengths"):
        attn(memory, query, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="lengths"):
        attn(memory, query, torch.tensor([4.0, 2.0]))


def test_segmentation_rejects_bad_normalize():
    with pytest.raises(ValueError, match="normalize"):
        SegmentationAttention(3, 3, normalize=0.0)


# ------------------------------------------------------------------------------ syntactic attention


@pytest.mark.parametrize("structured", [True, False], ids=["structured", "simple"])
def test_syntactic_shapes_and_columns_are_parent_distributions(structured):
    attn = make(SyntacticAttention, 6, 8, structured)
    states, values, lengths = torch.randn(3, 7, 6), torch.randn(3, 7, 4), torch.tensor([7, 4, 2])
    out = attn(states, values, lengths)
    assert out.context.shape == (3, 7, 4) and out.attention.shape == (3, 7, 7)
    columns = out.attention.sum(1)
    for b, n in enumerate(lengths.tolist()):
        assert torch.allclose(columns[b, 1:n], torch.ones(n - 1), atol=1e-5)  # every word has one parent
        assert (columns[b, 0] == 0) and (columns[b, n:] == 0).all()
    assert (torch.diagonal(out.attention, dim1=1, dim2=2) == 0).all()
    assert torch.allclose(out.context, out.attention.transpose(1, 2) @ values, atol=1e-6)
    assert (out.distribution is not None) == structured
    assert attn(states, lengths=lengths).context.shape == (3, 7, 6)  # values default to the states


def test_syntactic_children_context_follows_the_parent_context():
    attn = make(SyntacticAttention, 6, 8, True, False, True)
    states, values = torch.randn(2, 5, 6), torch.randn(2, 5, 3)
    out = attn(states, values)
    assert out.context.shape == (2, 5, 6)
    assert torch.allclose(out.context[..., 3:], out.attention @ values, atol=1e-6)


@pytest.mark.parametrize("single_root", [False, True])
def test_syntactic_marginals_are_the_projective_crfs(single_root):
    attn = make(SyntacticAttention, 4, 5, True, single_root, dtype=torch.float64)
    states, lengths = torch.randn(2, 6, 4, dtype=torch.float64), torch.tensor([6, 4])
    out = attn(states, lengths=lengths)
    theta = torch.tanh(attn.score(torch.tanh(attn.parent_proj(states)[:, :, None] + attn.child_proj(states)[:, None])).squeeze(-1))
    crf = ProjectiveDependencyCRF(theta, lengths - 1, single_root)
    assert torch.allclose(out.attention, crf.marginals)
    assert out.distribution.single_root == single_root
    heads = out.distribution.decode()
    assert heads.shape == (2, 5) and torch.equal(heads, crf.decode())
    if single_root:
        assert ((heads == 0) & (torch.arange(5) < (lengths - 1)[:, None])).sum(-1).tolist() == [1, 1]


def test_syntactic_simple_is_a_softmax_over_parents():
    attn = make(SyntacticAttention, 4, 5, False, dtype=torch.float64)
    states = torch.randn(1, 5, 4, dtype=torch.float64)
    out = attn(states)
    theta = attn.arc_scores(states)[0]
    for j in range(1, 5):
        others = [i for i in range(5) if i != j]
        assert torch.allclose(out.attention[0, others, j], torch.softmax(theta[others, j], 0))


@pytest.mark.parametrize("structured", [True, False], ids=["structured", "simple"])
def test_syntactic_padded_batch_equals_one_by_one(structured):
    attn = make(SyntacticAttention, 4, 5, structured, dtype=torch.float64)
    states, values = torch.randn(3, 6, 4, dtype=torch.float64), torch.randn(3, 6, 2, dtype=torch.float64)
    lengths = torch.tensor([6, 3, 2])
    states[1, 3:], values[1, 3:] = 1e3, 1e3  # padding: never read
    out = attn(states, values, lengths)
    for b, n in enumerate(lengths.tolist()):
        alone = attn(states[b:b + 1, :n], values[b:b + 1, :n])
        assert torch.allclose(out.attention[b, :n, :n], alone.attention[0])
        assert (out.attention[b, n:] == 0).all() and (out.attention[b, :, n:] == 0).all()
        assert torch.allclose(out.context[b, :n], alone.context[0])
        assert (out.context[b, n:] == 0).all()


@pytest.mark.parametrize("structured", [True, False], ids=["structured", "simple"])
def test_syntactic_attention_gradcheck(structured):
    attn = make(SyntacticAttention, 3, 4, structured, dtype=torch.float64)
    states = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    values = torch.randn(2, 4, 2, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([4, 3])
    assert torch.autograd.gradcheck(lambda s, v: attn(s, v, lengths).context, (states, values))
    attn(states, values, lengths).context.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in attn.parameters())


def test_syntactic_attention_rejects_bad_input():
    attn = make(SyntacticAttention, 4, 5)
    states = torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match="states"):
        attn(torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match="states"):
        attn(torch.randn(2, 1, 4))
    with pytest.raises(ValueError, match="values"):
        attn(states, torch.randn(2, 4, 3))
    with pytest.raises(ValueError, match="lengths"):
        attn(states, lengths=torch.tensor([5, 1]))
    with pytest.raises(ValueError, match="lengths"):
        attn(states, lengths=torch.tensor([5, 6]))
    with pytest.raises(ValueError, match="lengths"):
        attn(states, lengths=torch.tensor([5]))


def test_layers_do_not_modify_their_inputs():
    states, values, lengths = torch.randn(2, 5, 4), torch.randn(2, 5, 3), torch.tensor([5, 3])
    copies = states.clone(), values.clone(), lengths.clone()
    make(SyntacticAttention, 4, 5)(states, values, lengths)
    make(SegmentationAttention, 3, 4)(values, states, lengths)
    assert torch.equal(states, copies[0]) and torch.equal(values, copies[1]) and torch.equal(lengths, copies[2])
