"""The checks of what a distribution is given: potentials, integer inputs, tags, lengths (or the
masks that imply them), sample shapes. Each raises ``ValueError`` naming the argument and what was expected. Checks that read
values (and so synchronise with the device) run only while :func:`validating`."""

from __future__ import annotations

import functools
import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, Mapping, Sequence, Union

import torch
from torch import Tensor

try:  # the one-pass value check in C (structures/_values.c, built at install time where a C compiler is)
    from . import _values
except ImportError:
    _values = None

Lengths = Union[Tensor, Mapping[str, Tensor], Sequence[Tensor], None]

_chosen: ContextVar[bool | None] = ContextVar("validate_args", default=None)
_lengths_checked: ContextVar[bool] = ContextVar("lengths_checked", default=False)


def validating() -> bool:
    """Whether checks that read values (and so synchronise with the device) run: the
    ``validate_args=`` of the distribution being built (:func:`validated`), else torch's
    ``Distribution`` default, on unless ``torch.distributions.Distribution.set_default_validate_args(False)``
    (a training loop that trusts its inputs). Checks of types and shapes always run."""
    chosen = _chosen.get()
    return torch.distributions.Distribution._validate_args if chosen is None else chosen


@contextmanager
def validated(validate_args: bool | None) -> Iterator[None]:
    """Within: :func:`validating` is ``validate_args`` (None: as outside), torch's meaning of a
    distribution's ``validate_args=``."""
    if validate_args is None:
        yield
        return
    token = _chosen.set(bool(validate_args))
    try:
        yield
    finally:
        _chosen.reset(token)


def reading_lengths() -> bool:
    """Whether a constructor reads its lengths' values: while :func:`validating`, outside
    :func:`lengths_checked`."""
    return validating() and not _lengths_checked.get()


@contextmanager
def lengths_checked() -> Iterator[None]:
    """Within: constructors check their lengths' types and shapes but read no values, which the
    caller has just checked in its own terms (:func:`given_lengths`) before building a structure on
    lengths it derived from them (one more for a start symbol): one check, one device synchronisation."""
    token = _lengths_checked.set(True)
    try:
        yield
    finally:
        _lengths_checked.reset(token)


def check_shape(name: str, x: Tensor, spec: str, values: bool = True) -> None:
    """Raise ``ValueError`` unless ``x`` is a floating tensor of shape ``spec`` (e.g. ``"B, N-1, C, C"``):
    the right rank, and equal sizes wherever ``spec`` repeats a symbol; while :func:`validating`
    (and ``values``: False where the caller has just checked them), also unless its values are
    finite or -inf, and small enough that sums of them cannot overflow."""
    check_shapes((name, x, spec), values=values)


def check_shapes(*checks: tuple[str, Tensor | None, str], values: bool = True) -> None:
    """:func:`check_shape` of each ``(name, x, spec)`` (``x`` None: absent, nothing to check), the
    values of all of them read at once (one synchronisation on a GPU, however many tensors)."""
    given = [(name, x, spec) for name, x, spec in checks if x is not None]
    for name, x, spec in given:
        if not isinstance(x, Tensor):
            raise ValueError(f"{name}: expected a tensor of shape [{spec}], got {type(x).__name__}")
        rank, repeats = _parse_shape(spec)
        if x.dim() != rank or any(x.shape[i] != x.shape[j] for i, j in repeats):
            raise ValueError(f"{name}: expected shape [{spec}], got {list(x.shape)}")
        if not x.dtype.is_floating_point:
            raise ValueError(f"{name}: expected floating-point log-potentials, got {x.dtype}")
    if values:
        check_values(*[(name, x) for name, x, _ in given])


