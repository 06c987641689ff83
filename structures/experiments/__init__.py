"""Reproductions, each runnable as ``python -m structures.experiments.NAME``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..optional import require

for _module in ("conllu", "matplotlib", "tqdm"):
    require(_module, "experiments", "structures.experiments")


def default_data_dir() -> Path:
    """Where the shared data sets are read from by default: ``$STRUCTURES_DATA_DIR`` when set, else
    ``../shared/data`` beside the source checkout this package runs from, else ``../shared/data``
    from the working directory (an installed package has no checkout beside it)."""
    if os.environ.get("STRUCTURES_DATA_DIR"):
        return Path(os.environ["STRUCTURES_DATA_DIR"])
    beside_checkout = Path(__file__).resolve().parents[2].parent / "shared" / "data"
    if beside_checkout.exists():
        return beside_checkout
    return Path.cwd().parent / "shared" / "data"


def command_line(name: str, doc: str) -> argparse.ArgumentParser:
    """The argument parser of ``python -m structures.experiments.NAME``: the module's first paragraph
    as its description, every option's default shown in ``--help``."""
    return argparse.ArgumentParser(prog=f"python -m structures.experiments.{name}", description=doc.split("\n\n")[0],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
