"""``mask=`` wherever ``lengths=`` is: every structure and every layer given a bool mask ``[B, N]``
(True at the positions that exist, a prefix of each row: pytorch-crf's and SuPar's) answers as
given the lengths it implies, ``mask.sum(-1)``; dependency trees take SuPar's ``[B, N+1]`` whose
column 0, the root, is ignored. One conversion (structures/validation.py ``lengths_of_mask``),
one set of errors, no read of the values while validation is off."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from structures import (CTC, HMM, PCFG, TDPCFG, AlignmentCRF, EmissionCRF, HMMParameters, LinearChainCRF,
                        NonProjectiveDependencyCRF, ProjectiveDependencyCRF, SecondOrderDependencyCRF)
from structures import nn as snn
from structures.nn.attention import check_lengths
from structures.validation import lengths_of_mask

from brute import FAMILIES, random_potentials
from test_nn_padding import CASES, LENGTHS, by_lengths

ROOT_FIRST = {"SyntacticAttention", "SyntacticAttention(structured=False)"}  # layers whose position 0 is the root


def prefix_mask(lengths: torch.Tensor, size: int) -> torch.Tensor:
    """``[B, size]``: True at the first ``lengths[b]`` positions."""
    return torch.arange(size) < lengths.unsqueeze(-1)


def with_root(words: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
    """SuPar's dependency mask: the root's column (any value: it is ignored) before the words'."""
    return torch.cat([root.unsqueeze(-1), words], -1)


def same(a, b) -> None:
    """Two distributions answer alike (the queries every structure has)."""
    assert type(a) is type(b)
    if isinstance(a.lengths, dict):
        assert a.lengths.keys() == b.lengths.keys() and all(torch.equal(a.lengths[k], b.lengths[k]) for k in a.lengths)
    else:
        assert torch.equal(a.lengths, b.lengths)
    assert_close(a.log_partition, b.log_partition)
    assert_close(a.marginals, b.marginals)
    assert_close(a.argmax, b.argmax)
    assert_close(a.count, b.count)


# ---------------------------------------------------------------- every structure


@settings(max_examples=15, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("family", FAMILIES, ids=str)
def test_a_mask_is_the_lengths_it_implies(family, data):
    shape = data.draw(st.sampled_from(family.shapes), label="shape")
    longest = family.max_length(shape)
    batch = data.draw(st.integers(1, 3), label="batch")
    lengths = torch.tensor(data.draw(st.lists(st.integers(1, longest), min_size=batch, max_size=batch), label="lengths"))
    theta = random_potentials(shape, batch, torch.Generator().manual_seed(data.draw(st.integers(0, 99))), forbid=0.2)
    mask = prefix_mask(lengths, longest)
    if family.offset == -1:  # a dependency CRF: [B, N+1], the root first, whatever it holds
        mask = with_root(mask, torch.tensor(data.draw(st.lists(st.booleans(), min_size=batch, max_size=batch))))
    same(family.cls(theta, mask=mask), family.cls(theta, lengths))


def _emissions(B=3, N=5, C=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, N, C, generator=g, dtype=torch.float64), torch.randn(C, C, generator=g, dtype=torch.float64),
            torch.randn(C, generator=g, dtype=torch.float64), torch.randn(C, generator=g, dtype=torch.float64))