def check_values(*named: tuple[str, Tensor | None]) -> None:
    """While :func:`validating`: ``ValueError`` naming the first tensor (of ``(name, x)``, x None:
    absent) with a NaN or +inf entry, or finite entries so large that sums of them overflow; the
    values of all of them read at once (one synchronisation on a GPU, however many tensors)."""
    if not validating():
        return
    given = [(name, x.detach()) for name, x in named if x is not None and x.numel()]
    for (name, x), (nan, posinf, largest) in zip(given, _scanned([x for _, x in given])):
        if nan:
            raise ValueError(f"{name}: contains NaN")
        if posinf:
            raise ValueError(f"{name}: contains +inf (potentials are log-scores; -inf forbids a part)")
        limit = _overflow_limit(x)
        if largest > limit:
            raise ValueError(f"{name}: finite entries up to {float(largest):.3g} in magnitude; sums of them overflow "
                             f"{_computed_in(x)} (at most {limit:.3g} here: rescale, or use float64)")


def _computed_in(x: Tensor) -> torch.dtype:
    """The dtype a structure computes ``x``'s sums in: its own, float32 for half precision."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _overflow_limit(x: Tensor) -> float:
    """The largest magnitude of ``x``'s entries whose sums, one entry per part of an example (at most
    ``x.shape[1:]`` of them), cannot overflow the dtype they are computed in."""
    return _largest_float(_computed_in(x)) / max(1, math.prod(x.shape[1:]))


@functools.lru_cache(maxsize=None)
def _largest_float(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).max


def _scanned(xs: list[Tensor]) -> list[tuple[bool, bool, float]]:
    """``(any NaN, any +inf, the largest magnitude of a finite entry)`` of each tensor (none empty):
    by one C pass (:mod:`structures._values`) where it is a contiguous float32 or float64 CPU tensor
    (a torch reduction and its read cost tens of microseconds each when the caches are cold); the
    others' by ``aminmax``, read at once (one synchronisation on a GPU, however many tensors)."""
    out: list = [None] * len(xs)
    rest = []
    for i, x in enumerate(xs):
        if _values is not None and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.is_contiguous():
            out[i] = _values.scan(x.data_ptr(), x.numel(), x.dtype == torch.float32)
        else:
            rest.append(i)
    if rest:
        read = torch.stack([v for i in rest for v in torch.aminmax(xs[i])]).tolist()
        for i, low, top in zip(rest, read[::2], read[1::2]):
            if low == -math.inf and top > -math.inf:  # the smallest finite entry needs another pass
                low = xs[i].masked_fill(torch.isneginf(xs[i]), math.inf).amin().item()
            largest = max(abs(top), abs(low)) if -math.inf < top < math.inf else 0.0
            out[i] = (math.isnan(top), top == math.inf, largest)
    return out


def check_emission_scores(emissions: Tensor, transitions: Tensor, start: Tensor | None, end: Tensor | None) -> None:
    """``ValueError`` naming the argument unless ``emissions [B, N, C]``, ``transitions [C, C]``,
    ``start [C]`` and ``end [C]`` (each None: absent) are floating tensors of one C; their values
    checked as :func:`check_shape` checks them, read at once."""
    given = (("emissions", emissions), ("transitions", transitions), ("start", start), ("end", end))
    check_shapes(*[(name, x, spec) for (name, x), spec in zip(given, ("B, N, C", "C, C", "C", "C"))], values=False)
    C = emissions.shape[-1]
    for name, v in given[1:]:
        if v is not None and v.shape[0] != C:
            spec = "C, C" if name == "transitions" else "C"
            raise ValueError(f"{name}: expected shape [{spec}] = [{', '.join([str(C)] * v.dim())}], got {list(v.shape)}")
    check_values(*given)


@functools.lru_cache(maxsize=None)
def _parse_shape(spec: str) -> tuple[int, tuple[tuple[int, int], ...]]:
    """A shape spec's rank and the dimensions ``(i, j)`` where symbol i repeats an earlier symbol j."""
    symbols = [s.strip() for s in spec.split(",")]
    return len(symbols), tuple((i, symbols.index(s)) for i, s in enumerate(symbols) if symbols.index(s) != i)


