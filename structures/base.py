"""The distribution every structure is: validation and the API, answered by per-semiring algorithms.

A structure is a Gibbs distribution ``p(z) ∝ exp⟨θ, z⟩`` over the one-hot *parts* ``z`` of its
structures, ``θ = log_potentials`` (batch first). :class:`Distribution` checks what it is given
(potentials, lengths, values given to ``log_prob``, sample shapes, which distributions ``kl`` may
compare) and answers every query from the structure's algorithms in a few semirings and their
gradients:

=====================  ==================================================================
``log_partition``      Log                                            ``[B]``
``marginals``          ∂ log Z / ∂θ (differentiable: second order works)  ``[B, *parts]``
``argmax``, ``max``    Max and its gradient                           ``[B, *parts]``, ``[B]``
``topk(k)``            KMax(k) and the gradient of each of the k scores  ``[k, B, *parts]``
``sample(shape)``      Sampled: the gradient of a sample's score is the sample  ``[*shape, B, *parts]``
``count``              Count                                          ``[B]``
``entropy``, ``kl``    H = log Z − ⟨θ, μ⟩; KL(p‖q) = log Z_q − log Z_p + ⟨θ_p − θ_q, μ_p⟩
=====================  ==================================================================

A structure that is a dynamic program runs its program in any semiring
(:class:`structures.StructuredDistribution`); one that is not registers one algorithm per
semiring with :func:`algorithm` (:class:`structures.NonProjectiveDependencyCRF`).

Potentials of ``-inf`` forbid parts (constraints); with nothing left, ``log Z = -inf``, marginals
are 0 and no result is NaN. float16/bfloat16 potentials are computed in float32 and results
returned in the input dtype. Inputs are never modified. The queries answer alike under
``torch.no_grad()`` and ``torch.inference_mode()``: those that are gradients differentiate where
autograd records (:func:`recording`), on copies of what inference mode made.
"""

from __future__ import annotations

import functools
import inspect
import math
from contextlib import contextmanager
from functools import cached_property
from typing import Callable, ClassVar, Iterator, Mapping, Sequence, TypeVar

import torch
from torch import Tensor

import semiring as sr
from semiring.eager import eager

from .validation import Lengths, as_lengths, blame_mask, check_lengths, check_sample_shape, check_shape, lengths_of_mask, validated, validating

# The structures' algorithms run eagerly inside a compiled model (a graph break): their marginals
# are a gradient taken inside the forward, and AOTAutograd supports no double backward through it.
_eager = eager

Method = TypeVar("Method", bound=Callable)


def algorithm(*semirings: type[sr.Semiring]) -> Callable[[Method], Method]:
    """Register the decorated method as its structure's algorithm in instances of the ``semirings``
    classes (and of their subclasses that have none of their own):
    ``method(self, semiring, theta [rows, *parts], lengths) -> [*components, rows]``, where
    ``lengths`` may be None (every example at its longest). Its value must have the gradient the
    semiring promises (``⟨θ, best structure⟩`` for Max, ``⟨θ, a sample⟩`` for Sampled, ...)."""
    def register(method: Method) -> Method:
        method._semirings = semirings
        return method
    return register


@contextmanager
def recording() -> Iterator[None]:
    """Autograd on, whatever the caller's mode: the queries that are gradients (marginals, argmax,
    samples, top k) differentiate under ``torch.no_grad()`` and ``torch.inference_mode()`` too."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


def constant(t: Tensor) -> Tensor:
    """``t`` cut from its graph, as a tensor autograd may save: one made in inference mode is copied
    where autograd records (outside inference mode, as within :func:`recording`)."""
    t = t.detach()
    return t.clone() if t.is_inference() and not torch.is_inference_mode_enabled() else t


def leaf(t: Tensor) -> Tensor:
    """A leaf requiring grad with ``t``'s values, for a query to differentiate by (within :func:`recording`)."""
    return constant(t).requires_grad_()


