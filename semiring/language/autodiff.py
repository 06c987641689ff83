"""The autograd glue of a run: one node with a written-out backward, and what higher orders need.

:class:`Tape` runs a plan as one autograd node whose backward is the in-place level-by-level pass of
:mod:`.execute`. When that backward must itself be differentiable (``create_graph=True``: a loss on
the marginals, as structured attention trains), the gradient is a node of its own in the Log
semiring, :class:`TapeGradient`, whose backward is a Hessian-vector product computed in forward
mode (the passes once more on pairs of values and tangents); in other semirings, and for third order, the run is repeated with out-of-place writes
(:meth:`~.execute.Run.functional`) and differentiated by plain autograd.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..semirings import LogSemiring
from .execute import Run


def _unrecorded(run: Run):
    """No autograd inside the run's in-place passes: inference mode (which spares every torch call
    its autograd bookkeeping: 7-19% of a call) where nothing in them is recorded (written-out
    steps, no scans), else no_grad. What leaves inference mode is copied out of it."""
    return torch.inference_mode() if run.unrecorded() else torch.no_grad()


class Tape(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run: Run, *elements: Tensor) -> Tensor:
        ctx.run = run
        ctx.save_for_backward(*elements)
        backward = any(ctx.needs_input_grad) and not torch.is_inference_mode_enabled()  # (none comes in inference mode)
        with _unrecorded(run):
            out, ctx.buffers = run.forward([e.detach() for e in elements], keep=backward)
        return out.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        elements = ctx.saved_tensors
        run = ctx.run
        if not torch.is_grad_enabled():
            # in inference mode the gradient buffers are made before it, so that they leave it uncopied;
            # otherwise a scan's fresh gradient becomes its input's buffer, which is then neither zeroed nor added to
            buffers = run.gradients(ctx.buffers) if run.unrecorded() else None
            with _unrecorded(run):
                grads = run.backward(ctx.buffers, grad, [e.shape for e in elements], grads=buffers)
            return (None, *[g.clone() if g is not None and g.is_inference() else g for g in grads])
        if TapeGradient.applies(run, elements):
            per_example = TapeGradient.apply(run, ctx.buffers, *elements)  # (fresh tensors)
            if grad.device.type == "cpu" and not grad.requires_grad and bool((grad == 1).all()):  # (marginals: read for free there)
                return (None, *per_example)
            return (None, *[g * grad.reshape(-1, *[1] * (g.dim() - 1)) for g in per_example])
        return (None, *plain_gradient(run, grad, elements))


def gradient(run: Run, elements: list[Tensor], wanted: list[int]) -> tuple[Tensor, list[Tensor]]:
    """(goal, ∂ Σ goal / ∂ elements[i] for i in ``wanted``) by :class:`Tape`'s forward and
    first-order backward called directly: what ``torch.autograd.grad`` of the goal's sum gives,
    without the autograd node, the engine and their bookkeeping (a fifth to a third of a small
    query). The elements are made outside inference mode (the backward of a semiring without
    written-out steps differentiates its levels by autograd)."""
    with torch.no_grad():
        elements = [e.detach() for e in elements]
        with _unrecorded(run):
            goal, buffers = run.forward(elements, keep=True)
        grads = run.gradients(buffers) if run.unrecorded() else None
        with _unrecorded(run):
            found = run.backward(buffers, torch.ones_like(goal), [e.shape for e in elements], grads=grads)
    return (goal.clone() if goal.is_inference() else goal), [found[i].clone() if found[i].is_inference() else found[i] for i in wanted]


def plain_gradient(run: Run, grad: Tensor, elements: tuple[Tensor, ...]) -> list[Tensor | None]:
    """The gradient of ``⟨grad, goal⟩`` by a differentiable re-run (None where not needed)."""
    wanted = [e for e in elements if e.requires_grad]
    with torch.enable_grad():
        out = run.functional(list(elements))
        found = iter(torch.autograd.grad(out, wanted, grad, create_graph=True, allow_unused=True))
    return [next(found) if e.requires_grad else None for e in elements]


class TapeGradient(torch.autograd.Function):
    """``∂goal_b/∂elements`` for every example b (Log semiring; example b's in row b of each
    input), whose backward is the Hessian-vector product ``H V``: the Hessian of the log-partition
    is symmetric, so ``H V`` is the forward-mode derivative of the gradient in the direction ``V``,
    the forward and backward passes run once more on pairs (value, tangent), stacked as one leading
    component (:meth:`~.execute.Run.paired`; about two first-order passes on twice the numbers).
    Not torch's forward-mode dual tensors: each operation on them costs 5-10 times a plain one
    (and ~1 ms where one operand is plain, in torch 2.13).
    Its own backward (third order) is the functional re-run, differentiated twice."""

    @staticmethod
    def applies(run: Run, elements: tuple[Tensor, ...]) -> bool:
        """Log semiring only (a sampling semiring's tape gradient is not a gradient), every input
        with the whole batch (one shared by the batch mixes the examples' gradients), and no
        integer inputs of indices (no tangents)."""
        return (type(run.semiring) is LogSemiring and all(e.shape[0] == run.batch for e in elements)
                and not run.plan.looked_up)

    @staticmethod
    def forward(ctx, run: Run, buffers: dict, *elements: Tensor):
        ctx.run = run
        ctx.save_for_backward(*elements)
        return tuple(run.backward(buffers, elements[0].new_ones(run.batch), [e.shape for e in elements]))

    @staticmethod
    def backward(ctx, *V: Tensor):
        elements = ctx.saved_tensors
        run = ctx.run
        ones = elements[0].new_ones(run.batch)
        if torch.is_grad_enabled():  # third order: differentiate the functional run twice
            wanted = [e for e in elements if e.requires_grad]
            gs = plain_gradient(run, ones, elements)
            pairs = [(g, v) for g, v in zip(gs, V) if g is not None and v is not None]
            if not pairs:
                return (None, None, *[None] * len(elements))
            found = iter(torch.autograd.grad([g for g, _ in pairs], wanted, [v for _, v in pairs],
                                             create_graph=True, allow_unused=True))
            return (None, None, *[next(found) if e.requires_grad else None for e in elements])
        with torch.no_grad():
            pairs = [torch.stack((e.detach(), torch.zeros_like(e) if v is None else v.expand_as(e))) for e, v in zip(elements, V)]
            paired = run.paired()
            _, buffers = paired.forward(pairs, dual=True)
            hv = [g[1] for g in paired.backward(buffers, ones, [(2, *e.shape) for e in elements], dual=True)]
        return (None, None, *[h if e.requires_grad else None for e, h in zip(elements, hv)])