def check_integers(name: str, x: Tensor, shape: Sequence[int], lo: int, hi: int) -> tuple[int, int] | None:
    """Raise ``ValueError`` unless ``x`` is an integer tensor of ``shape`` with values (while
    :func:`validating`) in ``lo..hi``; returns the values' ``(least, largest)`` where they were read
    (else None: not validating, or no values)."""
    if not isinstance(x, Tensor) or x.dtype.is_floating_point or x.dtype == torch.bool or x.is_complex():
        raise ValueError(f"{name}: expected an integer tensor of shape {list(shape)}, got {getattr(x, 'dtype', type(x).__name__)}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(x.shape)}")
    if not validating() or x.numel() == 0:
        return None
    low, top = torch.stack(torch.aminmax(x)).tolist()  # one pass, one read
    if low < lo or top > hi:
        raise ValueError(f"{name}: expected values in {lo}..{hi}, got {x[(x < lo) | (x > hi)].tolist()}")
    return low, top


def prefix_mask(lengths: Tensor, size: int) -> Tensor:
    """``[..., size]`` bool: True at the first ``lengths[...]`` positions (the positions that exist)."""
    return torch.arange(size, device=lengths.device) < lengths.unsqueeze(-1)


def as_lengths(lengths: object) -> object:
    """``lengths`` as given, with integer tensors of any integer dtype as long tensors and a sequence
    of numbers (a Python list ``[5, 3]``) as one tensor; a sequence of tensors (one per length of
    a structure with several) stays a sequence. What is not integer is left for the checks to name."""
    if lengths is None:  # (the common case: before the Mapping test, which goes through typing and abc)
        return None
    if isinstance(lengths, Tensor):
        integer = not (lengths.dtype.is_floating_point or lengths.is_complex() or lengths.dtype == torch.bool)
        return lengths.long() if integer else lengths
    if isinstance(lengths, Mapping):
        return {k: as_lengths(v) for k, v in lengths.items()}
    if isinstance(lengths, (list, tuple)):
        if any(isinstance(v, (Tensor, list, tuple)) for v in lengths):  # one per length of the structure
            return type(lengths)(as_lengths(v) for v in lengths)
        try:
            return as_lengths(torch.as_tensor(lengths))
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"lengths: expected an integer tensor [B] (or a list of ints), got {lengths!r}") from None
    return lengths


def check_lengths(lengths: Tensor | Sequence[int] | None, batch: int, lo: int, hi: int,
                  device: torch.device, name: str = "lengths") -> Tensor | None:
    """``lengths`` as a long tensor ``[B]`` on ``device`` (``None``: every example at its longest);
    ``ValueError`` naming them (``name``) unless they are integers of shape ``[batch]`` with values
    (while :func:`reading_lengths`) in ``lo..hi``."""
    if lengths is None:
        return None
    if not isinstance(lengths, Tensor):
        lengths = torch.as_tensor(lengths)
    if (lengths.dim() != 1 or lengths.shape[0] != batch or lengths.dtype.is_floating_point
            or lengths.dtype == torch.bool or lengths.is_complex()):
        raise ValueError(f"{name}: expected an integer tensor of shape [B] = [{batch}], got {lengths.dtype} {tuple(lengths.shape)}")
    if reading_lengths() and batch:
        low, top = torch.stack(torch.aminmax(lengths)).tolist()  # one pass, one read
        if low < lo or top > hi:
            raise ValueError(f"{name}: expected values in {lo}..{hi}, got {lengths.tolist()}")
    return lengths.to(device=device, dtype=torch.long)


def given_lengths(lengths: Lengths, mask: Tensor | None, batch: int, lo: int, hi: int, device: torch.device,
                  names: tuple[str, str] = ("lengths", "mask")) -> Tensor | None:
    """The lengths given, or those ``mask [B, hi]`` implies (:func:`lengths_of_mask`), checked as
    :func:`check_lengths` does in ``lo..hi``; a length out of range that a mask implied names the
    mask (:func:`blame_mask`). For a constructor whose structure counts positions the caller does
    not (then built within :func:`lengths_checked`)."""
    try:
        implied = lengths_of_mask(as_lengths(lengths), mask, batch, hi, names=names)
        return check_lengths(implied, batch, lo, hi, device, name=names[0])
    except ValueError as error:
        raise (error if mask is None else blame_mask(error, names)) from None


