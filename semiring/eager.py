"""Host-side code kept out of compiled graphs, without importing the compiler until something compiles."""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import torch

F = TypeVar("F", bound=Callable)


def eager(fn: F) -> F:
    """``fn``, never traced into a ``torch.compile`` graph. ``torch.compiler.disable`` would do, but
    it imports ``torch._dynamo`` when applied (1-2 s at import); here torch's lazy form is called only
    while something is compiling."""
    disabled = torch._disable_dynamo(fn)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if torch.compiler.is_compiling():
            return disabled(*args, **kwargs)
        return fn(*args, **kwargs)

    return run  # type: ignore[return-value]
