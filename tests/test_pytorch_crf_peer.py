"""pytorch-crf 0.7.2's documented behaviours, run side by side with ``structures.nn.CRF`` on the same
parameters and inputs: the constructor, parameters and repr; ``forward``'s log-likelihood under
every reduction, with and without a mask (bool or uint8), batch first or not, and its gradients;
``decode``; and its errors, whose words ours carry (after the argument's name)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from structures.nn import CRF

torchcrf = pytest.importorskip("torchcrf")

T, B, C = 5, 4, 3


def pair(batch_first: bool = False, num_tags: int = C) -> tuple[torch.nn.Module, CRF]:
    """pytorch-crf's layer and ours with the same parameters (float64)."""
    theirs = torchcrf.CRF(num_tags, batch_first=batch_first).double()
    ours = CRF(num_tags, batch_first=batch_first).double()
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def inputs(batch_first: bool = False, seed: int = 0):
    """Emissions, tags and a mask of lengths ``[5, 1, 3, 5]``, laid out for ``batch_first``."""
    g = torch.Generator().manual_seed(seed)
    emissions = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    tags = torch.randint(C, (B, T), generator=g)
    mask = torch.arange(T) < torch.tensor([5, 1, 3, 5])[:, None]
    if batch_first:
        return emissions, tags, mask
    return emissions.transpose(0, 1), tags.transpose(0, 1), mask.transpose(0, 1)


def test_the_constructor_keeps_num_tags_batch_first_and_the_parameters():
    theirs, ours = torchcrf.CRF(7, batch_first=True), CRF(7, batch_first=True)
    assert (ours.num_tags, ours.batch_first) == (theirs.num_tags, theirs.batch_first)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    for p in ours.parameters():  # pytorch-crf initialises uniformly in [-0.1, 0.1]
        assert p.requires_grad and -0.1 <= p.min() and p.max() <= 0.1


def test_the_repr_is_pytorch_crfs():
    assert repr(CRF(10)) == repr(torchcrf.CRF(10)) == "CRF(num_tags=10)"


@pytest.mark.parametrize("batch_first", [False, True], ids=["seq first", "batch first"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean", "token_mean"])
@pytest.mark.parametrize("masking", ["no mask", "bool", "uint8"])
def test_the_log_likelihood_and_its_gradients_are_pytorch_crfs(batch_first, reduction, masking):
    theirs, ours = pair(batch_first)
    emissions, tags, mask = inputs(batch_first)
    mask = {"no mask": None, "bool": mask, "uint8": mask.to(torch.uint8)}[masking]
    got, want = (layer(emissions.requires_grad_(), tags, mask, reduction=reduction) for layer in (ours, theirs))
    assert got.shape == want.shape == ((B,) if reduction == "none" else ())
    assert_close(got, want)
    grads = [torch.autograd.grad(out.sum(), [emissions, *layer.parameters()]) for out, layer in ((got, ours), (want, theirs))]
    for a, b in zip(*grads):
        assert_close(a, b)


@pytest.mark.parametrize("batch_first", [False, True], ids=["seq first", "batch first"])
@pytest.mark.parametrize("masked", [False, True], ids=["no mask", "mask"])
def test_decode_is_pytorch_crfs(batch_first, masked):
    theirs, ours = pair(batch_first)
    emissions, _, mask = inputs(batch_first, seed=1)
    mask = mask if masked else None
    best = ours.decode(emissions, mask)
    assert best == theirs.decode(emissions, mask)
    assert [len(x) for x in best] == ([5, 1, 3, 5] if masked else [T] * B)


def test_batch_first_is_the_same_layer_on_transposed_inputs():
    (_, seq_first), (_, batch_first) = pair(False), pair(True)
    batch_first.load_state_dict(seq_first.state_dict())
    emissions, tags, mask = inputs(False)
    assert_close(batch_first(emissions.transpose(0, 1), tags.transpose(0, 1), mask.transpose(0, 1), reduction="none"),
                 seq_first(emissions, tags, mask, reduction="none"))


BAD = {
    "no tags": (lambda c, e, t, m: type(c)(0), None),
    "negative tags": (lambda c, e, t, m: type(c)(-3), None),
    "emissions of rank 2": (lambda c, e, t, m: c(e[0], t, m), "emissions"),
    "emissions of another num_tags": (lambda c, e, t, m: c(e[..., :2], t, m), "emissions"),
    "tags of another shape": (lambda c, e, t, m: c(e, t[:, :2], m), "tags"),
    "mask of another shape": (lambda c, e, t, m: c(e, t, m[:, :2]), "mask"),
    "first timestep masked": (lambda c, e, t, m: c(e, t, ~m), "mask"),
    "bad reduction": (lambda c, e, t, m: c(e, t, m, reduction="foo"), "reduction"),
    "decode: emissions of rank 2": (lambda c, e, t, m: c.decode(e[0], m), "emissions"),
    "decode: emissions of another num_tags": (lambda c, e, t, m: c.decode(e[..., :2], m), "emissions"),
    "decode: mask of another shape": (lambda c, e, t, m: c.decode(e, m[:, :2]), "mask"),
    "decode: first timestep masked": (lambda c, e, t, m: c.decode(e, ~m), "mask"),
}


@pytest.mark.parametrize("call, argument", BAD.values(), ids=BAD.keys())
def test_an_error_carries_pytorch_crfs_words_after_the_arguments_name(call, argument):
    theirs, ours = pair()
    emissions, tags, mask = inputs()
    with pytest.raises(ValueError) as their_error:
        call(theirs, emissions, tags, mask)
    with pytest.raises(ValueError) as our_error:
        call(ours, emissions, tags, mask)
    assert str(their_error.value) in str(our_error.value)
    assert str(our_error.value).startswith(f"{argument or 'num_tags'}: ")


@pytest.mark.parametrize("call", [lambda c, e, t: c(e, t), lambda c, e, t: c.decode(e)], ids=["forward", "decode"])
def test_an_empty_sequence_is_a_value_error_naming_emissions(call):
    """pytorch-crf fails with an IndexError at seq_len 0; ours says what is wrong, in the layer's terms."""
    _, ours = pair()
    emissions, tags, _ = inputs()
    with pytest.raises(ValueError, match=r"^emissions: expected seq_len >= 1 .*\[seq_len, batch, num_tags=3\]"):
        call(ours, emissions[:0], tags[:0])