def as_given(t: Tensor) -> Tensor:
    """``t`` with the autograd state it has now: a view of a tensor that requires no grad is
    detached, for its base may start requiring grad later (torch-struct's algorithms set it on their
    input), which makes the view require grad with no graph behind it: no gradient can be taken by it."""
    return t.detach() if t._base is not None and not t.requires_grad else t


def takes_validate_args(build: Method) -> Method:
    """``build`` (a constructor) taking ``validate_args=`` as torch.distributions' constructors do:
    True or False turns on or off, for this distribution, the checks that read values (NaN
    potentials, lengths in range, ``log_prob`` of what is not a structure); None (the default)
    keeps torch's default (``Distribution.set_default_validate_args``). Every structure's
    ``__init__`` is wrapped so (:class:`Distribution` does it for its subclasses)."""
    if getattr(build, "_takes_validate_args", False):
        return build

    @functools.wraps(build)
    def wrapper(*args, validate_args: bool | None = None, **kwargs):
        if validate_args is None:  # (as outside: no context to enter, at each constructor a subclass chains to)
            return build(*args, **kwargs)
        with validated(validate_args):
            return build(*args, **kwargs)

    signature = inspect.signature(build)
    params = list(signature.parameters.values())
    at = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
    params.insert(at, inspect.Parameter("validate_args", inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation="bool | None"))
    wrapper.__signature__ = signature.replace(parameters=params)
    wrapper._takes_validate_args = True
    return wrapper


class Structures(torch.distributions.constraints.Constraint):
    """The support of a structure: ``check(value)`` is ``[..., B]`` bool, whether ``value`` (one-hot
    parts ``[..., B, *parts]``, or the structure's decoded form: tags, heads, spans) is a structure
    of each example at its lengths (:meth:`Distribution.is_structure`)."""

    is_discrete = True

    def __init__(self, distribution: "Distribution"):
        self.distribution = distribution
        self.event_dim = len(distribution.event_shape)
        super().__init__()

    def check(self, value: Tensor) -> Tensor:
        d = self.distribution
        return d.is_structure(value if value.dtype.is_floating_point else d.to_parts(value))

    def __repr__(self) -> str:
        return f"Structures({type(self.distribution).__name__})"


def _zero_where_empty(value: Tensor, grads: list[Tensor], in_place: bool) -> list[Tensor]:
    """Per-example gradients ``[rows, ...]`` with the rows of examples whose ``value [*components,
    rows]`` is not finite set to 0 (in place where ``in_place``: fresh tensors spare a pass over new
    memory)."""
    # (on the CPU, where reading a value is free: every value finite, no pass over the gradients; a
    # sum that overflows only sends finite values the long way)
    if value.device.type == "cpu" and math.isfinite(value.detach().sum().item()):
        return grads
    infinite = ~torch.isfinite(value)
    return [(g.masked_fill_ if in_place else g.masked_fill)(infinite.reshape(-1, *[1] * (g.dim() - 1)), 0.0) for g in grads]


def _inner(theta: Tensor, mu: Tensor, dims: int) -> Tensor:
    """⟨θ, μ⟩ over the last ``dims`` dimensions, with 0 · (-inf) = 0 (forbidden parts have μ = 0)."""
    prod = theta * mu  # -inf exactly where a forbidden part is used (μ > 0); 0 · -inf is NaN, μ < 0 gives +inf
    hit = prod.isneginf()
    prod = prod.nan_to_num_(0.0, 0.0, 0.0)
    if dims:
        prod, hit = prod.flatten(-dims).sum(-1), hit.flatten(-dims).any(-1)
    return prod.masked_fill(hit, -math.inf)


