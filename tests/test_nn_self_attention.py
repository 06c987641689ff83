"""StructuredSelfAttention: matrix-tree self-attention (Liu & Lapata 2018 §3.2; Bisk & Tran 2018 §4.1, §4.3)."""

import pytest
import torch

from brute import NONPROJECTIVE_SINGLE_ROOT
from structures import NonProjectiveDependencyCRF, ProjectiveDependencyCRF
from structures.spanning.decode.arborescence import is_tree
from structures.nn import AttentionOutput, StructuredSelfAttention

D, V = 5, 3


def layer(**kwargs) -> StructuredSelfAttention:
    torch.manual_seed(0)
    return StructuredSelfAttention(D, V, **kwargs)


def inputs(B=3, N=5, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, N, D, generator=g, dtype=dtype), torch.randn(B, N, V, generator=g, dtype=dtype)


@pytest.mark.parametrize("scores", ["bilinear", "dot"])
@pytest.mark.parametrize("output,width", [("parent", V), ("parent_children", 2 * V), ("update", V)])
def test_shapes(scores, output, width):
    states, values = inputs()
    out = layer(scores=scores, output=output)(states, values, torch.tensor([5, 3, 1]))
    assert isinstance(out, AttentionOutput)
    assert out.context.shape == (3, 5, width)
    assert out.attention.shape == (3, 6, 6)
    assert isinstance(out.distribution, NonProjectiveDependencyCRF)
    assert out.distribution.decode().shape == (3, 5)


def test_values_default_to_states():
    states, _ = inputs()
    m = StructuredSelfAttention(D)
    assert m(states).context.shape == (3, 5, 2 * D)


@pytest.mark.parametrize("scores", ["bilinear", "dot"])
def test_attention_is_the_single_root_structures_marginals(scores):
    states, values = inputs()
    lengths = torch.tensor([5, 4, 2])
    m = layer(scores=scores)
    out = m(states, values, lengths)
    crf = NonProjectiveDependencyCRF(m.arc_scores(states), lengths, single_root=True)
    torch.testing.assert_close(out.attention, crf.marginals)
    # and those of every single-root tree enumerated (tests/brute.py), scored by the same arc scores
    enums = NONPROJECTIVE_SINGLE_ROOT.enumerate(m.arc_scores(states).detach().double(), lengths)
    torch.testing.assert_close(out.attention.double(), torch.stack([e.marginals for e in enums]), atol=1e-5, rtol=1e-4)
    # every real word has one head in expectation, and the root exactly one child
    torch.testing.assert_close(out.attention[:, :, 1:].sum(1), (torch.arange(5) < lengths[:, None]).float())
    torch.testing.assert_close(out.attention[:, 0].sum(1), torch.ones(3))


@pytest.mark.parametrize("single_root", [True, False])
def test_projective_structure_attends_over_projective_trees(single_root):
    """``structure="projective"`` (Kim et al. 2017's syntactic attention): the marginals, the
    contexts and the decode are those of the projective CRF over the same arc scores."""
    states, values = inputs()
    lengths = torch.tensor([5, 4, 2])
    m = layer(structure="projective", single_root=single_root)
    out = m(states, values, lengths)
    crf = ProjectiveDependencyCRF(m.arc_scores(states), lengths, single_root=single_root)
    assert isinstance(out.distribution, ProjectiveDependencyCRF)
    torch.testing.assert_close(out.attention, crf.marginals)
    torch.testing.assert_close(out.context[..., :V], out.attention[:, :, 1:].transpose(-1, -2)
                               @ torch.cat([m.root_embedding.expand(3, 1, V), values * (torch.arange(5) < lengths[:, None]).unsqueeze(-1)], 1))
    assert torch.equal(out.distribution.decode(), crf.decode())
    nonprojective = layer(single_root=single_root)(states, values, lengths)
    assert not torch.allclose(out.attention, nonprojective.attention)  # five words admit non-projective trees


