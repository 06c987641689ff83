"""The semiring protocol and the built-in semirings.

An element of a semiring is a torch tensor. A semiring may put ``extra`` leading *component*
dimensions in front of the structural dimensions (``KMax(k)``: the k best values; ``SignedLog``:
``(log|a|, sign a)``; ``Derivations``: the derivations themselves). Every operation takes and
returns tensors shaped ``[*components, *structural]`` and reduces over negative (structural)
dimensions only, so code written against the protocol never sees the components.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from . import cpu_scan, triton_scan

NEG_INF = float("-inf")


class Semiring:
    """The protocol. Subclasses override ``convert``, ``plus``, ``times``, ``sum`` and the identities.

    ``dot(a, b, dim)`` is the fused ⊕-reduction of a product; the default composes ``times`` and
    ``sum``, semirings override it where fusing saves memory or time.
    """

    extra: int = 0  # number of leading component dimensions of an element
    name: str = "Semiring"

    def prepare(self, inputs: Sequence[Tensor]) -> None:
        """Called once with the raw inputs of a run, in program order, before ``convert``."""

    def convert(self, x: Tensor) -> Tensor:
        """Log-potentials ``[B, *shape]`` -> an element ``[*components, B, *shape]``."""
        raise NotImplementedError

    def zero(self, shape: Sequence[int], like: Tensor) -> Tensor:
        """The ⊕ identity, ``[*components, *shape]`` (``shape`` structural, batch included);
        ``like`` is an element, for the dtype and device. The runner pads tables of instances
        with it."""
        raise NotImplementedError

    def one(self, shape: Sequence[int], like: Tensor) -> Tensor:
        """The ⊗ identity, ``[*components, *shape]``, as ``zero``."""
        raise NotImplementedError

    def plus(self, a: Tensor, b: Tensor) -> Tensor:
        """Binary ⊕. The runner reduces with ``sum`` instead; composite semirings (``Expectation``)
        call it. The default stacks ``a`` and ``b`` and calls ``sum``."""
        return self.sum(torch.stack(torch.broadcast_tensors(a, b), dim=-1), dim=-1)

    def times(self, a: Tensor, b: Tensor) -> Tensor:
        """⊗, broadcasting over the structural dimensions."""
        raise NotImplementedError

    def sum(self, x: Tensor, dim: int) -> Tensor:
        """The ⊕-reduction over one structural (negative) dimension ``dim``; the runner passes
        -1."""
        raise NotImplementedError

    def dot(self, a: Tensor, b: Tensor, dim: int) -> Tensor:
        """``sum(times(a, b), dim)``, fused where a semiring overrides it."""
        return self.sum(self.times(a, b), dim)

    def scan(self, init: Tensor, xs: Tensor, unary: Tensor | None = None) -> Tensor:
        """The recurrence ``alpha_t[c] = (⊕_y alpha_{t-1}[y] ⊗ xs_t[y, c]) ⊗ unary_t[c]`` from
        ``alpha_{-1} = init``: ``init [*, B, K]``; ``xs [*, B, T, K, L]`` (a matrix per step and
        example), or ``[*, 1, 1, K, L]`` (one matrix for every step and example); ``unary [*, B, T, L]``
        or None -> every ``alpha_t``, ``[*, B, T, L]``.

        The language runs consecutive levels of a chain program through this; semirings override it
        with one fused node for the whole recurrence where that is faster."""
        steps = unary.shape[-2] if unary is not None else xs.shape[-3]
        mats = xs.unbind(-3) if xs.shape[-3] == steps else [xs.select(-3, 0)] * steps
        units = unary.unbind(-2) if unary is not None else [None] * steps
        out, prev = [], init
        for x, u in zip(mats, units):
            prev = self.dot(prev.unsqueeze(-2), x.transpose(-1, -2), -1)
            prev = prev if u is None else self.times(prev, u)
            out.append(prev)
        return torch.stack(out, -2)

    def __repr__(self) -> str:
        return self.name


def _finite_or_zero(t: Tensor) -> Tensor:
    return t.masked_fill(~torch.isfinite(t), 0.0)


def _on_host(t: Tensor) -> bool:
    """Whether a shortcut that depends on ``t``'s values may read them: only on the CPU, where that
    is free. On another device reading would wait for it, so the general path runs instead."""
    return t.device.type == "cpu"


class _LogSumExp(torch.autograd.Function):
    """logsumexp whose gradient is 0 (not NaN) where every summand is -inf.

    The backward is written in differentiable torch ops, so second derivatives work.
    """

    @staticmethod
    def forward(ctx, x: Tensor, dim: int) -> Tensor:
        out = torch.logsumexp(x, dim)
        ctx.dim = dim
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        x, out = ctx.saved_tensors
        dim = ctx.dim
        weights = (x - _finite_or_zero(out).unsqueeze(dim)).exp()
        return g.unsqueeze(dim) * weights, None


class _LogDot(torch.autograd.Function):
    """``logsumexp(a + b, dim)`` that saves only ``a``, ``b`` and the result for backward.

    The broadcast sum ``a + b`` is the largest tensor of a chain step; recomputing it in backward
    instead of keeping it alive is what keeps the memory of marginals at the size of the chart.
    """

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, dim: int) -> Tensor:
        out = torch.logsumexp(a + b, dim)
        ctx.dim = dim
        ctx.save_for_backward(a, b, out)
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        a, b, out = ctx.saved_tensors
        dim = ctx.dim
        w = (a + b - _finite_or_zero(out).unsqueeze(dim)).exp() * g.unsqueeze(dim)
        return _reduce_to(w, a.shape), _reduce_to(w, b.shape), None


def _log_matvec(a: Tensor, b: Tensor) -> Tensor:
    """``logsumexp(a + b, -1)`` for ``a [*, B, 1, K]`` (one row, broadcast over L) and a matrix
    ``b [*, 1, L, K]`` shared by the batch (a transition matrix), as a matrix product in linear
    space: ``log(exp(b - m_b) @ exp(a - m_a)) + m_a + m_b`` — one exp per entry of ``b``, not one
    per entry and example.

    Every term is a product of numbers in [0, 1] and nothing is subtracted, so the result is exact to
    rounding unless a whole row underflows (``r < tiny``): then the step is summed in log space. The
    shifts are constants (detached): the value does not depend on them. Plain differentiable ops,
    so gradients of every order follow.
    """
    if not _on_host(a):
        return _LogSumExp.apply(a + b, -1)
    low = torch.finfo(a.dtype).min  # a row of -inf stays -inf after the shift: exp 0, r = 0, exact path
    ma = a.detach().amax(-1, keepdim=True).clamp_min(low)
    mb = b.detach().amax(-1, keepdim=True).clamp_min(low)
    r = torch.matmul((b - mb).exp(), (a - ma).exp().transpose(-1, -2)).squeeze(-1)
    if bool((r < torch.finfo(r.dtype).tiny ** 0.8).any()):
        return _LogSumExp.apply(a + b, -1)
    return r.log() + (ma.squeeze(-1) + mb.squeeze(-1))


def _scan_grad(semiring: "Semiring", grad: Tensor, *inputs: Tensor | None):
    """Gradients of the plain (differentiable) scan: for gradients of gradients."""
    wanted = [t for t in inputs if t is not None and t.requires_grad]
    found = iter(torch.autograd.grad(Semiring.scan(semiring, *inputs), wanted, grad, create_graph=True, allow_unused=True))
    return tuple(next(found) if t is not None and t.requires_grad else None for t in inputs)


def _scan_shapes(init: Tensor, xs: Tensor, unary: Tensor | None):
    """(steps, whether one matrix serves every step) of a scan without component dimensions:
    ``init [B, K]``, ``xs [B or 1, T or 1, K, L]``, ``unary [B, T, L]`` or None."""
    steps = unary.shape[-2] if unary is not None else xs.shape[-3]
    return steps, xs.shape[-3] == 1 and steps > 1


class _LogScan(torch.autograd.Function):
    """``Semiring.scan`` in the Log semiring as one autograd node: one Triton launch each way on a
    GPU (:mod:`.triton_scan`), one call of a C loop each way on the CPU (:mod:`.cpu_scan`), else
    torch calls per step, as follows.

    Per-step matrices: the forward keeps only the chart; the backward runs the outside recursion in
    reverse with in-place ops, one preallocated gradient for all steps. One matrix for every step
    and example (a transition matrix): each step is a matrix product with ``exp(matrix - column
    max)``, computed once; all terms are products of numbers in [0, 1], so the result is exact to
    rounding unless a whole row underflows, which one check at the end detects (then the steps are
    summed in log space instead; off the CPU, where the check would wait for the device, they always are). For gradients of gradients (``create_graph=True``) the backward
    differentiates the plain loop, so every order works."""

    @staticmethod
    def forward(ctx, init: Tensor, xs: Tensor, unary: Tensor | None, differentiated: bool) -> Tensor:
        ctx.triton = triton_scan.applies(init, xs, unary)
        if ctx.triton:
            alphas, base = triton_scan.forward(init, xs, unary, is_max=False)
            ctx.save_for_backward(init, xs, unary, base, alphas)
            return alphas
        steps, one_matrix = _scan_shapes(init, xs, unary)
        ctx.cpu = cpu_scan.applies(init, xs, unary, keep=differentiated)
        if ctx.cpu:
            alphas, ctx.weights, ctx.sums = cpu_scan.forward(init, xs, unary, is_max=False, keep=differentiated)
            ctx.save_for_backward(init, xs, unary, alphas, alphas)
            return alphas
        base = xs.new_empty(steps, *init.shape[:-1], xs.shape[-1])  # the ⊕ of each step, before unary
        ctx.products = one_matrix and xs.shape[0] == 1 and _on_host(xs) and _LogScan._by_products(ctx, init, xs, unary, base)
        ctx.weights = None
        if not ctx.products and differentiated and xs.shape[1] == steps > 1 and xs.shape[0] == init.shape[0]:
            _LogScan._by_weights(ctx, init, xs, unary, base)
        elif not ctx.products:
            prev = init
            mats = xs.transpose(-1, -2)  # [.., L, K]: each step reduces over its contiguous last dimension
            for t in range(steps):
                torch.logsumexp(prev.unsqueeze(-2) + mats[:, t if xs.shape[1] > 1 else 0], -1, out=base[t])
                prev = base[t] if unary is None else base[t] + unary[:, t]
        alphas = base if unary is None else base + unary.movedim(-2, 0)
        ctx.save_for_backward(init, xs, unary, base, alphas)
        return alphas.movedim(0, -2)

    @staticmethod
    def _by_weights(ctx, init: Tensor, xs: Tensor, unary: Tensor | None, base: Tensor) -> None:
        """Per-step matrices, gradients wanted: each step keeps ``exp(sums - column max)`` in one
        buffer the size of ``xs``, from which the backward gets the gradient of ``xs`` without an
        exp (each column's softmax is these over their sum)."""
        low = torch.finfo(xs.dtype).min
        weights = torch.empty_like(xs, memory_format=torch.contiguous_format)  # [B, T, K, L]
        sums = xs.new_empty(base.shape)  # [T, B, L]; each >= 1 (the max term is exp(0)), or 0 if all are -inf
        prev = init
        for t, (w, x) in enumerate(zip(weights.unbind(1), xs.unbind(1))):
            torch.add(prev.unsqueeze(-1), x, out=w)  # [B, K, L]: reduced over K, not the innermost dimension
            m = torch.amax(w, -2).clamp_min_(low)  # a column of -inf stays -inf - low = -inf: exp 0
            w.sub_(m.unsqueeze(-2)).exp_()
            torch.sum(w, -2, out=sums[t])
            torch.log(sums[t], out=base[t]).add_(m)
            prev = base[t] if unary is None else base[t] + unary[:, t]
        ctx.weights, ctx.sums = weights, sums

    @staticmethod
    def _by_products(ctx, init: Tensor, xs: Tensor, unary: Tensor | None, base: Tensor) -> bool:
        low = torch.finfo(xs.dtype).min
        x = xs[0, 0]  # [K, L]
        mx = x.amax(0).clamp_min(low)
        E = (x - mx).exp()
        shifted, sums, worst = [], [], xs.new_ones(())
        prev = init
        for t in range(base.shape[0]):
            ma = prev.amax(-1, keepdim=True).clamp_min(low)
            a = (prev - ma).exp()
            r = a @ E  # [B, L]
            worst = torch.minimum(worst, r.amin())
            torch.add(r.log(), ma, out=base[t]).add_(mx)
            shifted.append(a)
            sums.append(r)
            prev = base[t] if unary is None else base[t] + unary[:, t]
        if bool(worst < torch.finfo(xs.dtype).tiny ** 0.8):
            return False
        ctx.E, ctx.shifted, ctx.sums = E, shifted, sums
        return True

    @staticmethod
    def backward(ctx, grad: Tensor):
        init, xs, unary, base, alphas = ctx.saved_tensors
        if torch.is_grad_enabled():
            return (*_scan_grad(Log, grad, init, xs, unary), None)
        if ctx.triton:
            return (*triton_scan.backward(init, xs, unary, alphas, base, grad, is_max=False), None)
        if ctx.cpu:
            if ctx.weights is None:  # (a forward that did not expect a backward)
                _, ctx.weights, ctx.sums = cpu_scan.forward(init, xs, unary, is_max=False, keep=True)
            return (*cpu_scan.backward(init, xs, unary, alphas, ctx.weights, ctx.sums, grad, is_max=False), None)
        steps = base.shape[0]
        carry = torch.zeros_like(init)
        gu = torch.empty_like(grad) if unary is not None else None
        if ctx.products:
            gE = torch.zeros_like(ctx.E)
            for t in range(steps - 1, -1, -1):
                g = grad[:, t] + carry
                if gu is not None:
                    gu[:, t] = g
                q = g / ctx.sums[t]
                gE += ctx.shifted[t].transpose(0, 1) @ q
                carry = ctx.shifted[t] * (q @ ctx.E.transpose(0, 1))
            return carry, (ctx.E * gE).reshape(xs.shape), gu, None
        if ctx.weights is not None:  # the gradient is the stored weights reweighed (kept: a second backward gives the same bits)
            gx = torch.empty_like(ctx.weights)
            for t, w, out in zip(range(steps - 1, -1, -1), reversed(ctx.weights.unbind(1)), reversed(gx.unbind(1))):
                g = grad[:, t] + carry
                if gu is not None:
                    gu[:, t] = g
                torch.mul(w, (g / ctx.sums[t].clamp_min(1)).unsqueeze(-2), out=out)  # a column of sum 0 has weights 0
                carry = out.sum(-1)
            return carry, gx, gu, None
        per_step = xs.shape[1] > 1  # else one matrix [1, 1, K, L] for every step and example
        gx = torch.empty_like(xs) if per_step else None
        total = None
        safe = _finite_or_zero(base)  # where every path is forbidden, exp(-inf - 0) = 0, not NaN
        for t in range(steps - 1, -1, -1):
            g = grad[:, t] + carry
            if gu is not None:
                gu[:, t] = g
            w = gx[:, t] if gx is not None else torch.empty_like(safe[t].unsqueeze(-2) + xs[:, 0])
            torch.add((alphas[t - 1] if t else init).unsqueeze(-1), xs[:, t if per_step else 0], out=w)
            w.sub_(safe[t].unsqueeze(-2)).exp_().mul_(g.unsqueeze(-2))
            if gx is None:
                total = w.sum(0) if total is None else total + w.sum(0)
            carry = w.sum(-1)
        return carry, (gx if gx is not None else total.reshape(xs.shape)), gu, None


class _MaxScan(torch.autograd.Function):
    """``Semiring.scan`` in the Max semiring as one autograd node (on a GPU one Triton launch each
    way, on the CPU one C call each way, the same float operations as below). The forward keeps values only
    (``amax``, no indices) and reduces over the from-state, which is not the innermost dimension of
    the matrices, so the max runs vectorized across the to-states; the backward is Viterbi's
    backtrace as a gradient: at each step it finds the argmax only for the states the incoming
    gradient touches (one per example on a best path), from the same sums the forward maximized,
    so the two agree exactly."""

    @staticmethod
    def forward(ctx, init: Tensor, xs: Tensor, unary: Tensor | None) -> Tensor:
        ctx.triton = triton_scan.applies(init, xs, unary)
        if ctx.triton:
            alphas, _ = triton_scan.forward(init, xs, unary, is_max=True)
            ctx.save_for_backward(init, xs, unary, alphas)
            return alphas
        ctx.cpu = cpu_scan.applies(init, xs, unary, log=False)
        if ctx.cpu:
            alphas, _, _ = cpu_scan.forward(init, xs, unary, is_max=True, keep=False)
            ctx.save_for_backward(init, xs, unary, alphas)
            return alphas
        steps, _ = _scan_shapes(init, xs, unary)
        per_step = xs.shape[1] > 1  # else one matrix [*, 1, K, L] for every step
        alphas = xs.new_empty(steps, *init.shape[:-1], xs.shape[-1])  # time-major: one block a step
        work = xs.new_empty(*init.shape, xs.shape[-1])  # [B, K, L]: the sums of one step, reused
        mats = xs.unbind(1) if per_step else [xs[:, 0]] * steps
        outs, units = alphas.unbind(0), (unary.unbind(1) if unary is not None else None)
        prev = init
        for t in range(steps):
            torch.add(prev.unsqueeze(-1), mats[t], out=work)
            torch.amax(work, -2, out=outs[t])
            if units is not None:
                outs[t].add_(units[t])
            prev = outs[t]
        ctx.save_for_backward(init, xs, unary, alphas)
        return alphas.movedim(0, -2)

    @staticmethod
    def backward(ctx, grad: Tensor):
        init, xs, unary, alphas = ctx.saved_tensors
        if torch.is_grad_enabled():
            return _scan_grad(Max, grad, init, xs, unary)
        if ctx.triton:
            return triton_scan.backward(init, xs, unary, alphas, alphas, grad, is_max=True)
        if ctx.cpu:
            return cpu_scan.backward(init, xs, unary, alphas, None, None, grad, is_max=True)
        per_step = xs.shape[1] > 1
        nonzero = grad != 0
        if _on_host(grad) and bool(nonzero.flatten(1).sum(1).le(1).all()):  # each example's gradient is one best path
            return _MaxScan._path(init, xs, unary, alphas, grad, nonzero, ctx.needs_input_grad[1])
        gx = torch.zeros_like(xs) if per_step else torch.zeros_like(xs[0, 0])
        mats = xs.transpose(-1, -2)  # [.., L, K]
        gu = torch.empty_like(grad) if unary is not None else None
        carry = torch.zeros_like(init)
        for t in range(alphas.shape[0] - 1, -1, -1):  # a gradient spread over states: full backpointers
            g = grad[:, t] + carry
            if gu is not None:
                gu[:, t] = g
            prev = alphas[t - 1] if t else init
            back = (prev.unsqueeze(-2) + (mats[:, t] if per_step else mats[0, 0])).argmax(-1)  # [B, L]
            carry = torch.zeros_like(init).scatter_add_(-1, back, g)
            if per_step:
                gx[:, t].scatter_(-2, back.unsqueeze(-2), g.unsqueeze(-2))
            else:
                gx.scatter_add_(0, back, g)
        return carry, (gx if per_step else gx.reshape(xs.shape)), gu

    @staticmethod
    def _path(init, xs, unary, alphas, grad, nonzero, need_xs: bool):
        """The backtrace when each example's gradient is one entry (weight w at step t0, state c0):
        follow one state per example down the steps, no per-step synchronization; the gradients are
        written once at the end from the states and weights of every step."""
        B, T, L = grad.shape
        per_step = xs.shape[1] > 1
        rows = torch.arange(B, device=grad.device)
        flat = nonzero.flatten(1).to(torch.int8).argmax(1)  # [B]: t0 * L + c0 (0 where none)
        t0, c0 = flat // L, flat % L
        w0 = grad.flatten(1)[rows, flat]
        starts = set(t0.tolist())
        columns = None if per_step else xs[0, 0].t().contiguous()  # [L, K]: row c holds the scores into state c
        w, c = torch.zeros_like(w0), c0
        states, froms, weights = [None] * T, [None] * T, [None] * T
        prevs = [init, *alphas.unbind(0)]
        for t in range(T - 1, -1, -1):
            if t in starts:  # examples whose path begins here
                here = t0 == t
                w, c = torch.where(here, w0, w), torch.where(here, c0, c)
            y = torch.add(prevs[t], xs[rows, t, :, c] if per_step else columns.index_select(0, c)).argmax(-1)
            states[t], froms[t], weights[t] = c, y, w
            c = y
        cs, ws = torch.stack(states, 1), torch.stack(weights, 1)  # [B, T]
        gu = torch.zeros_like(grad).scatter_(-1, cs.unsqueeze(-1), ws.unsqueeze(-1)) if unary is not None else None
        gx = None
        if need_xs:
            ys = torch.stack(froms, 1)
            if per_step:
                gx = torch.zeros_like(xs)
                gx.view(B, T, -1).scatter_(-1, (ys * L + cs).unsqueeze(-1), ws.unsqueeze(-1))
            else:
                gx = torch.zeros_like(xs[0, 0]).index_put_((ys.flatten(), cs.flatten()), ws.flatten(), accumulate=True).reshape(xs.shape)
        carry = torch.zeros_like(init)
        carry[rows, c] = w
        return carry, gx, gu


def _reduce_to(t: Tensor, shape: torch.Size) -> Tensor:
    """Sum ``t`` over the dimensions along which a tensor of ``shape`` was broadcast."""
    if t.shape == shape:
        return t
    lead = t.dim() - len(shape)
    dims = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and t.shape[lead + i] != 1]
    return t.sum(dims, keepdim=True).reshape(shape) if dims else t


