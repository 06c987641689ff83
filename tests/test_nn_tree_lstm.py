"""TreeLSTM (child-sum, Tai et al. 2015) and SubtreeAttention (Liu, Qiu & Huang 2016) over dependency trees."""

import pytest
import torch

from structures.nn import AttentionOutput, StructuredSelfAttention, SubtreeAttention, TreeLSTM
from structures.nn.tree_lstm import tree_levels, tree_roots

D, H = 3, 4

# heads (0 = root, words 1..N); example 1 has 4 words, two of them children of the root
HEADS = torch.tensor([[2, 0, 2, 3, 4], [0, 1, 0, 3, 0]])
LENGTHS = torch.tensor([5, 4])


def children(heads, n, j):
    return [k for k in range(1, n + 1) if int(heads[k - 1]) == j]


def reference_tree_lstm(m: TreeLSTM, x, heads, n):
    """Tai et al.'s equations, node by node, recursively."""
    W, b = m.input.weight, m.input.bias
    Ui, Uo, Uu = m.children_gates.weight.chunk(3, 0)
    Wi, Wo, Wu, Wf = W.chunk(4, 0)
    bi, bo, bu, bf = b.chunk(4, 0)
    Uf = m.child_forget.weight
    states = {}

    def node(j):
        kids = [node(k) for k in children(heads, n, j)]
        xj = x[j - 1]
        h_sum = sum((h for h, _ in kids), torch.zeros(H))
        i = torch.sigmoid(Wi @ xj + Ui @ h_sum + bi)
        o = torch.sigmoid(Wo @ xj + Uo @ h_sum + bo)
        u = torch.tanh(Wu @ xj + Uu @ h_sum + bu)
        c = i * u + sum((torch.sigmoid(Wf @ xj + Uf @ h + bf) * ck for h, ck in kids), torch.zeros(H))
        states[j] = (o * torch.tanh(c), c)
        return states[j]

    for top in children(heads, n, 0):
        node(top)
    return states


def lstm() -> TreeLSTM:
    torch.manual_seed(0)
    return TreeLSTM(D, H)


def test_states_are_the_child_sum_equations():
    m = lstm()
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(1))
    out = m(x, HEADS, LENGTHS)
    assert out.hidden.shape == (2, 5, H) and out.cell.shape == (2, 5, H) and out.root.shape == (2, H)
    for b, n in enumerate(LENGTHS.tolist()):
        ref = reference_tree_lstm(m, x[b], HEADS[b], n)
        for j in range(1, n + 1):
            torch.testing.assert_close(out.hidden[b, j - 1], ref[j][0])
            torch.testing.assert_close(out.cell[b, j - 1], ref[j][1])
    torch.testing.assert_close(out.root[0], out.hidden[0, 1])  # the single root's child: word 2
    torch.testing.assert_close(out.root[1], out.hidden[1, 0] + out.hidden[1, 2])  # two tops, summed


def test_padded_batch_equals_one_by_one_and_padding_is_zero():
    m = lstm()
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(2))
    out = m(x, HEADS, LENGTHS)
    assert (out.hidden[1, 4] == 0).all() and (out.cell[1, 4] == 0).all()
    for b, n in enumerate(LENGTHS.tolist()):
        one = m(x[b : b + 1, :n], HEADS[b : b + 1, :n])
        torch.testing.assert_close(out.hidden[b, :n], one.hidden[0])
        torch.testing.assert_close(out.root[b], one.root[0])


def test_one_step_per_level_of_the_deepest_tree_deepest_first():
    trees = tree_levels(HEADS, LENGTHS)
    # depths: example 0: words 2:1, 1:2, 3:2, 4:3, 5:4; example 1: 1:1, 3:1, 4:2, 2:2
    assert [sorted(level.tolist()) for level in trees.levels] == [[4], [3], [0, 2, 6, 8], [1, 5, 7]]
    assert trees.roots.tolist() == [[False, True, False, False, False], [True, False, True, False, False]]
    values = torch.arange(10.0).view(2, 5, 1)
    assert tree_roots(values, trees).flatten().tolist() == [1.0, 5.0 + 7.0]


def test_decoded_trees_of_the_structured_self_attention_can_be_encoded():
    torch.manual_seed(0)
    x = torch.randn(3, 6, D)
    lengths = torch.tensor([6, 5, 2])
    heads = StructuredSelfAttention(D)(x, lengths=lengths).distribution.decode()
    out = lstm()(x, heads, lengths)
    assert torch.isfinite(out.hidden).all() and (out.hidden[2, 2:] == 0).all()


def test_gradcheck():
    m = lstm().double()
    x = torch.randn(2, 5, D, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: m(x, HEADS, LENGTHS).hidden, (x,))


@pytest.mark.parametrize("name,heads,inputs", [
    ("inputs", HEADS, torch.zeros(2, 5)),
    ("inputs", HEADS, torch.zeros(2, 5, D + 1)),
    ("heads", HEADS[:, :4], torch.zeros(2, 5, D)),
    ("heads", HEADS.float(), torch.zeros(2, 5, D)),
    ("heads", torch.tensor([[2, 1, 0, 3, 4], [0, 1, 0, 3, 0]]), torch.zeros(2, 5, D)),  # a cycle 1 <-> 2
    ("heads", torch.tensor([[2, 0, 2, 3, 6], [0, 1, 0, 3, 0]]), torch.zeros(2, 5, D)),  # a head past the length
    ("heads", torch.tensor([[2, 0, 2, 3, 4], [0, 1, 0, 5, 0]]), torch.zeros(2, 5, D)),  # word 5 of example 1 is padding
])
def test_bad_input_raises_value_error_naming_the_argument(name, heads, inputs):
    with pytest.raises(ValueError, match=name):
        lstm()(inputs, heads, LENGTHS)
    with pytest.raises(ValueError, match="lengths"):
        lstm()(torch.zeros(2, 5, D), HEADS, torch.tensor([5, 6]))