def test_multi_root_option():
    states, values = inputs()
    out = layer(single_root=False)(states, values)
    assert not out.distribution.single_root
    assert (out.attention[:, 0].sum(1) > 1.0 + 1e-3).any()  # the root takes several children in expectation


def test_dot_scores_are_scaled_query_key_products_with_root_scores_on_the_diagonal():
    states, _ = inputs()
    m = layer(scores="dot")
    phi = m.query(states) @ m.key(states).transpose(-1, -2) / D**0.5
    theta = m.arc_scores(states)
    torch.testing.assert_close(theta[:, 0, 1:], phi.diagonal(dim1=-2, dim2=-1))
    off = ~torch.eye(5, dtype=torch.bool)
    torch.testing.assert_close(theta[:, 1:, 1:][:, off], phi[:, off])


def test_contexts_are_the_papers_equations():
    """p_j = Σ_i a_ij e_i + a_j^r e_root, c_i = Σ_k a_ik e_k, r_i = tanh(W_r [e_i; p_i; c_i])."""
    states, values = inputs(B=2, N=4)
    m = layer(output="update")
    out = m(states, values)
    a = out.attention
    for b in range(2):
        for j in range(4):
            p = a[b, 0, j + 1] * m.root_embedding + sum(a[b, i + 1, j + 1] * values[b, i] for i in range(4))
            c = sum(a[b, j + 1, k + 1] * values[b, k] for k in range(4))
            r = torch.tanh(m.update.weight @ torch.cat([values[b, j], p, c]))
            torch.testing.assert_close(out.context[b, j], r)
    both = StructuredSelfAttention(D, V)
    both.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("update")})
    pc = both(states, values).context
    torch.testing.assert_close(pc[..., :V], a[:, :, 1:].transpose(1, 2) @ torch.cat([m.root_embedding.expand(2, 1, V), values], 1))
    torch.testing.assert_close(pc[..., V:], a[:, 1:, 1:] @ values)


