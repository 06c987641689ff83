"""MkDocs hook: the pages' math rendered to MathML when the site is built, so that it reads offline.

``pymdownx.arithmatex`` (generic mode) finds ``$...$`` and ``$$...$$`` outside code and wraps the TeX
in ``<span class="arithmatex">\\(...\\)</span>`` / ``<div class="arithmatex">\\[...\\]</div>``; this hook
replaces each wrapper with the MathML that ``latex2mathml`` makes of it, which browsers render without
a script or a CDN. Only the docs build loads it (mkdocs.yml, ``hooks``)."""

from __future__ import annotations

import html
import re
from typing import Any

from latex2mathml.converter import convert

WRAPPED = re.compile(r'<(span|div) class="arithmatex">\\[(\[](.*?)\\[)\]]</\1>', re.DOTALL)


def _mathml(match: re.Match[str]) -> str:
    tag, tex = match.group(1), html.unescape(match.group(2)).strip()
    return convert(tex, display="block" if tag == "div" else "inline")


def on_page_content(content: str, **kwargs: Any) -> str:
    return WRAPPED.sub(_mathml, content)
