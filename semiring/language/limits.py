"""How large a run may be before it starts: a budget of work and one of memory, checked once per run
from its plan (sizes only, no value read), so that an input far too large is refused at once with
the way to raise the budget, instead of computing for minutes or until memory runs out.

The work of a run is its number of *terms*: one per rule and assignment of the rule's variables in
its box (summed variables included), per example; the C kernel computes 10^7 to 10^8 of them a
second on one core (6 * 10^7 for a CKY of 800 words on an AMD EPYC core). The memory is that of the
charts' buffers for the whole batch (the values; a backward pass needs as much again for their
gradients).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

from .plan import Plan

WORK = 2**30
"""Terms per example a run may compute (10 to 100 s of one CPU core)."""

MEMORY = 32 * 2**30
"""Bytes the charts' buffers of one run may take, for the whole batch."""


@contextmanager
def limits(work: int | None = None, memory: int | None = None) -> Iterator[None]:
    """Runs inside may compute ``work`` terms per example and hold ``memory`` bytes of charts
    (None: the budget as it is); e.g. ``with semiring.limits(work=2**34): crf.marginals``."""
    global WORK, MEMORY
    was = WORK, MEMORY
    WORK, MEMORY = work if work is not None else WORK, memory if memory is not None else MEMORY
    try:
        yield
    finally:
        WORK, MEMORY = was


def check(plan: Plan, batch: int, bytes_per_value: int) -> None:
    """A ``ValueError`` naming the estimate and the budget where a run of ``batch`` examples on
    ``plan`` would exceed :data:`WORK` or :data:`MEMORY` (``bytes_per_value``: a chart entry's size,
    the semiring's components included)."""
    if plan.work is None:
        steps = [step for level in plan.levels for step in level] + plan.goal
        plan.work = sum(math.prod(step.sizes) for step in steps)
        plan.positions = sum(plan.size[key] for keys in plan.keys.values() for key in keys)
    if plan.work > WORK:
        raise ValueError(f"this run would compute {plan.work:.3g} terms per example, over the budget of {WORK:.3g} "
                         f"(10^7 to 10^8 a second on one CPU core); run it inside `with semiring.limits(work=...)` "
                         f"to allow more")
    memory = plan.positions * batch * bytes_per_value
    if memory > MEMORY:
        raise ValueError(f"this run's charts would take {memory / 2**30:.3g} GiB for {batch} examples, over the budget of "
                         f"{MEMORY / 2**30:.3g} GiB; run fewer examples at once, or inside "
                         f"`with semiring.limits(memory=...)` to allow more")
