"""Imports of packages the library does not require, with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """``module`` imported, or an ``ImportError`` saying that ``purpose`` needs it and which extra of
    this package installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{purpose} needs the package {module!r}: pip install 'structures[{extra}]' "
                          f"(or pip install {module})") from error