class LogSemiring(Semiring):
    """logsumexp / +. The program's value is the log-partition; its gradient is the marginals."""

    name = "Log"

    def convert(self, x: Tensor) -> Tensor:
        return x

    def zero(self, shape, like):
        return torch.full(tuple(shape), NEG_INF, dtype=like.dtype, device=like.device)

    def one(self, shape, like):
        return torch.zeros(tuple(shape), dtype=like.dtype, device=like.device)

    def times(self, a, b):
        return a + b

    def sum(self, x, dim):
        return _LogSumExp.apply(x, dim)

    def scan(self, init, xs, unary=None):
        differentiated = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (init, xs, unary))
        return _LogScan.apply(init, xs, unary, differentiated)

    def dot(self, a, b, dim):
        if dim == -1 and a.dim() >= 3 and b.dim() >= 3:  # [*, B, L, K]: a row shared by L, a matrix shared by B
            if a.shape[-2] == 1 and b.shape[-2] > 1 and b.shape[-3] == 1 < a.shape[-3]:
                return _log_matvec(a, b)
            if b.shape[-2] == 1 and a.shape[-2] > 1 and a.shape[-3] == 1 < b.shape[-3]:
                return _log_matvec(b, a)
        return _LogDot.apply(a, b, dim)


class _MaxSum(torch.autograd.Function):
    """max over ``dim`` whose forward keeps values only (``amax`` is several times cheaper than max
    with indices) and whose backward finds the argmax of the slices the gradient reaches (every
    slice, or only those of nonzero gradient where they are few: a goal read at one length per
    example). Ties go to the first maximum, as ``max``. The backward is written in differentiable
    ops of the gradient, so gradients of gradients (zero through ``x``) work."""

    @staticmethod
    def forward(ctx, x: Tensor, dim: int) -> Tensor:
        ctx.dim = dim
        ctx.save_for_backward(x)
        return torch.amax(x, dim)

    @staticmethod
    def backward(ctx, g: Tensor):
        (x,) = ctx.saved_tensors
        x, dim = x.detach(), ctx.dim % x.dim()
        xm, gm = x.movedim(dim, -1), g.unsqueeze(dim).movedim(dim, -1)  # the reduced dimension last
        gm = gm.expand(*xm.shape[:-1], 1)
        hit = gm.detach().squeeze(-1) != 0
        out = torch.zeros_like(xm)
        if _on_host(hit) and int(hit.sum()) * 4 < hit.numel():  # few slices matter: their argmax only
            where = hit.nonzero(as_tuple=True)
            best = xm[where].argmax(-1, keepdim=True)
            out = out.index_put((*where,), torch.zeros_like(xm[where]).scatter(-1, best, gm[where]))
        else:
            out = out.scatter(-1, xm.max(-1, keepdim=True).indices, gm)  # max: faster than argmax on CPU
        return out.movedim(-1, dim), None


