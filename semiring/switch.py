"""An on/off flag for a kernel, settable for the runs inside a ``with``."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


class Switch:
    """A kernel's on/off flag: true or false as set, :meth:`to` sets it for the runs inside."""

    def __init__(self, on: bool):
        self.on = on

    def __bool__(self) -> bool:
        return self.on

    @contextmanager
    def to(self, on: bool) -> Iterator[None]:
        was, self.on = self.on, on
        try:
            yield
        finally:
            self.on = was