def _structures():
    """(name, build(**padding), lengths, mask): the structures and constructors that FAMILIES does
    not cover, each built from one batch given its lengths or its mask."""
    g = torch.Generator().manual_seed(1)
    lengths, mask = torch.tensor([5, 1, 3]), prefix_mask(torch.tensor([5, 1, 3]), 5)
    emissions, transitions, start, end = _emissions()
    yield "EmissionCRF", lambda **k: EmissionCRF(emissions, transitions, start, end, **k), lengths, mask
    yield "LinearChainCRF.from_emissions", lambda **k: LinearChainCRF.from_emissions(emissions, transitions, start, end, **k), \
        lengths, mask
    chain = torch.randn(3, 4, 2, 2, generator=g, dtype=torch.float64)
    yield "LinearChainCRF.from_torch_struct", lambda **k: LinearChainCRF.from_torch_struct(chain, **k), lengths, mask
    hmm = HMMParameters.random(3, 7, generator=g, dtype=torch.float64)
    words = torch.randint(7, (3, 5), generator=g)
    yield "HMM", lambda **k: HMM(words, hmm.emission, hmm.transitions, hmm.start, **k), lengths, mask
    yield "HMMParameters.posterior", lambda **k: hmm.posterior(words, **k), lengths, mask
    terms, rules, roots = (torch.randn(3, 4, 2, generator=g, dtype=torch.float64),
                           torch.randn(1, 2, 4, 4, generator=g, dtype=torch.float64), torch.randn(1, 2, generator=g, dtype=torch.float64))
    pcfg_lengths = torch.tensor([4, 2, 3])
    yield "PCFG", lambda **k: PCFG(terms, rules, roots, **k), pcfg_lengths, prefix_mask(pcfg_lengths, 4)
    U, V, W = (torch.randn(1, *s, generator=g, dtype=torch.float64) for s in ((2, 3), (4, 3), (4, 3)))
    yield "TDPCFG", lambda **k: TDPCFG(terms, U, V, W, roots, **k), pcfg_lengths, prefix_mask(pcfg_lengths, 4)
    arcs = torch.randn(3, 5, 5, generator=g, dtype=torch.float64)
    siblings = torch.randn(3, 5, 5, 5, generator=g, dtype=torch.float64)
    words_lengths = torch.tensor([4, 1, 2])
    supar = with_root(prefix_mask(words_lengths, 4), torch.tensor([False, False, True]))  # SuPar: mask[:, 0] = 0
    yield "SecondOrderDependencyCRF", lambda **k: SecondOrderDependencyCRF(arcs, siblings, single_root=True, **k), \
        words_lengths, supar
    torch_struct = torch.randn(3, 4, 4, generator=g, dtype=torch.float64)  # words 0..3, root arcs on the diagonal
    for cls in (ProjectiveDependencyCRF, NonProjectiveDependencyCRF, SecondOrderDependencyCRF):
        extra = (siblings,) if cls is SecondOrderDependencyCRF else ()
        yield f"{cls.__name__}.from_torch_struct", \
            lambda cls=cls, extra=extra, **k: cls.from_torch_struct(torch_struct, *extra, **k), words_lengths, supar
    align = torch.randn(3, 3, 4, generator=g, dtype=torch.float64)
    n, m = torch.tensor([3, 1, 2]), torch.tensor([4, 2, 1])
    for kind in ("many_to_many", "one_to_many"):
        yield f"AlignmentCRF({kind}) tuple", lambda kind=kind, **k: AlignmentCRF(align, kind=kind, **k), \
            (n, m), (prefix_mask(n, 3), prefix_mask(m, 4))
        yield f"AlignmentCRF({kind}) dict", lambda kind=kind, **k: AlignmentCRF(align, kind=kind, **k), \
            {"m": m}, {"m": prefix_mask(m, 4)}


STRUCTURES = list(_structures())


@pytest.mark.parametrize("case", STRUCTURES, ids=[c[0] for c in STRUCTURES])
def test_every_other_constructor_takes_a_mask_for_its_lengths(case):
    _, build, lengths, mask = case
    same(build(mask=mask), build(lengths=lengths))


def test_ctc_takes_an_input_mask_and_a_target_mask():
    g = torch.Generator().manual_seed(2)
    log_probs = torch.randn(3, 6, 4, generator=g, dtype=torch.float64).log_softmax(-1)
    targets = torch.tensor([[1, 2, 2], [3, 0, 0], [0, 0, 0]])  # padded with the blank
    input_lengths, target_lengths = torch.tensor([6, 4, 2]), torch.tensor([3, 1, 0])
    by_mask = CTC(log_probs, targets, input_mask=prefix_mask(input_lengths, 6), target_mask=targets != 0)
    same(by_mask, CTC(log_probs, targets, input_lengths, target_lengths))
    assert torch.equal(by_mask.input_lengths, input_lengths) and torch.equal(by_mask.target_lengths, target_lengths)
    same(CTC(log_probs, targets, target_lengths=target_lengths, input_mask=prefix_mask(input_lengths, 6)),
         CTC(log_probs, targets, input_lengths, target_lengths))


# ---------------------------------------------------------------- every layer


def mask_of(lengths: torch.Tensor, size: int, root: bool) -> torch.Tensor:
    mask = prefix_mask(lengths, size)
    if root:  # SuPar's: the root's entry set False (it is ignored)
        mask[:, 0] = False
    return mask


LAYERS = [(case, False) for case in CASES] + [(case, True) for case in CASES if case[0] in ROOT_FIRST]