class MaxSemiring(LogSemiring):
    """max / +. The value is the best score; its gradient is the argmax structure."""

    name = "Max"

    def sum(self, x, dim):
        return _MaxSum.apply(x, dim)

    def dot(self, a, b, dim):
        return _MaxSum.apply(a + b, dim)

    def scan(self, init, xs, unary=None):
        return _MaxScan.apply(init, xs, unary)


class _SampledSum(torch.autograd.Function):
    """Forward: logsumexp. Backward: route the incoming count to one summand drawn from the softmax.

    Run top-down through a chart, the backward pass is forward-filtering backward-sampling: the
    gradient of the goal is the one-hot indicator of an exact sample.
    """

    @staticmethod
    def forward(ctx, x: Tensor, dim: int, generator: torch.Generator | None) -> Tensor:
        out = torch.logsumexp(x, dim)
        ctx.dim, ctx.generator = dim, generator
        ctx.save_for_backward(x)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: Tensor):
        (x,) = ctx.saved_tensors
        dim = ctx.dim
        u = torch.rand(x.shape, dtype=x.dtype, device=x.device, generator=ctx.generator).clamp_min_(torch.finfo(x.dtype).tiny)
        choice = (x - (-u.log()).log()).argmax(dim, keepdim=True)  # Gumbel-max: an exact draw
        onehot = torch.zeros_like(x).scatter_(dim, choice, 1.0)
        return onehot * g.unsqueeze(dim), None, None


