"""structures.nn.CRF: pytorch-crf's interface, checked against enumeration and against pytorch-crf
itself on the same parameters (where it is installed)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.testing import assert_close

from structures.nn import CRF

T, B, C = 4, 3, 3


def problem(batch_first: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    crf = CRF(C, batch_first=batch_first).double()
    with torch.no_grad():
        for p in crf.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    emissions = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    tags = torch.randint(C, (B, T), generator=g)
    lengths = torch.tensor([T, 1, 3])
    mask = torch.arange(T) < lengths[:, None]
    if not batch_first:
        emissions, tags, mask = emissions.transpose(0, 1), tags.transpose(0, 1), mask.transpose(0, 1)
    return crf, emissions, tags, mask, lengths


def score(crf: CRF, em: torch.Tensor, tags: list[int]) -> torch.Tensor:
    """One example's score by the formula in the docstring (``em [n, C]``)."""
    s = crf.start_transitions[tags[0]] + crf.end_transitions[tags[-1]]
    s = s + sum(em[i, t] for i, t in enumerate(tags))
    return s + sum(crf.transitions[a, b] for a, b in zip(tags, tags[1:]))


@pytest.mark.parametrize("batch_first", [False, True])
def test_log_likelihood_and_decode_equal_enumeration(batch_first):
    crf, emissions, tags, mask, lengths = problem(batch_first)
    em = emissions if batch_first else emissions.transpose(0, 1)
    tg = tags if batch_first else tags.transpose(0, 1)
    got = crf(emissions, tags, mask, reduction="none")
    best = crf.decode(emissions, mask)
    for b, n in enumerate(lengths.tolist()):
        scores = {seq: score(crf, em[b, :n], list(seq)) for seq in itertools.product(range(C), repeat=n)}
        log_z = torch.logsumexp(torch.stack(list(scores.values())), 0)
        assert_close(got[b], scores[tuple(tg[b, :n].tolist())] - log_z)
        assert best[b] == list(max(scores, key=lambda s: scores[s]))
    assert [len(x) for x in best] == lengths.tolist()


def test_reductions():
    crf, emissions, tags, mask, lengths = problem(False)
    llh = crf(emissions, tags, mask, reduction="none")
    assert_close(crf(emissions, tags, mask), llh.sum())
    assert_close(crf(emissions, tags, mask, reduction="mean"), llh.mean())
    assert_close(crf(emissions, tags, mask, reduction="token_mean"), llh.sum() / lengths.sum())
    assert_close(crf(emissions, tags), crf(emissions, tags, torch.ones_like(mask)))


@pytest.mark.parametrize("batch_first", [False, True])
def test_equals_pytorch_crf_on_the_same_parameters(batch_first):
    torchcrf = pytest.importorskip("torchcrf")
    ours, emissions, tags, mask, _ = problem(batch_first)
    peer = torchcrf.CRF(C, batch_first=batch_first).double()
    peer.load_state_dict(ours.state_dict())
    for reduction in ("none", "sum", "mean", "token_mean"):
        assert_close(ours(emissions, tags, mask, reduction=reduction), peer(emissions, tags, mask, reduction=reduction))
    assert ours.decode(emissions, mask) == peer.decode(emissions, mask)
    (g_ours,) = torch.autograd.grad(ours(emissions.requires_grad_(), tags, mask), ours.transitions)
    (g_peer,) = torch.autograd.grad(peer(emissions, tags, mask), peer.transitions)
    assert_close(g_ours, g_peer)


def test_gradients_reach_every_parameter_and_the_emissions():
    crf, emissions, tags, mask, _ = problem(True)
    emissions.requires_grad_()
    crf(emissions, tags, mask).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in crf.parameters())
    assert emissions.grad.abs().sum() > 0


def test_padding_is_ignored_whatever_it_holds():
    crf, emissions, tags, mask, _ = problem(True)
    junk_em = emissions.masked_fill(~mask.unsqueeze(-1), 1e4)
    junk_tags = tags.masked_fill(~mask, 7)
    assert_close(crf(junk_em, junk_tags, mask, reduction="none"), crf(emissions, tags, mask, reduction="none"))
    assert crf.decode(junk_em, mask) == crf.decode(emissions, mask)


@pytest.mark.parametrize("call, match", [
    (lambda c, e, t, m: c(e[..., :2], t, m), "emissions: expected last dimension of emissions is 3, got 2"),
    (lambda c, e, t, m: c(e[0], t, m), "emissions: emissions must have dimension of 3"),
    (lambda c, e, t, m: c(e[:0], t[:0], m[:0]), r"emissions: expected seq_len >= 1"),
    (lambda c, e, t, m: c(e, t[:2], m), "tags: the first two dimensions of emissions and tags must match"),
    (lambda c, e, t, m: c(e, t.float(), m), "tags: expected an integer"),
    (lambda c, e, t, m: c(e, t + 5, m), "tags: expected tags in"),
    (lambda c, e, t, m: c(e, t, m.float()), "mask: expected a bool"),
    (lambda c, e, t, m: c(e, t, m[:2]), "mask: the first two dimensions of emissions and mask must match"),
    (lambda c, e, t, m: c(e, t, ~m), "mask: mask of the first timestep must all be on"),
    (lambda c, e, t, m: c(e, t, m, reduction="avg"), "reduction: invalid reduction: avg"),
])
def test_bad_input_raises_naming_the_argument(call, match):
    crf, emissions, tags, mask, _ = problem(False)
    with pytest.raises(ValueError, match=match):
        call(crf, emissions, tags, mask)


def test_a_gap_in_the_mask_raises():
    crf, emissions, tags, mask, _ = problem(True)
    mask = mask.clone()
    mask[0, 2] = False
    with pytest.raises(ValueError, match="prefix"):
        crf(emissions, tags, mask)