def lengths_of_mask(lengths: Tensor | Sequence[int] | None, mask: Tensor | None, batch: int, size: int,
                    root: bool = False, names: tuple[str, str] = ("lengths", "mask"),
                    spec: str | None = None) -> Tensor | Sequence[int] | None:
    """The lengths ``mask`` implies, or ``lengths`` as given when no mask is (they are checked
    where they are used). ``mask [B, size]`` (``size`` the longest length) is bool, True at the
    positions that exist: a prefix of each row (pytorch-crf's and SuPar's ``mask``), so its
    lengths are ``mask.sum(-1)``. With ``root``, the mask is ``[B, size+1]`` and its column 0 a
    root symbol before the positions (SuPar's dependency masks, which set it False), ignored
    whatever it holds: the lengths are ``mask[:, 1:].sum(-1)``.

    ``ValueError`` naming both ``names`` when both are given; naming the mask unless it is a bool
    tensor of that shape (named ``spec`` in the message) and (while :func:`validating`: it reads
    the values) its rows are prefixes.
    Without validation nothing here waits for the device."""
    lengths_name, mask_name = names
    if mask is None:
        return lengths
    if lengths is not None:
        raise ValueError(f"{lengths_name}, {mask_name}: expected one of them (the lengths a mask implies are "
                         f"{mask_name}.sum(-1)), got both")
    spec = spec or ("B, N+1" if root else "B, N")
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (batch, size + root):
        got = f"{mask.dtype} {list(mask.shape)}" if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"{mask_name}: expected a bool tensor of shape [{spec}] = [{batch}, {size + root}]"
                         f"{' (column 0 the root)' if root else ''}, got {got}")
    real = mask[:, 1:] if root else mask
    if validating() and real.shape[-1] > 1:
        gaps = real[:, 1:] & ~real[:, :-1]  # a True after a False
        if bool(gaps.any()):
            rows = gaps.any(-1).nonzero().flatten().tolist()
            raise ValueError(f"{mask_name}: expected each row's True entries to be a prefix{' of columns 1..N' if root else ''} "
                             f"(the positions that exist, then padding), got a False before a True in rows {rows}")
    return real.sum(-1)


def blame_mask(error: ValueError, names: tuple[str, str] = ("lengths", "mask")) -> ValueError:
    """``error`` about the lengths a mask implied, reworded to name the mask."""
    lengths_name, mask_name = names
    text = str(error)
    if not text.startswith(lengths_name + ":"):
        return error
    return ValueError(f"{mask_name} (read as lengths, its True entries per row):{text[len(lengths_name) + 1:]}")


def check_tags(value: Tensor, batch: int, n: int, classes: int, lengths: Tensor, what: str = "tags") -> Tensor:
    """Tags ``value [..., B, n]`` (or heads, ``what``) with 0 past each example's ``lengths[b]``
    (what is there is ignored); ``ValueError`` naming ``value`` unless they are integers (not
    bool) of that shape in ``0..classes-1`` within each length."""
    if (not isinstance(value, Tensor) or value.dim() < 2 or tuple(value.shape[-2:]) != (batch, n)
            or value.dtype.is_floating_point or value.dtype == torch.bool or value.is_complex()):
        got = f"{value.dtype} {list(value.shape)}" if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(f"value: expected integer {what} of shape [..., B, N] = [..., {batch}, {n}], got {got}")
    inside = prefix_mask(lengths.to(value.device), n)  # [B, n]
    tags = torch.where(inside, value, 0)
    if bool(((tags < 0) | (tags >= classes)).any()):
        raise ValueError(f"value: {what} must lie in 0..{classes - 1} within each length, got {value[inside.expand_as(value)].unique().tolist()}")
    return tags


def check_sample_shape(sample_shape: int | Sequence[int]) -> torch.Size:
    """``sample_shape`` as a ``torch.Size``: ``ValueError`` unless it is a size >= 0 or a sequence of them."""
    sizes = (sample_shape,) if isinstance(sample_shape, int) and not isinstance(sample_shape, bool) else sample_shape
    try:
        ok = all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in sizes)
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"sample_shape: expected a sequence of sizes >= 0 (e.g. (4,) or torch.Size([2, 3])), got {sample_shape!r}")
    return torch.Size(sizes)