class SampledSemiring(LogSemiring):
    """logsumexp / +, whose gradient is an exact sample instead of the marginals.

    Draw many samples at once by giving the program a batch of copies of the potentials. The draws
    use ``generator`` (a ``torch.Generator`` on the potentials' device; default: torch's global one).
    """

    name = "Sampled"

    def __init__(self, generator: torch.Generator | None = None):
        self.generator = generator

    def sum(self, x, dim):
        return _SampledSum.apply(x, dim, self.generator)

    def dot(self, a, b, dim):
        return self.sum(a + b, dim)

    scan = Semiring.scan  # its backward draws: the plain loop of its own sums


class RealSemiring(Semiring):
    """``+`` / × in linear space. Exact for small problems; underflows on long ones."""

    name = "Real"

    def convert(self, x):
        return x.exp()

    def zero(self, shape, like):
        return torch.zeros(tuple(shape), dtype=like.dtype, device=like.device)

    def one(self, shape, like):
        return torch.ones(tuple(shape), dtype=like.dtype, device=like.device)

    def plus(self, a, b):
        return a + b

    def times(self, a, b):
        return a * b

    def sum(self, x, dim):
        return x.sum(dim)


    def lift(self, v: Tensor) -> Tensor:
        """The element of a real constant (any sign)."""
        return v


