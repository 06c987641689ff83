"""CTC against torch.nn.functional.ctc_loss (values and gradients) and against every frame
labelling listed by hand at small sizes (repeated labels, empty targets, too few frames, -inf, a
blank other than 0). (The checks every structure shares are in test_distribution_api.py: family ctc.)"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from brute import Enumeration, assert_queries_match, collapse, ctc_alignments
from structures import CTC


def enumerate_batch(logp, targets, input_lengths, target_lengths, blank=0) -> list[Enumeration]:
    """Per example; with no alignment (too few frames) a lone structure of score -inf stands for the empty set."""
    out = []
    for lp, y, n, m in zip(logp, targets.tolist(), input_lengths.tolist(), target_lengths.tolist()):
        found = list(ctc_alignments(n, lp.shape[-1], y[:m], blank))
        out.append(Enumeration(lp, found) if found else Enumeration(torch.full_like(lp, -math.inf), [[(0, 0)]]))
    return out


def small_problem(seed: int, forbid: float = 0.0, blank: int = 0):
    """B=5, T=5, V=3, S=2: repeated labels, an empty target, a target the frames are too few for."""
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(5, 5, 3, generator=g, dtype=torch.float64).log_softmax(-1)
    if forbid:
        logp = logp.masked_fill(torch.rand(logp.shape, generator=g) < forbid, -math.inf)
    labels = [v for v in range(3) if v != blank]
    a, b = labels
    targets = torch.tensor([[a, b], [a, a], [b, a], [a, b], [b, b]])
    input_lengths = torch.tensor([5, 3, 4, 2, 2])  # "b b" needs three frames: the last has none
    target_lengths = torch.tensor([2, 2, 1, 0, 2])
    return logp, targets, input_lengths, target_lengths


@pytest.mark.parametrize("forbid", [0.0, 0.3], ids=["finite", "forbid"])
@pytest.mark.parametrize("blank", [0, 2])
def test_every_query_equals_enumeration_of_the_alignments(forbid, blank):
    logp, targets, n, m = small_problem(0, forbid, blank)
    d = CTC(logp, targets, n, m, blank=blank)
    enums = enumerate_batch(logp, targets, n, m, blank)
    q_logp = small_problem(1, forbid, blank)[0]
    q = CTC(q_logp, targets, n, m, blank=blank)
    q_enums = enumerate_batch(q_logp, targets, n, m, blank)
    assert_queries_match(d, q, enums, q_enums)
    assert d.log_partition[4] == -math.inf


def test_decode_is_the_best_labelling_and_positions_its_path():
    logp, targets, n, m = small_problem(2)
    d = CTC(logp, targets, n, m)
    symbols = d.decode()
    assert symbols.shape == (5, 5)
    for b, e in enumerate(enumerate_batch(logp, targets, n, m)):
        if not e.count:
            assert (symbols[b] == -1).all()
            continue
        best = e.parts[e.scores.argmax()].argmax(-1)[: n[b]]
        assert symbols[b].tolist() == best.tolist() + [-1] * (5 - int(n[b]))
        assert collapse(tuple(symbols[b, : n[b]].tolist()), 0) == targets[b, : m[b]].tolist()
    some = torch.isfinite(d.max)
    assert_close(d.log_prob(symbols)[some], (d.max - d.log_partition)[some])
    # "a b" in 5 frames: ext = (_, a, _, b, _), positions 0..4 of the extended sequence
    labelling = torch.tensor([[0, 1, 1, 2, 0], [1, 0, 1, -1, -1], [2, 0, 0, 1, -1], [0, 0, -1, -1, -1], [2, 2, -1, -1, -1]])
    assert d.positions(d.to_parts(labelling))[0].tolist() == [0, 1, 1, 3, 4]
    assert d.positions(d.to_parts(labelling))[1].tolist() == [1, 2, 3, -1, -1]  # "a _ a" for "a a"
    assert d.log_prob(labelling)[4] == -math.inf  # "b b" collapses to "b": not an alignment of "b b"


def test_labellings_that_are_not_alignments_have_probability_zero():
    logp, targets, n, m = small_problem(3)
    d = CTC(logp, targets, n, m)
    wrong = torch.tensor([
        [1, 1, 1, 1, 1],          # collapses to "a", not "a b"
        [1, 1, 0, -1, -1],        # "a a" needs a blank between the two a's
        [2, 1, 1, 1, -1],         # "b a" is one label too many for "b"
        [1, 0, -1, -1, -1],       # "a" is not the empty target
        [2, -1, -1, -1, -1],      # a frame without a symbol
    ])
    assert (d.log_prob(wrong) == -math.inf).all()
    assert (d.log_prob(torch.tensor([[1, 2, 1, 2, 1]] * 5)) == -math.inf).all()  # more labels than any target has
    past = d.to_parts(torch.tensor([[0, 0, 0, 0, 0]] * 5))
    past[3, 2, 0] = 1  # a symbol past the input length (parts given as such: symbols there are ignored)
    assert d.log_prob(past)[3] == -math.inf


def random_case(seed: int, dtype: torch.dtype, B: int = 8, T: int = 30, V: int = 6, S: int = 10, blank: int = 0):
    """Logits, targets with many repeats, lengths with an empty target and an infeasible example last."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g, dtype=dtype) * 3
    labels = torch.tensor([v for v in range(V) if v != blank])
    targets = labels[torch.randint(0, 2, (B, S), generator=g)]  # two labels only: repeats are common
    input_lengths = torch.randint(S * 2, T + 1, (B,), generator=g)
    input_lengths[0] = T
    target_lengths = torch.randint(0, S + 1, (B,), generator=g)
    target_lengths[:3] = torch.tensor([S, 0, 1])
    targets[-1] = labels[0]  # S equal labels need 2S - 1 frames
    input_lengths[-1], target_lengths[-1] = S, S
    return logits, targets, input_lengths, target_lengths


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("blank", [0, 5])
@pytest.mark.parametrize("seed", range(3))
def test_log_partition_and_gradients_equal_torch_ctc_loss(seed, blank, dtype):
    logits, targets, n, m = random_case(seed, dtype, blank=blank)
    x = logits.clone().requires_grad_()
    ours = CTC(x.log_softmax(-1), targets, n, m, blank=blank).log_partition
    y = logits.clone().requires_grad_()
    theirs = -torch.nn.functional.ctc_loss(y.log_softmax(-1).transpose(0, 1), targets, n, m, blank=blank, reduction="none")
    assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert ours[-1] == -math.inf  # too few frames: ctc_loss's loss is inf, our log-partition -inf
    feasible = torch.isfinite(theirs)
    (g_ours,) = torch.autograd.grad(ours[feasible].sum(), x)
    (g_theirs,) = torch.autograd.grad(theirs[feasible].sum(), y)
    # through log_softmax (see the CTC docstring); ctc_loss's backward puts NaN in the infeasible row
    assert_close(g_ours[feasible], g_theirs[feasible], rtol=1e-5, atol=1e-5)


