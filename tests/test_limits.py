"""A run larger than the budget of :mod:`semiring.language.limits` is refused before any work, with a
ValueError that names the estimate and how to raise the budget; inside ``semiring.limits`` it runs."""

from __future__ import annotations

import pytest
import torch

import semiring
from semiring.language import execute, limits
from structures import ConstituencyCRF, LinearChainCRF


@pytest.fixture
def no_run(monkeypatch):
    """Any run that starts fails the test: a refusal must come before the work."""
    def started(*args, **kwargs):
        raise AssertionError("the run started")
    monkeypatch.setattr(execute.Run, "forward", started)


def test_a_run_over_the_work_budget_is_refused_before_it_starts(no_run):
    spans = torch.randn(1, 40, 40, 2)  # a CKY of 40 words: 1.39e4 terms
    with semiring.limits(work=10_000), pytest.raises(ValueError, match=r"1\.39e\+04 terms per example.*semiring\.limits\(work="):
        ConstituencyCRF(spans).log_partition


def test_a_run_over_the_memory_budget_is_refused_naming_the_batch(no_run):
    potentials = torch.randn(64, 9, 4, 4)
    with semiring.limits(memory=1000), pytest.raises(ValueError, match=r"for 64 examples.*semiring\.limits\(memory="):
        LinearChainCRF(potentials).log_partition


def test_inside_a_raised_budget_the_run_gives_what_it_gives_without_one():
    spans = torch.randn(2, 12, 12, 3, dtype=torch.float64)
    want = ConstituencyCRF(spans).marginals
    with semiring.limits(work=10**9, memory=2**40):
        assert torch.equal(ConstituencyCRF(spans).marginals, want)


def test_the_budget_is_restored_after_the_block_even_on_error():
    before = limits.WORK, limits.MEMORY
    with pytest.raises(ValueError), semiring.limits(work=1):
        ConstituencyCRF(torch.randn(1, 5, 5, 2)).log_partition
    assert (limits.WORK, limits.MEMORY) == before


def test_the_default_budget_refuses_a_cky_of_2000_words_in_a_second():
    """(The plan is built: 0.3 s here. Computed, it took a minute.)"""
    with pytest.raises(ValueError, match="terms per example"):
        ConstituencyCRF(torch.randn(1, 2000, 2000, 2)).log_partition