class CountSemiring(RealSemiring):
    """The number of structures of finite score (a potential of -inf removes a part), in float64."""

    name = "Count"

    def convert(self, x):
        return torch.isfinite(x).to(torch.float64)

    def zero(self, shape, like):
        return torch.zeros(tuple(shape), dtype=torch.float64, device=like.device)

    def one(self, shape, like):
        return torch.ones(tuple(shape), dtype=torch.float64, device=like.device)


class SignedLogSemiring(Semiring):
    """Real numbers of either sign in log space (Li & Eisner 2009; Table 1 of Kim et al. 2017).

    An element is ``stack([log|a|, sign a])`` (component dimension 2, sign in {-1, +1}; zero is
    ``(-inf, +1)``). ⊗ adds the logs and multiplies the signs. ⊕ of equal signs is
    ``l_a + log1p(d)``, of opposite signs ``l_a + log1p(-d)``, ``d = exp(l_b - l_a)``, ``|a| ≥ |b|``,
    taking the sign of ``a``; so ``a ⊕ (−a)`` is an exact zero.
    """

    extra = 1
    name = "SignedLog"

    def convert(self, x):
        return torch.stack([x, torch.ones_like(x)])

    @staticmethod
    def from_real(x: Tensor) -> Tensor:
        """The element of a real (signed, linear-space) tensor."""
        return torch.stack([x.abs().log(), torch.where(x < 0, -1.0, 1.0).to(x.dtype)])

    @staticmethod
    def to_real(a: Tensor) -> Tensor:
        """The real (signed, linear-space) tensor of an element: ``sign a * exp(log|a|)``."""
        return a[1] * a[0].exp()

    def lift(self, v: Tensor) -> Tensor:
        """The element of a real constant (any sign)."""
        return self.from_real(v)

    def zero(self, shape, like):
        return torch.stack([torch.full(tuple(shape), NEG_INF, dtype=like.dtype, device=like.device),
                            torch.ones(tuple(shape), dtype=like.dtype, device=like.device)])

    def one(self, shape, like):
        return torch.stack([torch.zeros(tuple(shape), dtype=like.dtype, device=like.device),
                            torch.ones(tuple(shape), dtype=like.dtype, device=like.device)])

    def times(self, a, b):
        return torch.stack([a[0] + b[0], a[1] * b[1]])

    def plus(self, a, b):
        a, b = torch.broadcast_tensors(a, b)
        a_bigger = a[0] >= b[0]
        hi = torch.where(a_bigger, a[0], b[0])
        lo = torch.where(a_bigger, b[0], a[0])
        sign = torch.where(a_bigger, a[1], b[1])
        same = a[1] == b[1]
        return self._combine(hi, lo, sign, same)

    @staticmethod
    def _combine(hi: Tensor, lo: Tensor, sign: Tensor, same: Tensor) -> Tensor:
        d = (lo - _finite_or_zero(hi)).exp()  # in [0, 1]; 0 when both are zero
        log_mag = _finite_or_zero(hi) + torch.log1p(torch.where(same, d, -d))  # one branch: no inf gradient from the other
        log_mag = torch.where(torch.isfinite(hi), log_mag, hi)
        sign = torch.where(torch.isneginf(log_mag), torch.ones_like(sign), sign)
        return torch.stack([log_mag, sign])

    def sum(self, x, dim):
        d = dim - 1 if dim >= 0 else dim
        pos = _LogSumExp.apply(x[0].masked_fill(x[1] < 0, NEG_INF), d)
        neg = _LogSumExp.apply(x[0].masked_fill(x[1] > 0, NEG_INF), d)
        pos_bigger = pos >= neg
        hi = torch.where(pos_bigger, pos, neg)
        lo = torch.where(pos_bigger, neg, pos)
        sign = torch.where(pos_bigger, 1.0, -1.0).to(x.dtype)
        return self._combine(hi, lo, sign, torch.zeros_like(pos_bigger))


