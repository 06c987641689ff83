"""Griffe extension for the docs site: the docstrings' Sphinx roles as Markdown.

The docstrings cross-reference with Sphinx roles (:class:`EmissionCRF`, :meth:`~.Run.forward`);
mkdocstrings reads Markdown and would show them verbatim. Each role becomes a code span that links
to the object where the site documents it (an optional autoref: no link, and no warning, where it
does not, e.g. a private helper). Only the docs build loads this (mkdocs.yml); the docstrings stay
as they are.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|obj|exc|const):`([^`]+)`")


def _target(obj: griffe.Object, name: str) -> str:
    """The full path ``name`` refers to from ``obj``'s docstring (``name`` itself if unresolved)."""
    if name.startswith("."):  # relative to the package of the docstring's module
        package = obj.module.package if obj.module.is_init_module else obj.module.parent
        return f"{package.path}{name}" if package is not None else name.lstrip(".")
    first, _, rest = name.partition(".")
    try:
        base = obj.resolve(first)
    except Exception:  # griffe's NameResolutionError, or an alias that does not resolve
        return name
    return f"{base}.{rest}" if rest else base


def _rewrite(obj: griffe.Object, text: str) -> str:
    def role(match: re.Match[str]) -> str:
        written = match.group(1)
        name = written.lstrip("~")
        shown = name.rsplit(".", 1)[-1] if written.startswith("~") else name.lstrip(".")
        return f'<autoref identifier="{_target(obj, name)}" optional><code>{shown}</code></autoref>'

    return ROLE.sub(role, text)


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[int] = set()
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = _rewrite(obj, obj.docstring.value)
            stack.extend(m for m in obj.members.values() if not m.is_alias)
