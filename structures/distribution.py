"""The distribution of a dynamic program: one program, one tensor of log-potentials, every query.

:class:`StructuredDistribution` is the :class:`structures.base.Distribution` whose algorithm in
every semiring is its program run in that semiring (compiled by :mod:`semiring`): ``log_partition``
in Log, ``argmax`` as the gradient of Max, ``sample`` by forward filtering and backward sampling in
Sampled, ``topk`` in KMax(k), ``count`` in Count, ``enumerate_structures`` in Derivations,
``expected_score`` in the expectation semiring. Declaring a structure is writing its program.
"""

from __future__ import annotations

import math
from functools import reduce
from typing import ClassVar

import torch
from torch import Tensor

import semiring as sr
from semiring import Program
from semiring.language.program import no_examples

from .base import Distribution, _eager, _zero_where_empty, as_given, constant, leaf, recording
from .validation import Lengths, check_integers, check_shape, check_tags, reading_lengths, validating

# the checks' former home: structures written against it import them from here
__all__ = ["StructuredDistribution", "LazyProgram", "Lengths", "check_integers", "check_shape", "check_tags", "validating"]


class LazyProgram:
    """A class attribute ``program = LazyProgram(text)``: the program, compiled when first read rather
    than when its module is imported (the levels of a large program take a second to find, and
    ``import structures`` would pay that for every structure whether used or not)."""

    def __init__(self, text: str):
        self.text = text
        self._program: Program | None = None

    def __get__(self, obj: object, owner: type | None = None) -> Program:
        if self._program is None:
            self._program = sr.program(self.text)
        return self._program