class Expectation(Semiring):
    """The first-order expectation semiring (Li & Eisner 2009) over a signed ``base``.

    An element is a pair ``(p, r)`` of base elements (a leading component dimension of 2):
    ``(p1, r1) ⊕ (p2, r2) = (p1 + p2, r1 + r2)``, ``(p1, r1) ⊗ (p2, r2) = (p1 p2, p1 r2 + p2 r1)``.
    Converting a part with potential θ and value v gives ``(e^θ, e^θ v)``; the goal is then
    ``(Z, Σ_z e^⟨θ,z⟩ ⟨v, z⟩)``, so ``r / p`` is the expectation of the additive function ⟨v, z⟩.
    Over ``SignedLog`` the signed sums stay exact in log space where ``Real`` underflows.
    """

    def __init__(self, base: Semiring):
        if not hasattr(base, "lift"):
            raise ValueError(f"base: expected a semiring that holds signed reals (Real, SignedLog), got {base}")
        self.base = base
        self.extra = base.extra + 1
        self.name = f"Expectation({base})"

    def convert(self, x):
        p = self.base.convert(x)
        return torch.stack([p, self.base.zero(x.shape, x)])

    def pair(self, x: Tensor, v: Tensor) -> Tensor:
        """The element ``(e^x, e^x v)`` of parts with potentials ``x`` and values ``v``."""
        p = self.base.convert(x)
        return torch.stack([p, self.base.times(p, self.base.lift(v.to(x.dtype)))])

    def zero(self, shape, like):
        z = self.base.zero(shape, like)
        return torch.stack([z, z])

    def one(self, shape, like):
        return torch.stack([self.base.one(shape, like), self.base.zero(shape, like)])

    def plus(self, a, b):
        return torch.stack([self.base.plus(a[0], b[0]), self.base.plus(a[1], b[1])])

    def times(self, a, b):
        b_ = self.base
        return torch.stack([b_.times(a[0], b[0]), b_.plus(b_.times(a[0], b[1]), b_.times(a[1], b[0]))])

    def sum(self, x, dim):
        return torch.stack([self.base.sum(x[0], dim), self.base.sum(x[1], dim)])