@pytest.mark.parametrize("case, root_off", LAYERS, ids=[c[0] + (" root entry False" if off else "") for c, off in LAYERS])
def test_every_layer_takes_a_mask_for_its_lengths(case, root_off):
    _, make, call = case
    torch.manual_seed(0)
    layer = make()
    by_mask = lambda prefix="": {f"{prefix}mask": mask_of(LENGTHS, 5, root_off)}  # noqa: E731
    want = call(layer, lambda x, dim: x, by_lengths)
    got = call(layer, lambda x, dim: x, by_mask)
    for a, b in zip(want, got):
        if isinstance(a, torch.Tensor):
            assert_close(b, a)
        elif a is not None:  # the distribution
            assert torch.equal(b.lengths, a.lengths)


def test_the_crf_layer_reads_its_mask_as_every_structure_does():
    crf = snn.CRF(3, batch_first=True).double()
    emissions, *_ = _emissions()
    tags = torch.randint(3, (3, 5), generator=torch.Generator().manual_seed(3))
    lengths = torch.tensor([5, 1, 3])
    mask = prefix_mask(lengths, 5)
    want = EmissionCRF(emissions, crf.transitions, crf.start_transitions, crf.end_transitions, lengths)
    assert_close(crf(emissions, tags, mask, reduction="none"), want.log_prob(tags))
    assert_close(crf(emissions, tags, mask.to(torch.uint8), reduction="none"), want.log_prob(tags))  # pytorch-crf's uint8
    assert crf.decode(emissions, mask) == [row[:n] for row, n in zip(want.decode().tolist(), lengths.tolist())]


# ---------------------------------------------------------------- errors


GAP = torch.tensor([[True, True, False, True, False], [True] * 5, [True] + [False] * 4])
MASK = prefix_mask(torch.tensor([5, 1, 3]), 5)


def _chain(**k):
    return LinearChainCRF(torch.zeros(3, 4, 2, 2), **k)


def _tree(**k):
    return NonProjectiveDependencyCRF(torch.zeros(3, 5, 5), **k)


def _attention(**k):
    return snn.SoftmaxAttention(4, 4)(torch.randn(3, 5, 4), torch.randn(3, 4), **k)


def _syntactic(**k):
    return snn.SyntacticAttention(4, 4)(torch.randn(3, 5, 4), **k)


