"""GatedSyntacticContext: shared attention over syntactic annotations, gated (Bisk & Tran 2018, §4.2)."""

import pytest
import torch

from structures.nn import GatedSyntacticContext, SoftmaxAttention, StructuredSelfAttention

H, A = 4, 3


def layer(shared=True) -> GatedSyntacticContext:
    torch.manual_seed(0)
    return GatedSyntacticContext(H, A, shared=shared)


def inputs(B=2, T=3, N=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    state = torch.randn(B, T, H, generator=g)
    annotations = torch.randn(B, N, A, generator=g)
    weights = torch.softmax(torch.randn(B, T, N, generator=g), -1)
    return state, annotations, weights


def test_shared_weights_over_the_annotations_gated_by_the_state():
    """d̂_t = (M α_tᵀ) ⊙ σ(W_g h_t), eqs. 10-11."""
    state, M, alpha = inputs()
    m = layer()
    out = m(state, M, alpha)
    assert out.context.shape == (2, 3, A) and out.attention.shape == (2, 3, 5) and out.distribution is None
    for b in range(2):
        for t in range(3):
            d = sum(alpha[b, t, i] * M[b, i] for i in range(5))
            torch.testing.assert_close(out.context[b, t], d * torch.sigmoid(m.gate.weight @ state[b, t]))
    torch.testing.assert_close(out.attention, alpha)


def test_separate_attention_is_a_softmax_over_the_annotations():
    """γ_t = softmax(h_tᵀ W_m M), d_t = M γ_tᵀ, eqs. 13-14."""
    state, M, _ = inputs()
    m = layer(shared=False)
    out = m(state, M)
    gamma = torch.softmax(state @ m.bilinear.weight @ M.transpose(1, 2), -1)
    torch.testing.assert_close(out.attention, gamma)
    torch.testing.assert_close(out.context, (gamma @ M) * torch.sigmoid(state @ m.gate.weight.T))


@pytest.mark.parametrize("shared", [True, False])
def test_one_step_state(shared):
    state, M, alpha = inputs()
    m = layer(shared)
    many = m(state, M, alpha if shared else None)
    one = m(state[:, 1], M, alpha[:, 1] if shared else None)
    assert one.context.shape == (2, A) and one.attention.shape == (2, 5)
    torch.testing.assert_close(one.context, many.context[:, 1])


@pytest.mark.parametrize("shared", [True, False])
def test_padded_words_get_no_weight_and_do_not_matter(shared):
    state, M, alpha = inputs()
    lengths = torch.tensor([5, 3])
    m = layer(shared)
    out = m(state, M, alpha if shared else None, lengths)
    assert (out.attention[1, :, 3:] == 0).all()
    noisy = M.clone()
    noisy[1, 3:] = 50.0
    torch.testing.assert_close(m(state, noisy, alpha if shared else None, lengths).context, out.context)
    if not shared:
        one = m(state[1:], M[1:, :3])
        torch.testing.assert_close(out.context[1], one.context[0])


def test_with_the_structured_self_attention_and_a_decoder_attention():
    """The pipeline of Bisk & Tran: M = parent contexts, α = the decoder's softmax attention over S."""
    torch.manual_seed(0)
    S = torch.randn(2, 6, 4)
    lengths = torch.tensor([6, 4])
    M = StructuredSelfAttention(4, A, output="parent")(S, torch.randn(2, 6, A), lengths).context
    h = torch.randn(2, 3, H, requires_grad=True)
    alpha = SoftmaxAttention(4, H)(S, h, lengths).attention
    out = layer()(h, M, alpha, lengths)
    out.context.sum().backward()
    assert out.context.shape == (2, 3, A) and torch.isfinite(h.grad).all()


def test_gradcheck():
    m = layer().double()
    state, M, alpha = (x.double().requires_grad_() for x in inputs(T=2, N=3))
    assert torch.autograd.gradcheck(lambda s, a, w: m(s, a, w, torch.tensor([3, 2])).context, (state, M, alpha))


@pytest.mark.parametrize("name,make", [
    ("annotations", lambda s, M, a: (s, M[0], a, None)),
    ("annotations", lambda s, M, a: (s, M[..., :-1], a, None)),
    ("state", lambda s, M, a: (s[..., :-1], M, a, None)),
    ("state", lambda s, M, a: (s[:1], M, a, None)),
    ("weights", lambda s, M, a: (s, M, None, None)),
    ("weights", lambda s, M, a: (s, M, a[..., :-1], None)),
    ("lengths", lambda s, M, a: (s, M, a, torch.tensor([5, 6]))),
])
def test_bad_input_raises_value_error_naming_the_argument(name, make):
    with pytest.raises(ValueError, match=name):
        layer()(*make(*inputs()))


def test_separate_attention_refuses_given_weights():
    state, M, alpha = inputs()
    with pytest.raises(ValueError, match="weights"):
        layer(shared=False)(state, M, alpha)