class KMax(Semiring):
    """top-k / +. Component dimension k holds the k best values, best first.

    The gradient of the j-th value is the j-th best structure (ties broken arbitrarily, each slot
    a distinct derivation); slots beyond the number of structures hold -inf.
    """

    extra = 1

    def __init__(self, k: int):
        if k < 1:
            raise ValueError(f"k: expected a positive integer, got {k}")
        self.k = k
        self.name = f"KMax({k})"

    def convert(self, x):
        rest = torch.full((self.k - 1, *x.shape), NEG_INF, dtype=x.dtype, device=x.device)
        return torch.cat([x.unsqueeze(0), rest])

    def zero(self, shape, like):
        return torch.full((self.k, *shape), NEG_INF, dtype=like.dtype, device=like.device)

    def one(self, shape, like):
        z = self.zero(shape, like)
        z[0] = 0.0
        return z

    def _top(self, x: Tensor) -> Tensor:
        """x: [M, *rest] -> the k largest along the first dimension, sorted."""
        if x.shape[0] < self.k:
            pad = torch.full((self.k - x.shape[0], *x.shape[1:]), NEG_INF, dtype=x.dtype, device=x.device)
            x = torch.cat([x, pad])
        return x.topk(self.k, dim=0).values

    def plus(self, a, b):
        a, b = torch.broadcast_tensors(a, b)
        return self._top(torch.cat([a, b]))

    def times(self, a, b):
        s = a.unsqueeze(1) + b.unsqueeze(0)
        return self._top(s.reshape(-1, *s.shape[2:]))

    def sum(self, x, dim):
        x = x.movedim(dim, 1)
        return self._top(x.reshape(-1, *x.shape[2:]))