class StructuredDistribution(Distribution):
    """A structure declared as a dynamic program (the class to subclass for your own): it sets
    ``program`` (a :class:`semiring.Program`) and ``shape`` (the potentials' shape, e.g.
    ``"B, N-1, C, C"``), and may override ``decode``, ``to_parts`` (from the decoded form) and
    ``__init__`` for its own constructors. Every query of :class:`structures.base.Distribution`
    is the program run in a semiring, or its gradient.

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
    then reads back as such a dict. ``mask`` (keyword) may replace ``lengths``: one bool mask
    ``[B, size]`` per length, in the same forms (see :class:`structures.base.Distribution`)."""

    program: ClassVar[Program]
    potentials: ClassVar[str | None] = None  # the program input holding the potentials (default: its only input)

    def __init__(self, log_potentials: Tensor, lengths: Lengths = None, shared: dict[str, Tensor] | None = None,
                 *, mask: Lengths = None):
        self._input = self.potentials or self.program.inputs[0]
        self._lookups = {k: v for k, v in (shared or {}).items() if k in self.program.lookups}
        self._shared = {k: v for k, v in (shared or {}).items() if k not in self._lookups}
        self._at_largest = lengths is None and mask is None  # (which plan the checks make: the one the runs take)
        super().__init__(log_potentials, lengths, mask=mask)
        self._shared = {k: as_given(v.to(self._theta.dtype)) for k, v in self._shared.items()}

    def _compute_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The type torch's arithmetic would give the potentials and the shared scores together
        (float16/bfloat16: float32)."""
        return super()._compute_dtype(reduce(torch.promote_types, [v.dtype for v in self._shared.values()], dtype))

    def _check_sizes(self) -> None:
        """The per-example shapes of the program's inputs (``ValueError`` unless they admit a structure)."""
        _, self._shapes = self.program.shapes({self._input: self._theta, **self._shared, **self._lookups})
        try:
            empty = self.program.lengths_allowed(self._shapes, self._at_largest).size == 0
        except sr.ProgramError:  # a size 0 can leave an index without bounds
            if all(all(shape) for shape in self._shapes.values()):
                raise
            empty = True
        if empty:
            raise ValueError(f"{self.argument}: shape {list(self.log_potentials.shape)} (expected [{self.shape}]) "
                             "admits no structure: a size is too small")

    def _check_lengths(self, lengths: Lengths) -> Tensor | dict[str, Tensor] | None:
        """Validate ``lengths`` against the program's lengths (``ValueError`` naming it); ``None``
        means every example is full length."""
        names = self.program.syntax.lengths
        if isinstance(lengths, (tuple, list)):
            if len(lengths) != len(names):
                raise ValueError(f"lengths: expected {len(names)} tensors [B] (for {names}), got {len(lengths)}")
            lengths = dict(zip(names, lengths))
        return self.program.check_lengths(lengths, self._batch, self._shapes, values=reading_lengths())

    def _mask_sizes(self) -> int | dict[str, int]:
        if len(self.program.syntax.lengths) > 1:
            return {k: hi for k, (_, hi) in self.program.length_ranges(self._shapes).items()}
        return self.max_length

    @property
    def max_length(self) -> int:
        """The length of a full example (the default of ``lengths``)."""
        return int(self.program.lengths_allowed(self._shapes).max())

    @property
    def lengths(self) -> Tensor | dict[str, Tensor]:
        """``[B]``: each example's length (the default is the longest the potentials allow); for a
        program with several lengths, a dict from their names to ``[B]``."""
        if len(self.program.syntax.lengths) > 1:
            given = self._lengths or {}
            top = self.program.length_ranges(self._shapes)
            return {k: given[k] if given.get(k) is not None else
                    torch.full((self._batch,), top[k][1], dtype=torch.long, device=self._theta.device) for k in top}
        return super().lengths

    def _data(self) -> dict[str, Tensor]:
        return self._lookups

    def _lookups_for(self, rows: int) -> dict[str, Tensor]:
        """The looked-up integer inputs for a batch of ``rows`` (k copies of the batch), as tensors
        autograd may save (the run's node saves its inputs)."""
        copies = rows // max(1, self._batch)
        return {k: constant(v.repeat(copies, *[1] * (v.dim() - 1)) if copies > 1 and v.shape[0] == self._batch else v)
                for k, v in self._lookups.items()}

    def _inputs(self, theta: Tensor, expand: bool = False, detach: bool = False, constraints: bool = False) -> dict[str, Tensor]:
        """Every program input, in program order, for potentials ``theta`` (a batch of k·B rows for
        k copies of the batch); with ``expand``, shared scores of batch 1 are expanded to the batch;
        with ``detach``, they are cut from the graph (queries differentiated by θ alone); with
        ``constraints``, they keep only what they forbid (0, or -inf where they are -inf)."""
        copies = theta.shape[0] // max(1, self._batch)
        out = {self._input: theta}
        for name, v in self._shared.items():
            v = constant(v) if detach else v
            if constraints:
                v = torch.zeros_like(v).masked_fill(torch.isneginf(v), -math.inf).to(theta.dtype)
            if v.shape[0] == self._batch and copies > 1:
                v = v.repeat(copies, *[1] * (v.dim() - 1))
            out[name] = v.expand(theta.shape[0], *v.shape[1:]) if expand else v
        return {name: out[name] for name in self.program.inputs}

    # ------------------------------------------------------------------ running the program

    def run(self, semiring: sr.Semiring, theta: Tensor | None = None, lengths: Tensor | None = None) -> Tensor:
        """Run the structure's program in ``semiring``: ``[*components, B]``. Given potentials ``theta``
        (a query differentiating by them), the shared scores are detached from the graph."""
        inputs = self._inputs(self._theta) if theta is None else self._inputs(theta, detach=True)
        return self._run(semiring, inputs, lengths)

    @_eager
    def _run(self, semiring: sr.Semiring, inputs: dict[str, Tensor], lengths: Tensor | None = None) -> Tensor:
        """Run the program on every input given (program order): ``[*components, batch]``."""
        lengths = self._lengths if lengths is None else lengths
        rows = inputs[self._input].shape[0]
        if rows == 0:
            semiring.prepare(list(inputs.values()))
            return no_examples(semiring, [inputs[self._input], *(x for n, x in inputs.items() if n != self._input)])
        return self.program.run(semiring, self._elements(semiring, inputs), lengths, rows, self._shapes)

    def _elements(self, semiring: sr.Semiring, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        """The program's elements in ``semiring`` for ``inputs`` (program order, a batch of at least
        one row): each converted, and the looked-up indices for their rows."""
        semiring.prepare(list(inputs.values()))
        elements = {name: semiring.convert(x) for name, x in inputs.items()}
        return {**elements, **self._lookups_for(inputs[self._input].shape[0])}

    @_eager
    def _grad(self, semiring: sr.Semiring, theta: Tensor | None = None, lengths: Tensor | None = None):
        """(value, ∂ value / ∂θ), θ detached: by the program's passes called directly, without an
        autograd graph (:meth:`~semiring.language.program.Program.gradient`), where the semiring
        takes the potentials as they are and the program derives no inputs (closures)."""
        with recording():  # (out of inference mode: the tensors made in it are copied by constant())
            theta = constant(self._theta if theta is None else theta)
            elements = self._elements(semiring, self._inputs(theta, detach=True)) if theta.shape[0] else {}
            if not elements or self.program.closures or elements[self._input] is not theta:
                return super()._grad(semiring, theta, lengths)
            value, (g,) = self.program.gradient(semiring, elements, self._lengths if lengths is None else lengths,
                                                theta.shape[0], self._shapes, [self._input])
            return value, _zero_where_empty(value, [g], in_place=True)[0]

    def _max_within(self, allowed: Tensor, lengths: Tensor | dict[str, Tensor] | None) -> Tensor:
        """The best ⟨allowed, z⟩ with the shared scores reduced to their constraints (0 or -inf)."""
        return self._run(sr.Max, self._inputs(allowed, detach=True, constraints=True), lengths)

    def shared_counts(self, parts: Tensor) -> dict[str, Tensor]:
        """How often structures given as one-hot parts ``[..., B, *parts]`` use each shared score:
        ``{name: [..., B, *shape]}`` (structures with shared scores override this)."""
        if self._shared:
            raise NotImplementedError(f"{type(self).__name__} has shared scores but no shared_counts")
        return {}

    @_eager
    def _marginals_exact(self) -> Tensor:
        """The marginals, differentiable when θ or a shared score requires grad (the shared scores'
        alone, e.g. learned transitions or siblings over fixed potentials: through the expected counts)."""
        learned = torch.is_grad_enabled() and any(v.requires_grad for v in self._shared.values())
        if learned and not self._theta.requires_grad:
            return self._expected_counts()[self._input]
        if learned:  # (shared scores expanded to the batch: the tape differentiates its gradient per example, a Hessian-vector product on pairs, autograd summing theirs)
            return self._derivative(self._run(sr.Log, self._inputs(self._theta, expand=True)), self._theta, create_graph=True)
        return super()._marginals_exact()

    def _expected_counts(self) -> dict[str, Tensor]:
        """``{input: [B, *shape]}``: the expected use of every program input (the marginals, for the
        potentials) — the gradient of log Z, per example; differentiable when θ requires grad."""
        if not self._shared:
            return super()._expected_counts()
        create = torch.is_grad_enabled() and (self._theta.requires_grad or any(v.requires_grad for v in self._shared.values()))
        if not create and self._batch and not self.program.closures:  # (no graph to keep: the passes directly)
            with recording():
                xs = {n: constant(v) for n, v in self._inputs(self._theta, expand=True).items()}
                value, grads = self.program.gradient(sr.Log, self._elements(sr.Log, xs), self._lengths, self._batch,
                                                     self._shapes, list(xs))
            return dict(zip(xs, _zero_where_empty(value, grads, in_place=True)))
        with recording():
            xs = {n: v if create and v.requires_grad else leaf(v)
                  for n, v in self._inputs(self._theta, expand=True).items()}
            value = self._run(sr.Log, xs)
            grads = torch.autograd.grad(value.sum(), list(xs.values()), create_graph=create, allow_unused=True)
        finite = torch.isfinite(value)
        return {n: (torch.zeros_like(v) if g is None else g * finite.reshape(-1, *[1] * (v.dim() - 1)))
                for (n, v), g in zip(xs.items(), grads)}

    def _expectation(self, theta: Tensor, v: Tensor, base: sr.Semiring) -> Tensor:
        """E_p⟨v, z⟩ by the program in the expectation semiring over ``base`` (exact in log space with SignedLog)."""
        e = sr.Expectation(base)
        elements = {n: (e.pair(x, v) if n == self._input else e.convert(x)) for n, x in self._inputs(theta).items()}
        out = self.program.run(e, {**elements, **self._lookups}, self._lengths, self._batch, self._shapes)
        if base is sr.SignedLog:  # where no structure remains (Z = 0) the expectation is 0, not 0/0
            log_z = out[0, 0]
            empty = torch.isneginf(log_z)
            return torch.where(empty, 0.0, out[1, 1] * (out[1, 0] - log_z.masked_fill(empty, 0.0)).exp())
        empty = out[0] == 0
        return torch.where(empty, 0.0, out[1] / out[0].masked_fill(empty, 1.0))

    has_enumerate_support = True

    def enumerate_structures(self, limit: int | None = None) -> tuple[Tensor, Tensor]:
        """Every structure of finite score, for small problems: ``(values [S, B, *parts], valid [S, B])``;
        S is the largest count in the batch, and slots past an example's count are 0 and invalid. An
        example with more than ``limit`` structures (default 100,000; whatever their scores) is a ``ValueError``."""
        limit = 100_000 if limit is None else limit
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
