"""The distribution every structure returns: one program, one tensor of log-potentials, every query.

A structure is a Gibbs distribution ``p(z) ∝ exp⟨θ, z⟩`` over the one-hot *parts* ``z`` of its
structures, ``θ = log_potentials`` (batch first). The class declares the program that sums over
those structures; everything below follows from running it in a semiring and differentiating:

=====================  ==================================================================
``log_partition``      Log semiring                                   ``[B]``
``marginals``          ∂ log Z / ∂θ (differentiable: second order works)  ``[B, *parts]``
``argmax``, ``max``    Max semiring and its gradient                 ``[B, *parts]``, ``[B]``
``topk(k)``            KMax(k) and the gradient of each of the k scores  ``[k, B, *parts]``
``sample(shape)``      Sampled semiring: forward filtering, backward sampling  ``[*shape, B, *parts]``
``count``              Count semiring                                 ``[B]``
``enumerate_support``  Derivations semiring                           ``[S, B, *parts]``
``entropy``, ``kl``    H = log Z − ⟨θ, μ⟩; KL(p‖q) = log Z_q − log Z_p + ⟨θ_p − θ_q, μ_p⟩
=====================  ==================================================================

Potentials of ``-inf`` forbid parts (constraints); with nothing left, ``log Z = -inf``, marginals
are 0 and no result is NaN. float16/bfloat16 potentials are computed in float32 and results
returned in the input dtype. Inputs are never modified.
"""

from __future__ import annotations

import math
from functools import cached_property, reduce
from typing import ClassVar, Mapping, Sequence, Union

import torch
from torch import Tensor

import semiring as sr
from semiring import Program


# The dynamic programs run eagerly inside a compiled model (a graph break): their marginals are a
# gradient taken inside the forward, and AOTAutograd supports no double backward through it.
_eager = torch.compiler.disable


def validating() -> bool:
    """Whether checks that read values (and so synchronise with the device) run: torch's
    ``Distribution`` default, on unless ``torch.distributions.Distribution.set_default_validate_args(False)``
    (a training loop that trusts its inputs). Checks of types and shapes always run."""
    return torch.distributions.Distribution._validate_args