@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize("output", ["parent_children", "update"])
def test_padded_batch_equals_one_by_one(hard, output):
    states, values = inputs(B=3, N=6)
    lengths = torch.tensor([6, 4, 2])
    m = layer(output=output, hard=hard)
    out = m(states, values, lengths)
    for b, n in enumerate(lengths.tolist()):
        one = m(states[b : b + 1, :n], values[b : b + 1, :n])
        torch.testing.assert_close(out.context[b, :n], one.context[0], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(out.attention[b, : n + 1, : n + 1], one.attention[0], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize("output", ["parent_children", "update"])
def test_padded_words_neither_give_nor_receive_attention(hard, output):
    states, values = inputs(B=2, N=5)
    lengths = torch.tensor([5, 3])
    m = layer(output=output, hard=hard)
    out = m(states, values, lengths)
    assert (out.attention[1, 4:] == 0).all() and (out.attention[1, :, 4:] == 0).all()
    assert (out.context[1, 3:] == 0).all()
    # what sits at the padded positions does not matter
    noisy_states, noisy_values = states.clone(), values.clone()
    noisy_states[1, 3:] = 100.0
    noisy_values[1, 3:] = -7.0
    again = m(noisy_states, noisy_values, lengths)
    torch.testing.assert_close(again.context, out.context)


def test_hard_attention_is_a_single_root_spanning_tree():
    states, values = inputs(B=4, N=7, seed=3)
    lengths = torch.tensor([7, 6, 3, 1])
    out = layer(hard=True, scores="dot")(states, values, lengths)
    a = out.attention
    assert set(a.unique().tolist()) <= {0.0, 1.0}
    heads = out.distribution.heads(a)
    assert is_tree(heads, lengths, single_root=True).all()
    torch.testing.assert_close(heads, out.distribution.decode())
    torch.testing.assert_close(a, out.distribution.argmax)


def test_hard_tree_is_not_the_per_word_argmax_when_that_has_a_cycle():
    """Bisk & Tran's eq. 15 (each word's most likely head) can be cyclic; the hard mode decodes a tree."""
    m = layer(hard=True)
    theta = torch.zeros(1, 6, 6)
    theta[0, 1, 2] = theta[0, 2, 1] = 3.0  # words 1 and 2 prefer each other
    theta[0, 0, :] = -2.0
    theta[0, 3:, 1:3] = 1.5
    m.arc_scores = lambda states: theta
    out = m(torch.zeros(1, 5, D), torch.zeros(1, 5, V))
    per_word = out.distribution.marginals[0, :, 1:].argmax(0)
    assert not is_tree(per_word[None], single_root=True).all()
    assert is_tree(out.distribution.heads(out.attention), single_root=True).all()


@pytest.mark.parametrize("scores", ["bilinear", "dot"])
def test_hard_attention_backpropagates_the_marginals_gradient(scores):
    states, values = inputs(B=2, N=5)
    lengths = torch.tensor([5, 4])
    upstream = torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(7))
    grads = {}
    for hard in (False, True):
        m = layer(scores=scores, hard=hard)
        x = states.clone().requires_grad_()
        (m(x, values, lengths).attention * upstream).sum().backward()
        grads[hard] = (x.grad, [p.grad for p in m.parameters() if p.grad is not None])
    torch.testing.assert_close(grads[True][0], grads[False][0])
    for hard_grad, soft_grad in zip(grads[True][1], grads[False][1]):
        torch.testing.assert_close(hard_grad, soft_grad)


@pytest.mark.parametrize("scores,output", [("bilinear", "parent_children"), ("dot", "update")])
def test_gradcheck(scores, output):
    m = layer(scores=scores, output=output).double()
    states, values = inputs(B=2, N=3, dtype=torch.float64)
    lengths = torch.tensor([3, 2])
    states.requires_grad_()
    values.requires_grad_()
    assert torch.autograd.gradcheck(lambda s, v: m(s, v, lengths).context, (states, values))


@pytest.mark.parametrize("make", [
    lambda s, v: (s[0], v, None),  # states of rank 2
    lambda s, v: (s[..., :-1], v, None),  # wrong state width
    lambda s, v: (s[:, :0], v[:, :0], None),  # no words
    lambda s, v: (s, v[:, :-1], None),  # values of another length
    lambda s, v: (s, v[..., :-1], None),  # wrong value width
    lambda s, v: (s, v, torch.tensor([5, 6, 1])),  # lengths past N
    lambda s, v: (s, v, torch.tensor([5, 0, 1])),  # an empty sequence
    lambda s, v: (s, v, torch.tensor([5.0, 1.0, 1.0])),  # float lengths
    lambda s, v: (s, v, torch.tensor([5, 1])),  # lengths of another batch
], ids=["states-rank", "states-width", "no-words", "values-length", "values-width", "lengths-high",
        "lengths-zero", "lengths-float", "lengths-batch"])
def test_bad_input_raises_value_error_naming_the_argument(make):
    states, values = inputs()
    s, v, lengths = make(states, values)
    name = "lengths" if lengths is not None else ("values" if s.shape[:2] == states.shape[:2] and s.shape[-1] == D else "states")
    with pytest.raises(ValueError, match=name):
        layer()(s, v, lengths)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="scores"):
        StructuredSelfAttention(D, scores="mlp")
    with pytest.raises(ValueError, match="output"):
        StructuredSelfAttention(D, output="children")
    with pytest.raises(ValueError, match="structure"):
        StructuredSelfAttention(D, structure="constituency")


def test_inputs_are_not_mutated():
    states, values = inputs()
    before = states.clone(), values.clone()
    layer(hard=True)(states, values, torch.tensor([5, 3, 2]))
    torch.testing.assert_close((states, values), before)