class Derivations(Semiring):
    """Sets of derivations, explicitly: for enumerating every structure of a small problem.

    Every entry of the inputs (per example) is a *part* with its own id, numbered input by input
    in the order the program converts them. An element has component dimensions
    ``[capacity, 1 + num_parts]``: each of ``capacity`` slots is absent (column 0 is 0) or holds one
    derivation as the multiplicity of every part in it. ⊕ is the union of the slots, ⊗ pairs every
    derivation of one side with every derivation of the other. A set that outgrows ``capacity``
    raises ``OverflowError``.
    """

    extra = 2

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.name = f"Derivations({capacity})"
        self.part_sizes: list[int] = []
        self._next = 0

    @property
    def num_parts(self) -> int:
        return sum(self.part_sizes)

    def prepare(self, inputs):
        self.part_sizes = [x[0].numel() if x.dim() else 1 for x in inputs]
        self._next = 0

    def convert(self, x):
        size = x[0].numel()
        ids = torch.arange(size, device=x.device).reshape(x.shape[1:]) + sum(self.part_sizes[: self._next])
        self._next += 1
        onehot = (ids.unsqueeze(-1) == torch.arange(self.num_parts, device=x.device)).to(torch.float32)  # [*rest, P]
        slot = torch.cat([torch.ones(*onehot.shape[:-1], 1), onehot], -1).movedim(-1, 0)  # [1+P, *rest]
        slot = slot.unsqueeze(1).expand(-1, x.shape[0], *x.shape[1:])  # [1+P, B, *rest]
        elem = torch.zeros(self.capacity, *slot.shape, device=x.device)
        elem[0] = slot
        return elem

    def zero(self, shape, like):
        return torch.zeros(self.capacity, 1 + self.num_parts, *shape, device=like.device)

    def one(self, shape, like):
        z = self.zero(shape, like)
        z[0, 0] = 1.0
        return z

    def _compact(self, x: Tensor) -> Tensor:
        present = x[:, 0] > 0
        if present.sum(0).max() > self.capacity:
            raise OverflowError(f"more than {self.capacity} derivations of one item")
        order = present.to(torch.int8).argsort(dim=0, descending=True, stable=True)[: self.capacity]
        return x.gather(0, order.unsqueeze(1).expand(-1, x.shape[1], *order.shape[1:]))

    def plus(self, a, b):
        a, b = torch.broadcast_tensors(a, b)
        return self._compact(torch.cat([a, b]))

    def times(self, a, b):
        # Elements are compacted (the slots in use come first), so only the slots that some item of
        # each side uses are paired: the pairs cost (used a) x (used b), not capacity squared.
        a, b = self._used(a), self._used(b)
        presence = a[:, None, :1] * b[None, :, :1]
        s = torch.cat([presence, (a[:, None, 1:] + b[None, :, 1:]) * presence], 2)
        s = self._compact(s.reshape(-1, *s.shape[2:]))
        if s.shape[0] < self.capacity:
            s = torch.cat([s, s.new_zeros(self.capacity - s.shape[0], *s.shape[1:])])
        return s

    @staticmethod
    def _used(x: Tensor) -> Tensor:
        """The leading slots of a compacted element that hold a derivation of some item (at least one)."""
        used = int((x[:, 0] > 0).flatten(1).any(1).sum()) if x[0, 0].numel() else 0
        return x[: max(1, used)]

    def sum(self, x, dim):
        x = x.movedim(dim, 1)
        return self._compact(x.reshape(-1, *x.shape[2:]))


Log = LogSemiring()
Max = MaxSemiring()
Real = RealSemiring()
Count = CountSemiring()
SignedLog = SignedLogSemiring()
Sampled = SampledSemiring()
