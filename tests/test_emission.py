"""EmissionCRF: the pytorch-crf parameterization, scored by enumeration with its shared scores."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.testing import assert_close

from brute import random_lengths
from structures import EmissionCRF, LinearChainCRF, validation


def crf_and_oracle(N: int, C: int, seed: int, forbid_transition: bool = False):
    g = torch.Generator().manual_seed(seed)
    em = torch.randn(3, N, C, generator=g, dtype=torch.float64)
    tr, st, en = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((C, C), (C,), (C,)))
    if forbid_transition:
        tr[0, 0] = float("-inf")
    lengths = random_lengths(3, N, g)

    def scores(b: int):
        n = int(lengths[b])
        seqs = list(itertools.product(range(C), repeat=n))
        s = [st[t[0]] + en[t[-1]] + sum(em[b, i, t[i]] for i in range(n)) + sum(tr[t[i], t[i + 1]] for i in range(n - 1))
             for t in seqs]
        return seqs, torch.stack(s)

    return EmissionCRF(em, tr, st, en, lengths), scores, lengths, (em, tr, st, en)


@pytest.mark.parametrize("N", [1, 2, 4])
@pytest.mark.parametrize("C", [1, 3])
@pytest.mark.parametrize("forbid", [False, True])
def test_every_query_matches_enumeration(N, C, forbid):
    crf, scores, lengths, _ = crf_and_oracle(N, C, seed=10 * N + C, forbid_transition=forbid and C > 1)
    q, _, _, _ = crf_and_oracle(N, C, seed=99)
    q = EmissionCRF(q.log_potentials, *[q._shared[k][0] for k in ("trans", "start", "end")], lengths)
    for b in range(3):
        seqs, s = scores(b)
        n = int(lengths[b])
        lz = torch.logsumexp(s, 0)
        p = (s - lz).exp()
        assert_close(crf.log_partition[b], lz)
        mu = torch.zeros(N, C, dtype=torch.float64)
        for t, pt in zip(seqs, p):
            mu[range(n), t] += pt
        assert_close(crf.marginals[b], mu)
        assert crf.decode()[b, :n].tolist() == list(seqs[int(s.argmax())])
        assert crf.count[b].item() == int(torch.isfinite(s).sum())
        logp = torch.where(p > 0, s - lz, 0.0)
        assert_close(crf.entropy()[b], -(p * logp).sum())
        _, sq = scores_of(q, b, seqs)
        lq = sq - torch.logsumexp(sq, 0)
        assert_close(crf.kl(q)[b], (p * (logp - lq)).where(p > 0, 0.0).sum())
    tags = crf.decode()
    assert_close(crf.log_prob(tags), crf.log_prob(crf.argmax))


def scores_of(crf: EmissionCRF, b: int, seqs):
    """Scores of tag sequences by the distribution's own log_prob + log Z (for the KL's q)."""
    N = crf.log_potentials.shape[1]
    tags = torch.tensor([list(t) + [0] * (N - len(t)) for t in seqs])
    batch = tags.unsqueeze(1).expand(-1, crf.log_potentials.shape[0], -1)
    return seqs, crf.score(batch)[:, b]


def test_agrees_with_the_edge_parameterization_of_linear_chain():
    crf, _, lengths, (em, tr, st, en) = crf_and_oracle(5, 3, seed=7)
    edge = LinearChainCRF.from_emissions(em, tr, st, en, lengths)
    assert_close(crf.log_partition, edge.log_partition)
    assert_close(crf.marginals, edge.tag_marginals)
    assert torch.equal(crf.decode(), edge.decode())


def test_gradients_reach_the_shared_transitions():
    crf, _, lengths, (em, tr, st, en) = crf_and_oracle(4, 3, seed=8)
    for i, x in enumerate((tr, st, en)):
        args = [tr, st, en]
        args[i] = x.clone().requires_grad_()
        assert torch.autograd.gradcheck(lambda a: EmissionCRF(em, *args[:i], a, *args[i + 1:], lengths).log_partition, (args[i],))
        assert torch.autograd.gradcheck(lambda a: EmissionCRF(em, *args[:i], a, *args[i + 1:], lengths).entropy(), (args[i],))


def test_a_loss_on_the_marginals_with_learned_transitions_takes_the_tapes_hessian_vector_product(monkeypatch):
    """Segmentation attention's training step: the shared scores enter expanded to the batch, so the
    tape differentiates the marginals per example (pairs, the C scan's pair loops) instead of
    re-running the program under autograd; both give the same gradients, with forbidden
    transitions and lengths."""
    from semiring.language import autodiff

    crf, _, lengths, (em, tr, st, en) = crf_and_oracle(6, 3, seed=9, forbid_transition=True)
    v = torch.randn(em.shape, generator=torch.Generator().manual_seed(10), dtype=em.dtype)

    def gradients():
        leaves = [x.clone().requires_grad_() for x in (em, tr, st)]
        marginals = EmissionCRF(*leaves, en, lengths).marginals
        return torch.autograd.grad((marginals * v).sum(), leaves)

    tape = gradients()
    monkeypatch.setattr(autodiff.TapeGradient, "applies", staticmethod(lambda run, elements: False))
    rerun = gradients()
    for a, b in zip(tape, rerun):
        assert_close(a, b, rtol=1e-10, atol=1e-12)
    monkeypatch.undo()
    calls, backward = [], autodiff.TapeGradient.backward
    monkeypatch.setattr(autodiff.TapeGradient, "backward", staticmethod(lambda ctx, *V: calls.append(1) or backward(ctx, *V)))
    gradients()
    assert calls == [1]


@pytest.mark.parametrize("argument, kwargs", [
    ("emissions", dict(emissions=torch.zeros(2, 3))),
    ("transitions", dict(transitions=torch.zeros(3, 4))),
    ("start", dict(start=torch.zeros(4))),
    ("end", dict(end=torch.zeros(2, 3))),
    ("lengths", dict(lengths=torch.tensor([0, 1]))),
])
def test_bad_input_names_the_argument(argument, kwargs):
    inputs = dict(emissions=torch.zeros(2, 4, 3), transitions=torch.zeros(3, 3), start=None, end=None, lengths=None)
    with pytest.raises(ValueError, match=argument):
        EmissionCRF(**{**inputs, **kwargs})


def test_mixed_dtypes_are_computed_in_the_promoted_type():
    """float32 emissions with float64 transitions: computed (and returned) in float64, as torch's
    arithmetic would (it was an overflow error)."""
    g = torch.Generator().manual_seed(9)
    em = torch.randn(2, 4, 3, generator=g)
    tr = torch.randn(3, 3, generator=g, dtype=torch.float64)
    mixed, double = EmissionCRF(em, tr), EmissionCRF(em.double(), tr)
    assert mixed.log_partition.dtype == torch.float64
    assert_close(mixed.log_partition, double.log_partition)
    assert_close(mixed.marginals, double.marginals)
    assert torch.equal(mixed.decode(), double.decode())


@pytest.mark.parametrize("build", [EmissionCRF, LinearChainCRF.from_emissions], ids=["EmissionCRF", "from_emissions"])
@pytest.mark.parametrize("bad", ["emissions", "transitions", "start", "end"])
@pytest.mark.parametrize("value, message", [(float("nan"), "contains NaN"), (float("inf"), r"contains \+inf")])
def test_a_bad_value_in_any_of_the_four_tensors_is_named(build, bad, value, message):
    given = dict(emissions=torch.randn(2, 4, 3), transitions=torch.randn(3, 3), start=torch.randn(3), end=torch.randn(3))
    given[bad] = given[bad].clone()
    given[bad].view(-1)[1] = value
    with pytest.raises(ValueError, match=f"^{bad}: {message}"):
        build(**given)


@pytest.mark.parametrize("c_pass", [True, False], ids=["C pass", "torch"])
def test_the_four_tensors_values_are_read_once_for_all(monkeypatch, c_pass):
    """One host read (a GPU synchronisation) for emissions, transitions, start and end together: the
    least and largest of each, eight numbers; none where the C pass reads them (contiguous CPU tensors)."""
    if c_pass and validation._values is None:
        pytest.skip("the C extension structures._values is not built")
    monkeypatch.setattr(validation, "_values", validation._values if c_pass else None)
    reads = []
    tolist = torch.Tensor.tolist

    def counting(self):
        reads.append(self.shape)
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting)
    EmissionCRF(torch.randn(2, 4, 3), torch.randn(3, 3), torch.randn(3), torch.randn(3))
    assert reads == ([] if c_pass else [torch.Size([8])])