# ---------------------------------------------------------------------------------- SubtreeAttention

X = 5  # memory (premise) words


def attention_layer() -> SubtreeAttention:
    torch.manual_seed(0)
    return SubtreeAttention(H, D)


def reference_subtree_attention(m: SubtreeAttention, memory, query, heads, n, mem_n):
    """Eqs. 25, 27-29, node by node, recursively."""
    r = {}

    def node(j):
        g = m.children_proj.weight @ sum((node(k) for k in children(heads, n, j)), torch.zeros(H))
        e = torch.stack([m.score.weight[0] @ torch.tanh(m.query_proj.weight @ query[j - 1] + m.memory_proj.weight @ memory[i] + g)
                         for i in range(mem_n)])
        alpha = torch.softmax(e, 0)
        r[j] = (alpha, sum(alpha[i] * memory[i] for i in range(mem_n)) + torch.tanh(g))
        return r[j][1]

    for top in children(heads, n, 0):
        node(top)
    return r


def test_subtree_attention_is_the_papers_recursion():
    m = attention_layer()
    g = torch.Generator().manual_seed(3)
    memory, query = torch.randn(2, X, H, generator=g), torch.randn(2, 5, D, generator=g)
    mem_lengths = torch.tensor([5, 3])
    out = m(memory, query, HEADS, mem_lengths, LENGTHS)
    assert isinstance(out, AttentionOutput) and out.distribution is None
    assert out.context.shape == (2, 5, H) and out.attention.shape == (2, 5, X)
    for b, n in enumerate(LENGTHS.tolist()):
        ref = reference_subtree_attention(m, memory[b], query[b], HEADS[b], n, int(mem_lengths[b]))
        for j in range(1, n + 1):
            alpha, r = ref[j]
            torch.testing.assert_close(out.attention[b, j - 1, : len(alpha)], alpha)
            torch.testing.assert_close(out.context[b, j - 1], r)
    assert (out.attention[1, :, 3:] == 0).all()  # padded memory words get no weight
    assert (out.attention[1, 4] == 0).all() and (out.context[1, 4] == 0).all()  # a padded query word


def test_subtree_attention_padded_batch_equals_one_by_one():
    m = attention_layer()
    g = torch.Generator().manual_seed(4)
    memory, query = torch.randn(2, X, H, generator=g), torch.randn(2, 5, D, generator=g)
    mem_lengths = torch.tensor([4, 2])
    out = m(memory, query, HEADS, mem_lengths, LENGTHS)
    for b, n in enumerate(LENGTHS.tolist()):
        k = int(mem_lengths[b])
        one = m(memory[b : b + 1, :k], query[b : b + 1, :n], HEADS[b : b + 1, :n])
        torch.testing.assert_close(out.context[b, :n], one.context[0])
        torch.testing.assert_close(out.attention[b, :n, :k], one.attention[0])


def test_sat_lstm_pipeline_gradcheck():
    """Both sentences through the Tree-LSTM, then the attention over the premise's subtrees."""
    torch.manual_seed(0)
    encoder, attend = TreeLSTM(D, H).double(), SubtreeAttention(H, H).double()
    premise = torch.randn(2, 5, D, dtype=torch.float64, requires_grad=True)
    hypothesis = torch.randn(2, 5, D, dtype=torch.float64, requires_grad=True)
    premise_heads = torch.tensor([[0, 1, 1, 3, 3], [2, 0, 2, 0, 0]])

    def pair(p, h):
        hx = encoder(p, premise_heads, LENGTHS).hidden
        hy = encoder(h, HEADS, LENGTHS).hidden
        return attend(hx, hy, HEADS, LENGTHS, LENGTHS).context

    assert torch.autograd.gradcheck(pair, (premise, hypothesis))


@pytest.mark.parametrize("name,args", [
    ("memory", (torch.zeros(2, X), torch.zeros(2, 5, D), HEADS)),
    ("query", (torch.zeros(2, X, H), torch.zeros(2, 5, D + 1), HEADS)),
    ("query", (torch.zeros(2, X, H), torch.zeros(1, 5, D), HEADS)),
    ("heads", (torch.zeros(2, X, H), torch.zeros(2, 5, D), HEADS[:, :3])),
    ("heads", (torch.zeros(2, X, H), torch.zeros(2, 5, D), torch.tensor([[2, 1, 0, 3, 4], [0, 1, 0, 3, 0]]))),
])
def test_subtree_attention_bad_input(name, args):
    with pytest.raises(ValueError, match=name):
        attention_layer()(*args)
    with pytest.raises(ValueError, match="query_lengths"):
        attention_layer()(torch.zeros(2, X, H), torch.zeros(2, 5, D), HEADS, None, torch.tensor([5, 0]))