class Distribution(torch.distributions.Distribution):
    """Base class of every structure, a ``torch.distributions.Distribution``: ``batch_shape [B]``,
    ``event_shape`` the parts' shape, ``mean`` the marginals, ``mode`` the argmax, ``entropy()``,
    and ``torch.distributions.kl_divergence(p, q)`` (= ``p.kl(q)``).

    A subclass sets ``shape`` (the potentials' shape, e.g. ``"B, N, N"``) and ``max_length``,
    registers its algorithms (:func:`algorithm`: Log, Max, KMax, Sampled and Count give every query
    but ``expected_score``, which is ``_expectation``; or it overrides :meth:`run`), and may override
    ``decode``, ``to_parts`` (from the decoded form), ``enumerate_structures``, ``_support_flags`` and
    ``__init__`` for its own constructors.

    Wherever ``lengths`` is taken, ``mask`` may be given instead (keyword only): a bool tensor
    ``[B, N]``, True at the positions that exist (a prefix of each row, as pytorch-crf's and SuPar's
    masks), read as the lengths ``mask.sum(-1)``, ``N`` the longest length. A structure whose
    potentials put a root symbol first (``mask_root``: the dependency trees) takes SuPar's
    ``[B, N+1]``, column 0 the root, ignored. A structure with several lengths takes one mask per
    length, as a dict or tuple like its ``lengths``."""

    shape: ClassVar[str]
    algorithms: ClassVar[Mapping[type[sr.Semiring], str]] = {}  # semiring class -> method name (see algorithm)
    arg_constraints: ClassVar[dict] = {}  # the constructors check their arguments themselves
    every_decoded_value_is_a_structure: ClassVar[bool] = False  # (tags of a chain): log_prob need not check them
    _input: str = "log_potentials"  # the name of the potentials among the scores (see _inputs)
    mask_root: ClassVar[bool] = False  # a mask has a column 0 for the root symbol, ignored (SuPar's dependency masks)
    argument: ClassVar[str] = "log_potentials"  # what the constructor calls the potentials (in its errors)
    has_enumerate_support: ClassVar[bool] = False  # True where enumerate_structures is implemented

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in vars(cls):
            cls.__init__ = takes_validate_args(cls.__init__)
        table = dict(cls.algorithms)
        for name, member in vars(cls).items():
            table.update({kind: name for kind in getattr(member, "_semirings", ())})
        cls.algorithms = table

    @takes_validate_args
    def __init__(self, log_potentials: Tensor, lengths: Lengths = None, *, mask: Lengths = None):
        self._check_potentials(log_potentials)
        self.log_potentials = log_potentials
        self.dtype = log_potentials.dtype
        self._theta = as_given(log_potentials.to(self._compute_dtype(log_potentials.dtype)))
        self._batch = log_potentials.shape[0]
        self._check_sizes()
        lengths = as_lengths(lengths)
        if mask is None:
            self._lengths = self._check_lengths(lengths)
        else:
            try:
                self._lengths = self._check_lengths(self._mask_lengths(lengths, mask))
            except ValueError as error:  # a length out of range: the mask's rows
                raise blame_mask(error) from None
        super().__init__(torch.Size([self._batch]), log_potentials.shape[1:], validate_args=validating())

    def _check_potentials(self, log_potentials: Tensor) -> None:
        """``ValueError`` naming :attr:`argument` unless the potentials are of :attr:`shape` (and,
        while validating, of values :func:`check_shape` accepts)."""
        check_shape(self.argument, log_potentials, self.shape)

    def _compute_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype the queries compute in for potentials of ``dtype`` (float16/bfloat16: float32)."""
        return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype

    def _check_sizes(self) -> None:
        """Check that the potentials' sizes admit a structure (before the lengths are read)."""

    def _check_lengths(self, lengths: Lengths) -> Tensor | dict[str, Tensor] | None:
        """Validate ``lengths`` (``ValueError`` naming it): one length per example in
        ``1..max_length``; ``None`` means every example is full length."""
        return check_lengths(lengths, self._batch, 1, self.max_length, self._theta.device)

    def _mask_sizes(self) -> int | dict[str, int]:
        """The columns of a mask without the root's: the longest length (per length name, for a
        structure with several)."""
        return self.max_length

    def _mask_lengths(self, lengths: Lengths, mask: Tensor | Mapping[str, Tensor] | Sequence[Tensor]) -> Lengths:
        """The lengths ``mask`` implies (see the class docstring); ``ValueError`` naming ``mask``
        (both names when ``lengths`` is given too)."""
        sizes = self._mask_sizes()
        if not isinstance(sizes, Mapping):
            return lengths_of_mask(lengths, mask, self._batch, sizes, root=self.mask_root)
        if lengths is not None:
            lengths_of_mask(lengths, mask, self._batch, 0)  # raises: both given
        names = list(sizes)
        if isinstance(mask, (tuple, list)):
            if len(mask) != len(names):
                raise ValueError(f"mask: expected {len(names)} masks (for the lengths {names}), got {len(mask)}")
            mask = dict(zip(names, mask))
        if not isinstance(mask, Mapping) or not set(mask) <= set(names):
            got = sorted(mask) if isinstance(mask, Mapping) else type(mask).__name__
            raise ValueError(f"mask: expected a dict from the lengths {names} to masks [B, size] (or a tuple in that order), got {got}")
        return {k: lengths_of_mask(None, m, self._batch, sizes[k], names=("lengths", f"mask[{k!r}]"))
                for k, m in mask.items() if m is not None}

    @property
    def max_length(self) -> int:
        """The length of a full example (the default of ``lengths``)."""
        raise NotImplementedError(f"{type(self).__name__} sets no max_length")

    @property
    def lengths(self) -> Tensor | dict[str, Tensor]:
        """``[B]``: each example's length (the default is the longest the potentials allow)."""
        return self._full_lengths if self._lengths is None else self._lengths

    @cached_property
    def _full_lengths(self) -> Tensor:
        """``[B]``: every example at :attr:`max_length` (made once: the queries read ``lengths`` often)."""
        return torch.full((self._batch,), self.max_length, dtype=torch.long, device=self._theta.device)

    @property
    def _part_dims(self) -> int:
        return self._theta.dim() - 1

    def _inputs(self, theta: Tensor, expand: bool = False) -> dict[str, Tensor]:
        """Every score table by name for potentials ``theta``: the potentials (a subclass with
        shared scores adds them, ``expand``-ed to the batch)."""
        return {self._input: theta}

    # ------------------------------------------------------------------ the algorithms

    @_eager
    def run(self, semiring: sr.Semiring, theta: Tensor | None = None, lengths: Tensor | None = None) -> Tensor:
        """The structure in ``semiring``: ``[*components, B]``, by its algorithm registered for the
        semiring's class (see :attr:`algorithms`). Given potentials ``theta`` (a query
        differentiating by them, possibly k copies of the batch with ``lengths`` to match), the
        value is a function of them."""
        for kind in type(semiring).__mro__:
            if kind in self.algorithms:
                theta = self._theta if theta is None else theta
                lengths = self._lengths if lengths is None else lengths
                return getattr(self, self.algorithms[kind])(semiring, theta, lengths)
        available = ", ".join(kind.__name__ for kind in self.algorithms)
        raise NotImplementedError(f"{type(self).__name__}: no algorithm for the {semiring} semiring "
                                  f"(available: {available}; expectations via expected_score)")

    def _out(self, t: Tensor) -> Tensor:
        return t.to(self.dtype) if t.dtype.is_floating_point and t.dtype != torch.float64 else t

    @_eager
    def _grad(self, semiring: sr.Semiring, theta: Tensor | None = None, lengths: Tensor | None = None):
        """(value, ∂ value / ∂θ) of the structure in ``semiring``, θ detached."""
        with recording():
            x = leaf(self._theta if theta is None else theta)
            value = self.run(semiring, x, lengths)
            return value.detach(), self._derivative(value, x)

    def _derivative(self, value: Tensor, x: Tensor, **grad_options) -> Tensor:
        """∂ Σ value / ∂x per example: 0 for an example with no structure left (a value of -inf,
        whatever path the algorithm took to it) and everywhere when no part exists (nothing to read)."""
        if not value.requires_grad:
            return torch.zeros_like(x)
        (g,) = torch.autograd.grad(value, x, torch.ones_like(value), **grad_options)  # (∂ Σ value: no node for the sum)
        return _zero_where_empty(value, [g], in_place=not grad_options.get("create_graph"))[0]

    # ------------------------------------------------------------------ queries

    @cached_property
    def log_partition(self) -> Tensor:
        """``[B]``: log Σ_z exp⟨θ, z⟩."""
        return self._out(self.run(sr.Log))

    @cached_property
    def partition(self) -> Tensor:
        """``[B]``: Σ_z exp(θ, z), the exp of ``log_partition`` (it overflows where that is past the
        dtype's range)."""
        return self.log_partition.exp()

    @cached_property
    def marginals(self) -> Tensor:
        """``[B, *parts]``: p(part in z). Differentiable w.r.t. the potentials (second order works)."""
        return self._out(self._marginals_exact())

    @_eager
    def _marginals_exact(self) -> Tensor:
        """The marginals, the gradient of log Z (differentiable when θ requires grad)."""
        if self._theta.requires_grad and torch.is_grad_enabled():
            return self._derivative(self.run(sr.Log), self._theta, create_graph=True)
        return self._grad(sr.Log)[1]

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
        with recording():
            x = leaf(self._theta)
            scores = self.run(sr.KMax(k), x)
            rows = [self._derivative(scores[j], x, retain_graph=j + 1 < k) for j in range(k)]
        return self._out(torch.stack(rows))

    def topk_scores(self, k: int) -> Tensor:
        """``[k, B]``: the k best scores (``-inf`` past the count)."""
        return self._out(self.run(sr.KMax(k)))

    def sample(self, sample_shape: Sequence[int] = (), generator: torch.Generator | None = None) -> Tensor:
        """``[*sample_shape, B, *parts]``: exact, independent samples (one-hot parts), drawn with
        ``generator`` (a ``torch.Generator`` on the potentials' device; default: torch's global one)."""
        shape = check_sample_shape(sample_shape)
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
        ``{name: [..., B, *shape]}`` (``{}``: no shared scores)."""
        return {}

    def score(self, value: Tensor) -> Tensor:
        """``[..., B]``: the score of structures ``z`` (one-hot parts, or the decoded form): ⟨θ, z⟩,
        plus the shared scores they use."""
        if not isinstance(value, Tensor):
            raise ValueError(f"value: expected a tensor (one-hot parts [..., B, *parts] or the decoded form), got {type(value).__name__}")
        parts = self._check_parts(value if value.dtype.is_floating_point else self.to_parts(value)).to(self._theta.dtype)
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

    def _check_parts(self, parts: Tensor) -> Tensor:
        """``parts``; ``ValueError`` naming ``value`` unless it is a tensor ``[..., B, *parts]``."""
        if not isinstance(parts, Tensor) or parts.shape[max(0, parts.dim() - self._theta.dim()):] != self._theta.shape:
            got = list(parts.shape) if isinstance(parts, Tensor) else type(parts).__name__
            raise ValueError(f"value: expected one-hot parts of shape [..., {', '.join(map(str, self._theta.shape))}], got {got}")
        return parts

    def is_structure(self, parts: Tensor) -> Tensor:
        """``[..., B]`` bool: whether one-hot parts ``[..., B, *parts]`` are a structure of each
        example, at its lengths, whatever its potentials (shared scores of -inf still forbid what
        they forbid: they are constraints of the structure): the parts are 0 or 1, and the best
        structure that uses only parts the value has has as many parts as the value (one Max run
        with every part of the value scored 1, the others -inf)."""
        theta = self._theta
        self._check_parts(parts)
        lead = parts.shape[: parts.dim() - theta.dim()]
        copies = math.prod(lead)
        flat = parts.detach().reshape(copies * self._batch, *theta.shape[1:]).to(torch.float64)
        binary = ((flat == 0) | (flat == 1)).flatten(1).all(1)
        flat = flat.masked_fill(~binary.reshape(-1, *[1] * (flat.dim() - 1)), 0.0)  # (NaN, ...: no structure, no run on it)
        allowed = torch.zeros_like(flat).masked_fill(flat == 0, -math.inf) + flat
        best = self._max_within(allowed, _repeat(self._lengths, copies))
        return (binary & (best == flat.flatten(1).sum(1))).reshape(*lead, self._batch)

    def _max_within(self, allowed: Tensor, lengths: Tensor | dict[str, Tensor] | None) -> Tensor:
        """``[rows]``: the best ⟨allowed, z⟩ over the structures (under the structure's own
        constraints) for potentials ``allowed`` of k copies of the batch."""
        return self.run(sr.Max, allowed, lengths)

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

    def cross_entropy(self, q: "Distribution") -> Tensor:
        """``[B]``: −E_p[log q(z)] = log Z_q − ⟨θ_q, μ_p⟩ (``+inf`` where p puts mass q forbids,
        also where q's support is smaller: single root against several root children)."""
        self._check_same(q)
        return self._out(self._cross_entropy(q, self._expected_counts()))

    def kl(self, q: "Distribution") -> Tensor:
        """``[B]``: KL(p‖q) = log Z_q − log Z_p + ⟨θ_p − θ_q, μ_p⟩."""
        self._check_same(q)
        mu = self._expected_counts()
        return self._out(self._cross_entropy(q, mu) - self._cross_entropy(self, mu))

    def _cross_entropy(self, q: "Distribution", mu: dict[str, Tensor]) -> Tensor:
        """log Z_q − Σ ⟨score_q, μ⟩ over every score table for the expected counts μ of this
        distribution: ``+inf`` where μ is on a part q forbids, 0 where this distribution has no structure."""
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

    def _data(self) -> dict[str, Tensor]:
        """The integer data the structures are built from (none here), equal in ``q`` for ``kl``."""
        return {}

    def _expected_counts(self) -> dict[str, Tensor]:
        """``{name: [B, *shape]}``: the expected use of every score table (the marginals, for the
        potentials) — the gradient of log Z, per example; differentiable when θ requires grad."""
        return {self._input: self._marginals_exact()}

    def expected_score(self, v: Tensor, base: sr.Semiring = sr.SignedLog) -> Tensor:
        """``[B]``: E_p[⟨v, z⟩] for values ``v [B, *parts]`` of any sign (exact in log space with
        the default ``base``). Differentiable: its gradient w.r.t. the potentials is the
        Hessian-vector product H v (H = Cov_p(z)), which is how a loss on the marginals is
        backpropagated without differentiating the marginals (``marginals_backward``)."""
        return self._out(self._expected(self._theta, v, base))

    def marginals_backward(self, grad_marginals: Tensor) -> Tensor:
        """``[B, *parts]``: ∂L/∂θ for a loss L with ``grad_marginals = ∂L/∂μ``, computed as the gradient
        of ``expected_score(grad_marginals)`` (Kim et al. 2017 §3.3)."""
        with recording():
            x = leaf(self._theta)
            return self._out(self._derivative(self._expected(x, grad_marginals.detach(), sr.SignedLog), x))

    def _expected(self, theta: Tensor, v: Tensor, base: sr.Semiring) -> Tensor:
        if v.shape != theta.shape:
            raise ValueError(f"v: expected shape {list(theta.shape)} (that of log_potentials), got {list(v.shape)}")
        return self._expectation(theta, v, base)

    def _expectation(self, theta: Tensor, v: Tensor, base: sr.Semiring) -> Tensor:
        """``[B]``: E_p⟨v, z⟩ at potentials ``theta`` (a function of them) for ``v`` of their shape."""
        raise NotImplementedError(f"{type(self).__name__} has no expected_score")

    def _check_same(self, q: "Distribution") -> None:
        same = type(q) is type(self) and q._theta.shape == self._theta.shape and _equal(q.lengths, self.lengths)
        if not same or not _equal(q._data(), self._data()):
            raise ValueError("q: expected the same kind of structure with potentials of the same shape, the same lengths "
                             "and the same looked-up data")

    @cached_property
    def count(self) -> Tensor:
        """``[B]`` (float64, exact below 2**53): the number of structures of finite score."""
        return self.run(sr.Count)

    def decode(self) -> Tensor:
        """The best structure in the structure's own terms (tags, heads, fact ids)."""
        return self.argmax

    @property
    def support(self) -> Structures:
        """The structures of each example, as a ``torch.distributions.constraints.Constraint``:
        ``support.check(value)`` is ``[..., B]`` bool (:meth:`is_structure`)."""
        return Structures(self)

    def enumerate_structures(self, limit: int | None = None) -> tuple[Tensor, Tensor]:
        """Every structure of finite score, for small problems: ``(values [S, B, *parts], valid [S, B])``;
        S is the largest count in the batch, and slots past an example's count are 0 and invalid.
        An example with more than ``limit`` structures (the default: the structure's) is a ``ValueError``."""
        raise NotImplementedError(f"{type(self).__name__} cannot list its structures")

    def enumerate_support(self, expand: bool = True, limit: int | None = None) -> Tensor:
        """torch.distributions' ``enumerate_support``: ``[S, B, *parts]``, every structure of finite
        score of each example, for small problems (``limit`` as :meth:`enumerate_structures`).
        Examples have supports of their own: an example with fewer than S structures fills the
        remaining slots with NaN, which no structure is (``log_prob`` -inf, ``support.check``
        False: summing ``log_prob(...).exp()`` over the slots gives 1); :meth:`enumerate_structures`
        gives the same list with 0 there and the mask of the slots that are structures. With
        ``expand=False``, ``[S, 1, *parts]``: only where every example has the same structures."""
        values, valid = self.enumerate_structures(limit)
        if not expand:
            if not (torch.equal(values, values[:, :1].expand_as(values)) and torch.equal(valid, valid[:, :1].expand_as(valid))):
                raise ValueError("enumerate_support: expand=False needs one support for the whole batch, but these examples "
                                 "have different structures (lengths, or parts forbidden by -inf): use expand=True")
            values, valid = values[:, :1], valid[:, :1]
        return values.masked_fill(~valid.reshape(*valid.shape, *[1] * (values.dim() - 2)), math.nan)

    def expand(self, batch_shape: Sequence[int], _instance=None) -> "Distribution":
        """torch.distributions' ``expand``: this distribution where ``batch_shape`` is its own; any
        other is a ``ValueError``: a structure's batch is the first dimension of its potentials (and
        of its lengths and shared scores), so build the structure from inputs expanded to that batch."""
        if torch.Size(batch_shape) == self.batch_shape:
            return self
        raise ValueError(f"expand: a structure's batch is the first dimension of its potentials, [B] = "
                         f"{list(self.batch_shape)}; to get batch_shape {list(batch_shape)}, build it from "
                         "potentials (and lengths) of that batch, e.g. log_potentials.expand(B, *parts)")

    def __repr__(self) -> str:
        lengths = self.lengths
        shown = {k: v.tolist() for k, v in lengths.items()} if isinstance(lengths, dict) else lengths.tolist()
        return f"{type(self).__name__}(log_potentials: {list(self.log_potentials.shape)}, lengths: {shown})"


def _repeat(lengths: Tensor | dict[str, Tensor] | None, n: int) -> Tensor | dict[str, Tensor] | None:
    """Lengths for ``n`` copies of the batch."""
    if isinstance(lengths, Mapping):
        return {k: None if v is None else v.repeat(n) for k, v in lengths.items()}
    return None if lengths is None else lengths.repeat(n)


def _equal(a: Tensor | Mapping[str, Tensor], b: Tensor | Mapping[str, Tensor]) -> bool:
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return isinstance(a, Mapping) and isinstance(b, Mapping) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return torch.equal(a, b)


@torch.distributions.kl.register_kl(Distribution, Distribution)
def _kl_divergence(p: Distribution, q: Distribution) -> Tensor:
    """``torch.distributions.kl_divergence(p, q)``: ``p.kl(q)``."""
    return p.kl(q)
