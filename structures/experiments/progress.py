"""Progress that suits where the output goes: a tqdm bar on a terminal, one line per step in a log
(a bar redrawn into a file floods it)."""

from __future__ import annotations

from typing import Any, Iterable

from tqdm import tqdm


class Progress(tqdm):
    """A tqdm bar, off when stderr is not a terminal; :func:`report` then prints lines."""

    def __init__(self, iterable: Iterable | None = None, desc: str = "", **kwargs: Any):
        super().__init__(iterable, desc=desc, disable=None, **kwargs)
        self.label = desc  # a disabled tqdm keeps no desc


def report(bar: Progress, step: object, **values: object) -> None:
    """Show ``values`` after ``step`` (an epoch, a run): on the bar, or as one line when it is off."""
    if bar.disable:
        print(f"{bar.label} {step}: " + ", ".join(f"{k} {v}" for k, v in values.items()), flush=True)
    else:
        bar.set_postfix(**values)