def check_shape(name: str, x: Tensor, spec: str) -> None:
    """Raise ``ValueError`` unless ``x`` is a floating tensor of shape ``spec`` (e.g. ``"B, N-1, C, C"``):
    the right rank, and equal sizes wherever ``spec`` repeats a symbol; while :func:`validating`,
    also unless its values are finite or -inf, and small enough that sums of them cannot overflow."""
    symbols = [s.strip() for s in spec.split(",")]
    if not isinstance(x, Tensor):
        raise ValueError(f"{name}: expected a tensor of shape [{spec}], got {type(x).__name__}")
    if x.dim() != len(symbols) or any(
        x.shape[i] != x.shape[symbols.index(s)] for i, s in enumerate(symbols)
    ):
        raise ValueError(f"{name}: expected shape [{spec}], got {list(x.shape)}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"{name}: expected floating-point log-potentials, got {x.dtype}")
    if not validating():
        return
    # NaN if any is, +inf if any is: one pass, read once
    low, top = torch.stack(torch.aminmax(x.detach())).tolist() if x.numel() else (0.0, 0.0)
    if math.isnan(top):
        raise ValueError(f"{name}: contains NaN")
    if top == math.inf:
        raise ValueError(f"{name}: contains +inf (potentials are log-scores; -inf forbids a part)")
    # a structure's score sums up to one entry per part of an example: beyond this, sums overflow
    computed = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype  # half precision runs in float32
    limit = torch.finfo(computed).max / max(1, math.prod(x.shape[1:]))
    if low == -math.inf and top > -math.inf:  # the smallest finite entry needs another pass
        low = x.detach().masked_fill(torch.isneginf(x.detach()), math.inf).amin().item()
    largest = max(abs(top), abs(low)) if top > -math.inf else 0.0
    if largest > limit:
        raise ValueError(f"{name}: finite entries up to {float(largest):.3g} in magnitude; sums of them overflow "
                         f"{computed} (at most {limit:.3g} here: rescale, or use float64)")


def check_integers(name: str, x: Tensor, shape: Sequence[int], lo: int, hi: int) -> None:
    """Raise ``ValueError`` unless ``x`` is an integer tensor of ``shape`` with values (while
    :func:`validating`) in ``lo..hi``."""
    if not isinstance(x, Tensor) or x.dtype.is_floating_point or x.dtype == torch.bool or x.is_complex():
        raise ValueError(f"{name}: expected an integer tensor of shape {list(shape)}, got {getattr(x, 'dtype', type(x).__name__)}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(x.shape)}")
    if not validating():
        return
    bad = (x < lo) | (x > hi)
    if bool(bad.any()):
        raise ValueError(f"{name}: expected values in {lo}..{hi}, got {x[bad].tolist()}")


def check_tags(value: Tensor, batch: int, n: int, classes: int, lengths: Tensor) -> Tensor:
    """Tags ``value [..., B, n]`` with 0 past each example's ``lengths[b]`` (what is there is
    ignored); ``ValueError`` naming ``value`` unless they are integers of that shape in
    ``0..classes-1`` within each length."""
    if value.dim() < 2 or tuple(value.shape[-2:]) != (batch, n) or value.dtype.is_floating_point or value.dtype == torch.bool:
        raise ValueError(f"value: expected integer tags of shape [..., B, N] = [..., {batch}, {n}], got {value.dtype} {list(value.shape)}")
    inside = torch.arange(n, device=value.device) < lengths.to(value.device).unsqueeze(-1)  # [B, n]
    tags = torch.where(inside, value, 0)
    if bool(((tags < 0) | (tags >= classes)).any()):
        raise ValueError(f"value: tags must lie in 0..{classes - 1} within each length, got {value[inside.expand_as(value)].unique().tolist()}")
    return tags


Lengths = Union[Tensor, Mapping[str, Tensor], Sequence[Tensor], None]


def _inner(theta: Tensor, mu: Tensor, dims: int) -> Tensor:
    """⟨θ, μ⟩ over the last ``dims`` dimensions, with 0 · (-inf) = 0 (forbidden parts have μ = 0)."""
    prod = theta.masked_fill(~torch.isfinite(theta), 0.0) * mu
    out = prod.flatten(-dims).sum(-1) if dims else prod
    hit = ((mu > 0) & torch.isneginf(theta)).flatten(-dims).any(-1)
    return out.masked_fill(hit, -math.inf)


class StructuredDistribution(torch.distributions.Distribution):
    """Base class, a ``torch.distributions.Distribution``: ``batch_shape [B]``, ``event_shape`` the
    parts' shape, ``mean`` the marginals, ``mode`` the argmax, ``entropy()``, and
    ``torch.distributions.kl_divergence(p, q)`` (= ``p.kl(q)``). A subclass sets ``program`` (a :class:`semiring.Program` with one input) and
    ``shape`` (the potentials' shape, e.g. ``"B, N-1, C, C"``), and may override ``decode``,
    ``to_parts`` (from the decoded form) and ``__init__`` for its own constructors.

    A program may read inputs besides the potentials — *shared scores* such as a transition matrix,
    batch size 1 or B, passed as ``shared`` and named by the program. They are not parts: marginals,
    samples and structures are the potentials', but they score every structure, so a structure that
    has them names its potentials' input (``potentials``) and says how a structure uses them
    (``shared_counts``); scores, entropy, cross-entropy and KL count them.

    Integer inputs the program looks indices up from (``logp[t, ext[s]]``) are passed in ``shared``
    too: data, not scores — never converted or differentiated, and equal in ``q`` for ``kl``.

    A program with several lengths (``n`` and ``m``: an alignment of two sequences) takes
    ``lengths`` as a dict from their names to tensors ``[B]``, or as a tuple of tensors in the
    program's order of lengths; a length not given is the largest the shapes allow. ``lengths``
    then reads back as such a dict.

    A structure that is not a dynamic program sets no ``program``; it overrides ``run`` (one
    algorithm per semiring: its value must have the right gradient, e.g. ``⟨θ, best tree⟩`` for
    Max), ``_check_lengths``, ``max_length`` and ``enumerate_support``."""

    program: ClassVar[Program]
    shape: ClassVar[str]
    potentials: ClassVar[str | None] = None  # the program input holding the potentials (default: its only input)
    arg_constraints: ClassVar[dict] = {}  # the constructors check their arguments themselves
    every_decoded_value_is_a_structure: ClassVar[bool] = False  # (tags of a chain): log_prob need not check them

    def __init__(self, log_potentials: Tensor, lengths: Lengths = None, shared: dict[str, Tensor] | None = None):
        check_shape("log_potentials", log_potentials, self.shape)
        self.log_potentials = log_potentials
        self.dtype = log_potentials.dtype
        lookups = self.program.lookups if hasattr(self, "program") else []
        self._lookups = {k: v for k, v in (shared or {}).items() if k in lookups}
        scores = {k: v for k, v in (shared or {}).items() if k not in self._lookups}
        # computed in the type torch's arithmetic would give them all (float16/bfloat16 in float32)
        computed = reduce(torch.promote_types, [v.dtype for v in scores.values()], log_potentials.dtype)
        computed = torch.float32 if computed in (torch.float16, torch.bfloat16) else computed
        self._theta = log_potentials.to(computed)
        self._shared = {k: v.to(computed) for k, v in scores.items()}
        self._batch = log_potentials.shape[0]
        self._lengths = self._check_lengths(lengths)
        super().__init__(torch.Size([self._batch]), log_potentials.shape[1:])  # validate_args: torch's default

    def _check_lengths(self, lengths: Lengths) -> Tensor | dict[str, Tensor] | None:
        """Validate ``lengths`` (``ValueError`` naming it); ``None`` means every example is full length."""
        self._input = self.potentials or self.program.inputs[0]
        _, self._shapes = self.program.shapes({self._input: self._theta, **self._shared, **self._lookups})
        names = self.program.syntax.lengths
        if isinstance(lengths, (tuple, list)):
            if len(lengths) != len(names):
                raise ValueError(f"lengths: expected {len(names)} tensors [B] (for {names}), got {len(lengths)}")
            lengths = dict(zip(names, lengths))
        try:
            empty = self.program.lengths_allowed(self._shapes).size == 0
        except sr.ProgramError:  # a size 0 can leave an index without bounds
            if all(all(shape) for shape in self._shapes.values()):
                raise
            empty = True
        if empty:
            raise ValueError(f"log_potentials: shape {list(self.log_potentials.shape)} (expected [{self.shape}]) "
                             "admits no structure: a size is too small")
        return self.program.check_lengths(lengths, self._batch, self._shapes, values=validating())

    def _lookups_for(self, rows: int) -> dict[str, Tensor]:
        """The looked-up integer inputs for a batch of ``rows`` (k copies of the batch)."""
        copies = rows // max(1, self._batch)
        return {k: v.repeat(copies, *[1] * (v.dim() - 1)) if copies > 1 and v.shape[0] == self._batch else v
                for k, v in self._lookups.items()}

    def _inputs(self, theta: Tensor, expand: bool = False, detach: bool = False, constraints: bool = False) -> dict[str, Tensor]:
        """Every program input, in program order, for potentials ``theta`` (a batch of k·B rows for
        k copies of the batch); with ``expand``, shared scores of batch 1 are expanded to the batch;
        with ``detach``, they are cut from the graph (queries differentiated by θ alone); with
        ``constraints``, they keep only what they forbid (0, or -inf where they are -inf)."""
        copies = theta.shape[0] // max(1, self._batch)
        out = {self._input: theta}
        for name, v in self._shared.items():
            v = v.detach() if detach else v
            if constraints:
                v = torch.zeros_like(v).masked_fill(torch.isneginf(v), -math.inf).to(theta.dtype)
            if v.shape[0] == self._batch and copies > 1:
                v = v.repeat(copies, *[1] * (v.dim() - 1))
            out[name] = v.expand(theta.shape[0], *v.shape[1:]) if expand else v
        return {name: out[name] for name in self.program.inputs}

    @property
    def max_length(self) -> int:
        """The length of a full example (the default of ``lengths``)."""
        return int(self.program.lengths_allowed(self._shapes).max())

    # ------------------------------------------------------------------ plumbing

    @property
    def lengths(self) -> Tensor | dict[str, Tensor]:
        """``[B]``: each example's length (the default is the longest the potentials allow); for a
        program with several lengths, a dict from their names to ``[B]``."""
        if hasattr(self, "program") and len(self.program.syntax.lengths) > 1:
            given = self._lengths or {}
            top = self.program.length_ranges(self._shapes)
            return {k: given[k] if given.get(k) is not None else
                    torch.full((self._batch,), top[k][1], dtype=torch.long, device=self._theta.device) for k in top}
        if self._lengths is not None:
            return self._lengths
        return torch.full((self._batch,), self.max_length, dtype=torch.long, device=self._theta.device)

    @property
    def _part_dims(self) -> int:
        return self._theta.dim() - 1

    def run(self, semiring: sr.Semiring, theta: Tensor | None = None, lengths: Tensor | None = None) -> Tensor:
        """Run the structure's program in ``semiring``: ``[*components, B]``. Given potentials ``theta``
        (a query differentiating by them), the shared scores are detached from the graph."""
        inputs = self._inputs(self._theta) if theta is None else self._inputs(theta, detach=True)
        return self._run(semiring, inputs, lengths)

    @_eager
    def _run(self, semiring: sr.Semiring, inputs: dict[str, Tensor], lengths: Tensor | None = None) -> Tensor:
        """Run the program on every input given (program order): ``[*components, batch]``."""
        lengths = self._lengths if lengths is None else lengths
        semiring.prepare(list(inputs.values()))
        rows = inputs[self._input].shape[0]
        if rows == 0:  # an empty batch: nothing to run; ``[*components, 0]``, a function of the inputs
            tie = sum(x.sum() for x in inputs.values() if x.dtype.is_floating_point)
            return semiring.zero((0,), inputs[self._input]) + 0 * tie
        elements = {name: semiring.convert(x) for name, x in inputs.items()}
        return self.program.run(semiring, {**elements, **self._lookups_for(rows)}, lengths, rows, self._shapes)

    def _out(self, t: Tensor) -> Tensor:
        return t.to(self.dtype) if t.dtype.is_floating_point and t.dtype != torch.float64 else t

    @_eager
    def _grad(self, semiring: sr.Semiring, theta: Tensor | None = None, lengths: Tensor | None = None):
        """(value, ∂ value / ∂θ) of the program in ``semiring``, θ detached."""
        with torch.enable_grad():  # these queries are gradients, also under torch.no_grad()
            x = (self._theta if theta is None else theta).detach().requires_grad_()
            value = self.run(semiring, x, lengths)
            return value.detach(), self._derivative(value, x)

    def _derivative(self, value: Tensor, x: Tensor, **grad_options) -> Tensor:
        """∂ Σ value / ∂x per example: 0 for an example with no structure left (a value of -inf,
        whatever path the program took to it) and everywhere when no part exists (nothing to read)."""
        if not value.requires_grad:
            return torch.zeros_like(x)
        (g,) = torch.autograd.grad(value.sum(), x, **grad_options)
        finite = torch.isfinite(value)
        if bool(finite.all()):
            return g
        return g * finite.reshape(-1, *[1] * self._part_dims)

    # ------------------------------------------------------------------ queries

    @cached_property
    def log_partition(self) -> Tensor:
        """``[B]``: log Σ_z exp⟨θ, z⟩."""
        return self._out(self.run(sr.Log))

    @cached_property
    def partition(self) -> Tensor:
        return self.log_partition.exp()

    @cached_property
    def marginals(self) -> Tensor:
        """``[B, *parts]``: p(part in z). Differentiable w.r.t. the potentials (second order works)."""
        return self._out(self._marginals_exact())

    @cached_property
    def shared_marginals(self) -> dict[str, Tensor]:
        """``{name: [B, *shape]}``: the expected use of every shared score by a structure (∂ log Z by
        it, per example), as ``marginals`` is of the potentials; ``{}`` without shared scores."""
        return {n: self._out(m) for n, m in self._expected_counts().items() if n != self._input}

    @cached_property
    def max(self) -> Tensor:
        """``[B]``: the best score max_z ⟨θ, z⟩."""
        return self._out(self.run(sr.Max))

    @cached_property
    def argmax(self) -> Tensor:
        """``[B, *parts]``: the one-hot parts of a best structure (0 where no structure remains)."""
        return self._out(self._grad(sr.Max)[1])

    def topk(self, k: int) -> Tensor:
        """``[k, B, *parts]``: the k best structures, best first (slots past the count are 0)."""
        with torch.enable_grad():
            x = self._theta.detach().requires_grad_()
            scores = self.run(sr.KMax(k), x)
            rows = [self._derivative(scores[j], x, retain_graph=j + 1 < k) for j in range(k)]
        return self._out(torch.stack(rows))

    def topk_scores(self, k: int) -> Tensor:
        """``[k, B]``: the k best scores (``-inf`` past the count)."""
        return self._out(self.run(sr.KMax(k)))

    def sample(self, sample_shape: Sequence[int] = (), generator: torch.Generator | None = None) -> Tensor:
        """``[*sample_shape, B, *parts]``: exact, independent samples (one-hot parts), drawn with
        ``generator`` (a ``torch.Generator`` on the potentials' device; default: torch's global one)."""
        shape = _sample_shape(sample_shape)
        theta = self._theta.detach()
        n = shape.numel()
        if n == 0:
            return self._out(theta.new_zeros(*shape, *theta.shape))
        many = theta.unsqueeze(0).expand(n, *theta.shape).reshape(n * self._batch, *theta.shape[1:])
        _, g = self._grad(sr.SampledSemiring(generator), many, _repeat(self._lengths, n))
        return self._out(g.reshape(*shape, *theta.shape))

    def to_parts(self, value: Tensor) -> Tensor:
        """The one-hot parts of a structure given in its decoded form (see ``decode``)."""
        raise NotImplementedError(f"{type(self).__name__} takes values as one-hot parts only")

    def shared_counts(self, parts: Tensor) -> dict[str, Tensor]:
        """How often structures given as one-hot parts ``[..., B, *parts]`` use each shared score:
        ``{name: [..., B, *shape]}`` (structures with shared scores override this)."""
        if self._shared:
            raise NotImplementedError(f"{type(self).__name__} has shared scores but no shared_counts")
        return {}

    def score(self, value: Tensor) -> Tensor:
        """``[..., B]``: the score of structures ``z`` (one-hot parts, or the decoded form): ⟨θ, z⟩,
        plus the shared scores they use."""
        parts = value if value.dtype.is_floating_point else self.to_parts(value)
        if parts.shape[-self._theta.dim():] != self._theta.shape:
            raise ValueError(f"value: expected one-hot parts of shape [..., {', '.join(map(str, self._theta.shape))}], got {list(parts.shape)}")
        parts = parts.to(self._theta.dtype)
        total = _inner(self._theta, parts, self._part_dims)
        inputs = self._inputs(self._theta, expand=True)
        for name, counts in self.shared_counts(parts).items():
            total = total + _inner(inputs[name], counts.to(self._theta.dtype), inputs[name].dim() - 1)
        return total

    def log_prob(self, value: Tensor) -> Tensor:
        """``[..., B]``: log p(z) for structures ``z`` (one-hot parts, or the decoded form); -inf for a
        structure of score -inf and, while ``validate_args`` holds (torch's default), for a value that
        is not a structure of the example (``is_structure``)."""
        score = self.score(value)
        out = (score - self.run(sr.Log)).masked_fill(torch.isneginf(score), -math.inf)
        if self._validate_args and (value.dtype.is_floating_point or not self.every_decoded_value_is_a_structure):
            out = out.masked_fill(~self.is_structure(value if value.dtype.is_floating_point else self.to_parts(value)), -math.inf)
        return self._out(out)

    def is_structure(self, parts: Tensor) -> Tensor:
        """``[..., B]`` bool: whether one-hot parts ``[..., B, *parts]`` are a structure of each
        example, at its lengths, whatever its potentials (shared scores of -inf still forbid what
        they forbid in the program: they are its constraints): the parts are 0 or 1, and the best
        structure that uses only parts the value has has as many parts as the value (one Max run
        with every part of the value scored 1, the others -inf)."""
        theta = self._theta
        if parts.shape[-theta.dim():] != theta.shape:
            raise ValueError(f"value: expected one-hot parts of shape [..., {', '.join(map(str, theta.shape))}], got {list(parts.shape)}")
        lead = parts.shape[: parts.dim() - theta.dim()]
        copies = math.prod(lead)
        flat = parts.detach().reshape(copies * self._batch, *theta.shape[1:]).to(torch.float64)
        binary = ((flat == 0) | (flat == 1)).flatten(1).all(1)
        allowed = torch.zeros_like(flat).masked_fill(flat == 0, -math.inf) + flat
        lengths = _repeat(self._lengths, copies)
        if self._shared:
            best = self._run(sr.Max, self._inputs(allowed, detach=True, constraints=True), lengths)
        else:
            best = self.run(sr.Max, allowed, lengths)
        return (binary & (best == flat.flatten(1).sum(1))).reshape(*lead, self._batch)

    def entropy(self) -> Tensor:
        """``[B]``: H(p) = log Z − ⟨θ, μ⟩ (0 where no structure remains: p and μ are 0)."""
        return self._entropy

    @cached_property
    def _entropy(self) -> Tensor:
        return self._out(self._cross_entropy(self, self._expected_counts()))

    @property
    def mean(self) -> Tensor:
        """``[B, *parts]``: E[z], the marginals."""
        return self.marginals

    @property
    def mode(self) -> Tensor:
        """``[B, *parts]``: a most probable structure, the argmax."""
        return self.argmax

    @property
    def variance(self) -> Tensor:
        """``[B, *parts]``: the variance of each part's 0/1 indicator, μ (1 − μ)."""
        return self.marginals * (1 - self.marginals)

    def cross_entropy(self, q: "StructuredDistribution") -> Tensor:
        """``[B]``: −E_p[log q(z)] = log Z_q − ⟨θ_q, μ_p⟩ (``+inf`` where p puts mass q forbids,
        also where q's support is smaller: single root against several root children)."""
        self._check_same(q)
        return self._out(self._cross_entropy(q, self._expected_counts()))

    def kl(self, q: "StructuredDistribution") -> Tensor:
        """``[B]``: KL(p‖q) = log Z_q − log Z_p + ⟨θ_p − θ_q, μ_p⟩."""
        self._check_same(q)
        mu = self._expected_counts()
        return self._out(self._cross_entropy(q, mu) - self._cross_entropy(self, mu))

    def _cross_entropy(self, q: "StructuredDistribution", mu: dict[str, Tensor]) -> Tensor:
        """log Z_q − Σ ⟨score_q, μ⟩ over every input for the expected counts μ of this distribution:
        ``+inf`` where μ is on a part q forbids, 0 where this distribution has no structure."""
        inputs = q._inputs(q._theta, expand=True)
        inner = sum(_inner(inputs[name], m, m.dim() - 1) for name, m in mu.items())
        out = (q.run(sr.Log) - inner).masked_fill(torch.isneginf(inner), math.inf)
        if q._support_flags() != self._support_flags():  # e.g. q single root, p not: p's mass outside q's support
            allowed = torch.zeros_like(self._theta).masked_fill(torch.isneginf(self._theta), -math.inf).detach()
            out = out.masked_fill(q.run(sr.Count, allowed) < self.count, math.inf)
        return out.masked_fill(torch.isneginf(self.run(sr.Log)), 0.0)

    def _support_flags(self) -> tuple:
        """What, besides the potentials, shapes and lengths, decides which structures exist (a
        dependency CRF's ``single_root``): distributions that differ in it may have different supports."""
        return ()

    def _expected_counts(self) -> dict[str, Tensor]:
        """``{input: [B, *shape]}``: the expected use of every program input (the marginals, for the
        potentials) — the gradient of log Z, per example; differentiable when θ requires grad."""
        if not self._shared:
            return {self._input: self._marginals_exact()}
        create = torch.is_grad_enabled() and (self._theta.requires_grad or any(v.requires_grad for v in self._shared.values()))
        with torch.enable_grad():
            xs = {n: v if create and v.requires_grad else v.detach().requires_grad_()
                  for n, v in self._inputs(self._theta, expand=True).items()}
            value = self._run(sr.Log, xs)
            grads = torch.autograd.grad(value.sum(), list(xs.values()), create_graph=create, allow_unused=True)
        finite = torch.isfinite(value)
        return {n: (torch.zeros_like(v) if g is None else g * finite.reshape(-1, *[1] * (v.dim() - 1)))
                for (n, v), g in zip(xs.items(), grads)}

    def expected_score(self, v: Tensor, base: sr.Semiring = sr.SignedLog) -> Tensor:
        """``[B]``: E_p[⟨v, z⟩] for values ``v [B, *parts]`` of any sign, by the expectation semiring
        over ``base`` (exact in log space with SignedLog). Differentiable: its gradient w.r.t. the
        potentials is the Hessian-vector product H v (H = Cov_p(z)), which is how a loss on the
        marginals is backpropagated without differentiating the marginals (``marginals_backward``)."""
        return self._out(self._expected(self._theta, v, base))

    def marginals_backward(self, grad_marginals: Tensor) -> Tensor:
        """``[B, *parts]``: ∂L/∂θ for a loss L with ``grad_marginals = ∂L/∂μ``, computed as the gradient
        of ``expected_score(grad_marginals)`` in the signed-log expectation semiring (Kim et al. 2017 §3.3)."""
        with torch.enable_grad():
            x = self._theta.detach().requires_grad_()
            return self._out(self._derivative(self._expected(x, grad_marginals.detach(), sr.SignedLog), x))

    def _expected(self, theta: Tensor, v: Tensor, base: sr.Semiring) -> Tensor:
        if v.shape != theta.shape:
            raise ValueError(f"v: expected shape {list(theta.shape)} (that of log_potentials), got {list(v.shape)}")
        e = sr.Expectation(base)
        elements = {n: (e.pair(x, v) if n == self._input else e.convert(x)) for n, x in self._inputs(theta).items()}
        out = self.program.run(e, {**elements, **self._lookups}, self._lengths, self._batch, self._shapes)
        if base is sr.SignedLog:  # where no structure remains (Z = 0) the expectation is 0, not 0/0
            log_z = out[0, 0]
            empty = torch.isneginf(log_z)
            return torch.where(empty, 0.0, out[1, 1] * (out[1, 0] - log_z.masked_fill(empty, 0.0)).exp())
        empty = out[0] == 0
        return torch.where(empty, 0.0, out[1] / out[0].masked_fill(empty, 1.0))

    @_eager
    def _marginals_exact(self) -> Tensor:
        if self._theta.requires_grad and torch.is_grad_enabled():  # differentiable marginals
            return self._derivative(self.run(sr.Log), self._theta, create_graph=True)
        return self._grad(sr.Log)[1]

    def _check_same(self, q: "StructuredDistribution") -> None:
        same = type(q) is type(self) and q._theta.shape == self._theta.shape and _equal(q.lengths, self.lengths)
        if not same or not _equal(q._lookups, self._lookups):
            raise ValueError("q: expected the same kind of structure with potentials of the same shape, the same lengths "
                             "and the same looked-up data")

    @cached_property
    def count(self) -> Tensor:
        """``[B]`` (float64, exact below 2**53): the number of structures of finite score."""
        return self.run(sr.Count)

    def enumerate_support(self, limit: int = 100_000) -> tuple[Tensor, Tensor]:
        """Every structure of finite score, for small problems: ``(values [S, B, *parts], valid [S, B])``;
        S is the largest count in the batch, and slots past an example's count are 0 and invalid. An
        example with more than ``limit`` structures (whatever their scores) is a ``ValueError``."""
        if self._batch == 0:
            return self._out(self._theta.new_zeros(0, *self._theta.shape)), torch.zeros(0, 0, dtype=torch.bool, device=self._theta.device)
        largest = float(self.run(sr.Count, torch.zeros_like(self._theta)).max())
        if largest > limit:
            raise ValueError(f"enumerate_support: {largest:.4g} structures in an example exceed limit={limit} "
                             "(it lists every one, for small problems)")
        capacity = max(1, int(largest))
        while True:
            try:
                el = self.run(sr.Derivations(capacity), self._theta.detach())
                break
            except OverflowError:
                capacity *= 2
        valid = el[:, 0] > 0  # [D, B]
        first = 1 + sum(x[0].numel() for name, x in self._inputs(self._theta).items() if self.program.inputs.index(name) < self.program.inputs.index(self._input))
        values = el[:, first: first + self._theta[0].numel()].movedim(1, -1).reshape(capacity, *self._theta.shape)
        valid &= torch.isfinite(self.score(values.to(self._theta.dtype))).detach()
        order = valid.to(torch.int8).argsort(dim=0, descending=True, stable=True)
        size = max(1, int(valid.sum(0).max()))
        order = order[:size]
        values = values.gather(0, order.reshape(size, -1, *[1] * self._part_dims).expand(size, *values.shape[1:]))
        valid = valid.gather(0, order)
        values = values * valid.reshape(*valid.shape, *[1] * self._part_dims)
        return self._out(values.to(self._theta.dtype)), valid

    def decode(self) -> Tensor:
        """The best structure in the structure's own terms (tags, heads, fact ids)."""
        return self.argmax

    def __repr__(self) -> str:
        lengths = self.lengths
        shown = {k: v.tolist() for k, v in lengths.items()} if isinstance(lengths, dict) else lengths.tolist()
        return f"{type(self).__name__}(log_potentials: {list(self.log_potentials.shape)}, lengths: {shown})"


def _sample_shape(sample_shape: Sequence[int]) -> torch.Size:
    """``sample_shape`` as a ``torch.Size``: ``ValueError`` unless it is a sequence of sizes >= 0."""
    sizes = (sample_shape,) if isinstance(sample_shape, int) and not isinstance(sample_shape, bool) else sample_shape
    try:
        ok = all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in sizes)
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"sample_shape: expected a sequence of sizes >= 0 (e.g. (4,) or torch.Size([2, 3])), got {sample_shape!r}")
    return torch.Size(sizes)


def _repeat(lengths: Tensor | dict[str, Tensor] | None, n: int) -> Tensor | dict[str, Tensor] | None:
    """Lengths for ``n`` copies of the batch."""
    if isinstance(lengths, Mapping):
        return {k: None if v is None else v.repeat(n) for k, v in lengths.items()}
    return None if lengths is None else lengths.repeat(n)


def _equal(a: Tensor | Mapping[str, Tensor], b: Tensor | Mapping[str, Tensor]) -> bool:
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return isinstance(a, Mapping) and isinstance(b, Mapping) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return torch.equal(a, b)


@torch.distributions.kl.register_kl(StructuredDistribution, StructuredDistribution)
def _kl_divergence(p: StructuredDistribution, q: StructuredDistribution) -> Tensor:
    """``torch.distributions.kl_divergence(p, q)``: ``p.kl(q)``."""
    return p.kl(q)