@pytest.mark.parametrize("build, kwargs, match", [
    (_chain, dict(lengths=torch.tensor([5, 1, 3]), mask=MASK), r"lengths, mask: expected one of them"),
    (_chain, dict(mask=MASK.float()), r"mask: expected a bool tensor of shape \[B, N\] = \[3, 5\], got torch.float32"),
    (_chain, dict(mask=MASK.long()), r"mask: expected a bool tensor"),
    (_chain, dict(mask=MASK[:, :4]), r"mask: expected a bool tensor of shape \[B, N\] = \[3, 5\], got torch.bool \[3, 4\]"),
    (_chain, dict(mask=MASK[:2]), r"mask: expected a bool tensor of shape \[B, N\] = \[3, 5\]"),
    (_chain, dict(mask=[[True] * 5] * 3), r"mask: expected a bool tensor .* got list"),
    (_chain, dict(mask=GAP), r"mask: expected each row's True entries to be a prefix .* rows \[0\]"),
    (_chain, dict(mask=MASK & torch.tensor([[True], [False], [True]])), r"mask \(read as lengths"),
    (_tree, dict(mask=MASK[:, :4]), r"mask: expected a bool tensor of shape \[B, N\+1\] = \[3, 5\] \(column 0 the root\), "
                                    r"got torch.bool \[3, 4\]"),
    (_tree, dict(mask=with_root(GAP[:, :4], torch.ones(3, dtype=torch.bool))), r"mask: .*prefix of columns 1..N"),
    (_tree, dict(mask=with_root(torch.zeros(3, 4, dtype=torch.bool), torch.ones(3, dtype=torch.bool))),
     r"mask \(read as lengths.*: expected values in 1..4"),
    (lambda **k: AlignmentCRF(torch.zeros(3, 3, 4), **k), dict(mask=(MASK[:, :3],)), r"mask: expected 2 masks"),
    (lambda **k: AlignmentCRF(torch.zeros(3, 3, 4), **k), dict(mask={"x": MASK}), r"mask: expected a dict from the lengths"),
    (lambda **k: AlignmentCRF(torch.zeros(3, 3, 4), **k), dict(mask={"m": MASK}), r"mask\['m'\]: expected a bool tensor .* = \[3, 4\]"),
    (lambda **k: AlignmentCRF(torch.zeros(3, 3, 4), **k), dict(lengths={"n": torch.tensor([1, 2, 3])}, mask={"m": MASK[:, :4]}),
     r"lengths, mask: expected one of them"),
    (lambda **k: CTC(torch.zeros(3, 5, 3), torch.ones(3, 2, dtype=torch.long), **k),
     dict(input_lengths=torch.tensor([5, 1, 3]), input_mask=MASK), r"input_lengths, input_mask: expected one of them"),
    (lambda **k: CTC(torch.zeros(3, 5, 3), torch.ones(3, 2, dtype=torch.long), **k),
     dict(target_mask=MASK), r"target_mask: expected a bool tensor of shape \[B, N\] = \[3, 2\]"),
    (lambda **k: CTC(torch.zeros(3, 5, 3), torch.ones(3, 2, dtype=torch.long), **k),
     dict(input_mask=GAP), r"input_mask: expected each row's True entries to be a prefix"),
    (lambda **k: LinearChainCRF.from_emissions(torch.zeros(3, 5, 2), torch.zeros(2, 2), **k), dict(mask=GAP), r"mask: .*prefix"),
    (lambda **k: LinearChainCRF.from_emissions(torch.zeros(3, 5, 2), torch.zeros(2, 2), **k),
     dict(lengths=torch.tensor([5, 1, 3]), mask=MASK), r"lengths, mask: expected one of them"),
    (_attention, dict(lengths=torch.tensor([5, 1, 3]), mask=MASK), r"lengths, mask: expected one of them"),
    (_attention, dict(mask=MASK.float()), r"mask: expected a bool tensor of shape \[B, N\] = \[3, 5\]"),
    (_attention, dict(mask=GAP), r"mask: expected each row's True entries to be a prefix"),
    (_attention, dict(mask=MASK & torch.tensor([[True], [False], [True]])), r"mask \(read as lengths.*: expected values in 1..5"),
    (_syntactic, dict(mask=MASK[:, :4]), r"mask: expected a bool tensor of shape \[B, N\] = \[3, 5\] \(column 0 the root\)"),
    (_syntactic, dict(mask=with_root(torch.zeros(3, 4, dtype=torch.bool), MASK[:, 0])), r"mask \(read as lengths.*2..5"),
    (lambda **k: snn.SubtreeAttention(4, 4)(torch.randn(3, 5, 4), torch.randn(3, 5, 4), torch.zeros(3, 5, dtype=torch.long), **k),
     dict(query_mask=GAP), r"query_mask: expected each row's True entries to be a prefix"),
    (lambda **k: snn.TreeLSTM(4, 4)(torch.randn(3, 5, 4), torch.zeros(3, 5, dtype=torch.long), **k),
     dict(lengths=torch.tensor([5, 1, 3]), mask=MASK), r"lengths, mask: expected one of them"),
])
def test_a_bad_mask_raises_naming_it(build, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build(**kwargs)


@pytest.fixture
def validation_off(monkeypatch):
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", False)


def test_without_validation_the_mask_is_not_read(validation_off, monkeypatch):
    """Reading a tensor's values on the host (what waits for the device) fails here: the
    conversion of a mask does none, neither in the structures nor in the layers."""
    def read(*args, **kwargs):
        raise AssertionError("a tensor's values were read")

    for name in ("__bool__", "item", "tolist", "__int__", "__index__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, read)
    assert torch.equal(lengths_of_mask(None, GAP, 3, 5), GAP.sum(-1))  # not a prefix: not checked, not read
    assert torch.equal(lengths_of_mask(None, GAP, 3, 4, root=True), GAP[:, 1:].sum(-1))
    assert torch.equal(check_lengths(None, 3, 1, 5, torch.device("cpu"), MASK), MASK.sum(-1))
    assert torch.equal(check_lengths(None, 3, 2, 5, torch.device("cpu"), MASK, root=True), MASK.sum(-1))


def test_without_validation_a_gap_is_taken_as_its_count(validation_off):
    assert torch.equal(_chain(mask=GAP).lengths, GAP.sum(-1))
    assert torch.equal(_chain(mask=GAP).log_partition, _chain(lengths=GAP.sum(-1)).log_partition)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_mask_costs_no_synchronisation(validation_off):
    theta, arcs = torch.randn(3, 4, 2, 2, device="cuda"), torch.randn(3, 5, 5, device="cuda")
    memory, query = torch.randn(3, 5, 4, device="cuda"), torch.randn(3, 4, device="cuda")
    layer = snn.SoftmaxAttention(4, 4).cuda()  # (copying its parameters to the device waits for it: before the check)
    mask = MASK.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        LinearChainCRF(theta, mask=mask)
        ProjectiveDependencyCRF(arcs, mask=mask)
        layer(memory, query, mask=mask)
    finally:
        torch.cuda.set_sync_debug_mode(0)
