"""AlignmentCRF against what benchmarks/alignment.py times it against: the anti-diagonal loop, and
SynJax's AlignmentCRF under the mapping between the two (same layout; SynJax leaves out the score
of the first cell, which every alignment visits). The SynJax test runs in its own venv through the
benchmark's worker and is skipped without it (../shared/peers/README.md).

torch-struct 0.5's ``Alignment`` (moves scored ``[B, n, m, 3]``) has no test here: it cannot run
without ``genbmm``, a CUDA extension that is not on the package index."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from benchmarks.alignment import loop_log_partition
from benchmarks.synjax_peer import VENV_PYTHON, SynJax
from structures import AlignmentCRF

SIZES = {"many_to_many": [(1, 1), (3, 3), (4, 6), (6, 4), (7, 7)], "one_to_many": [(1, 3), (3, 3), (3, 7), (5, 6)]}
CASES = [(kind, n, m) for kind, sizes in SIZES.items() for n, m in sizes]


@pytest.mark.parametrize("kind, n, m", CASES)
def test_the_anti_diagonal_loop_equals_ours(kind, n, m):
    theta = torch.randn(3, n, m, dtype=torch.float64, generator=torch.Generator().manual_seed(n * 10 + m))
    d = AlignmentCRF(theta, kind=kind)
    x = theta.clone().requires_grad_()
    logz = loop_log_partition(x, kind)
    assert_close(logz, d.log_partition)
    assert_close(torch.autograd.grad(logz.sum(), x)[0], d.marginals)


@pytest.mark.skipif(not os.path.exists(VENV_PYTHON), reason=f"no SynJax venv at {VENV_PYTHON}")
def test_synjax_alignment_crf_equals_ours_under_the_mapping():
    synjax = SynJax.start()
    try:
        for kind, n, m in [("many_to_many", 7, 4), ("one_to_many", 4, 7)]:
            theta = torch.randn(3, n, m, generator=torch.Generator().manual_seed(n * 10 + m)) * 2
            d = AlignmentCRF(theta, kind=kind)
            _, logz, _ = synjax.load("alignment_log_partition", theta.numpy(), kind="monotone_" + kind)
            _, mu, _ = synjax.load("alignment_marginals", theta.numpy(), kind="monotone_" + kind)
            # every alignment visits (0, 0), whose score SynJax leaves out: a constant of each example
            assert_close(torch.from_numpy(np.asarray(logz)) + theta[:, 0, 0], d.log_partition, atol=1e-4, rtol=1e-5)
            assert_close(torch.from_numpy(np.asarray(mu)), d.marginals, atol=1e-5, rtol=1e-4)
    finally:
        synjax.close()
