"""The API pages (docs/api/*.md): every class they document shows bases a reader can follow."""

import importlib
import inspect
import re
from pathlib import Path

import pytest

PAGES = sorted((Path(__file__).resolve().parents[1] / "docs" / "api").glob("*.md"))


def documented(page: Path) -> list[object]:
    """The objects a page's ``::: dotted.name`` directives render."""
    out = []
    for name in re.findall(r"^::: ([\w.]+)", page.read_text(), flags=re.M):
        module, _, attribute = name.rpartition(".")
        try:
            out.append(importlib.import_module(name))
        except ModuleNotFoundError:
            out.append(getattr(importlib.import_module(module), attribute))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_base_of_a_documented_class_is_public_and_documented_or_torchs(page):
    """A "Bases:" line names no private class and links to no undocumented one: each base of a
    documented class is torch's (or Python's) or is documented on the same page."""
    objects = documented(page)
    for cls in filter(inspect.isclass, objects):
        for base in cls.__bases__:
            if base.__module__.split(".")[0] in ("torch", "builtins", "typing"):
                continue
            assert not base.__name__.startswith("_"), f"{cls.__name__}: private base {base.__name__}"
            assert base in objects, f"{cls.__name__}: base {base.__module__}.{base.__name__} is not documented on {page.name}"
