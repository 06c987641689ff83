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
# latex2mathml writes \\log Z as <mi>log</mi><mi>Z</mi>, which a browser sets as one word "logZ". TeX puts
# a thin space between a function name and an operand on either side (none before a parenthesis). Not
# where the name is the base of a sub/superscript (<msub><mi>log</mi><mn>2</mn></msub>): a space there
# would be a third child.
FUNCTION = r"<mi>(?:log|ln|exp|tanh|sin|cos|det)</mi>"
FUNCTION_THEN_OPERAND = re.compile(
    rf"(?<!<msub>)(?<!<msup>)(?<!<msubsup>)({FUNCTION})(?=<(?:mi|mn|mtext|msub|msup|msubsup|mrow|mfrac)\b)"
)
OPERAND_THEN_FUNCTION = re.compile(rf"(?:(?<=</mi>)|(?<=</mn>)|(?<=</msub>)|(?<=</msup>))(?={FUNCTION})")
THIN_SPACE = '<mspace width="0.1667em"></mspace>'


def _mathml(match: re.Match[str]) -> str:
    tag, tex = match.group(1), html.unescape(match.group(2)).strip()
    mathml = convert(tex, display="block" if tag == "div" else "inline")
    mathml = FUNCTION_THEN_OPERAND.sub(rf"\1{THIN_SPACE}", mathml)
    return OPERAND_THEN_FUNCTION.sub(THIN_SPACE, mathml)


def on_page_content(content: str, **kwargs: Any) -> str:
    return WRAPPED.sub(_mathml, content)