def test_an_infeasible_example_has_zero_gradient_where_ctc_loss_has_nan():
    logits, targets, n, m = random_case(0, torch.float64)
    x = logits.clone().requires_grad_()
    (g,) = torch.autograd.grad(CTC(x.log_softmax(-1), targets, n, m).log_partition[-1], x)
    assert (g == 0).all()
    d = CTC(logits.log_softmax(-1), targets, n, m)
    assert (d.marginals[-1] == 0).all() and (d.argmax[-1] == 0).all() and d.entropy()[-1] == 0


def test_defaults_are_every_frame_and_every_target_label():
    logits, targets, _, _ = random_case(2, torch.float64, B=3, T=12, V=4, S=3)
    d = CTC(logits.log_softmax(-1), targets)
    full = CTC(logits.log_softmax(-1), targets, torch.full((3,), 12), torch.full((3,), 3))
    assert_close(d.log_partition, full.log_partition)
    assert {k: v.tolist() for k, v in d.lengths.items()} == {"n": [12] * 3, "m": [3] * 3}


@pytest.mark.parametrize("what, kwargs, message", [
    ("targets float", dict(targets=torch.ones(2, 2)), r"targets: expected an integer tensor"),
    ("targets rank", dict(targets=torch.ones(2, dtype=torch.long)), r"targets: expected an integer tensor of shape \[B, S\]"),
    ("targets batch", dict(targets=torch.ones(3, 2, dtype=torch.long)), r"targets: expected shape \[2, 2\]"),
    ("targets range", dict(targets=torch.tensor([[1, 3], [1, 1]])), r"targets: expected values in 0..2"),
    ("blank in targets", dict(targets=torch.tensor([[1, 0], [1, 1]])), r"targets: the blank 0 appears"),
    ("blank within a target length", dict(targets=torch.tensor([[1, 1], [0, 1]]), target_lengths=torch.tensor([2, 1])),
     r"targets: the blank 0 appears"),
    ("blank 2 in targets", dict(targets=torch.tensor([[1, 2], [1, 1]]), blank=2), r"targets: the blank 2 appears"),
    ("blank range", dict(blank=3), r"blank: expected an index in 0..2"),
    ("input_lengths zero", dict(input_lengths=torch.tensor([0, 4])), r"input_lengths: expected values in 1..4"),
    ("input_lengths long", dict(input_lengths=torch.tensor([5, 4])), r"input_lengths: expected values in 1..4"),
    ("input_lengths shape", dict(input_lengths=torch.tensor([4])), r"input_lengths: expected an integer tensor of shape \[B\] = \[2\], got torch.int64 \(1,\)"),
    ("target_lengths", dict(target_lengths=torch.tensor([3, 1])), r"target_lengths: expected values in 0..2"),
    ("target_lengths float", dict(target_lengths=torch.tensor([1.0, 1.0])),
     r"target_lengths: expected an integer tensor of shape \[B\] = \[2\], got torch.float32"),
], ids=lambda x: x if isinstance(x, str) and not x.startswith(("log_probs", "targets:", "blank:", "input", "target_")) else "")
def test_bad_input_raises_value_error_naming_the_argument(what, kwargs, message):
    args = dict(log_probs=torch.zeros(2, 4, 3), targets=torch.ones(2, 2, dtype=torch.long), input_lengths=None,
                target_lengths=None, blank=0)
    with pytest.raises(ValueError, match=message):
        CTC(**{**args, **kwargs})


def test_blank_in_padding_past_the_target_length_is_fine():
    logp = torch.randn(1, 4, 3, dtype=torch.float64).log_softmax(-1)
    padded = CTC(logp, torch.tensor([[1, 0, 0]]), target_lengths=torch.tensor([1]))
    assert_close(padded.log_partition, CTC(logp, torch.tensor([[1]])).log_partition)


def test_no_query_mutates_its_inputs():
    logp, targets, n, m = small_problem(5)
    before = [t.clone() for t in (logp, targets, n, m)]
    d = CTC(logp, targets, n, m)
    d.marginals, d.sample((2,)), d.topk(2), d.entropy(), d.decode()
    assert all(torch.equal(a, b) for a, b in zip(before, (logp, targets, n, m)))
