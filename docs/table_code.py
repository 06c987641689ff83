"""MkDocs hook: code in a table cell may wrap after ``.``, ``(`` and ``,``.

A long dotted name in a cell (``torch.distributions.constraints.Constraint``) is one unbreakable word,
so a three-column table of them is wider than the page however its prose wraps, and its last column is
cut off behind a scroll bar. A ``<wbr>`` after each dot, opening parenthesis and comma gives the browser
the places a reader would break such a name, and the table fits. Only the docs build loads it
(mkdocs.yml, ``hooks``)."""

from __future__ import annotations

import re
from typing import Any

CELL = re.compile(r"<td\b[^>]*>.*?</td>", re.DOTALL)
CODE = re.compile(r"(<code>)(.*?)(</code>)", re.DOTALL)
# after a dot before a name (not inside "..."), a parenthesis before more than a short argument, a comma
BREAK_AFTER = re.compile(r"(\.(?=[A-Za-z_])|\((?![^)]{0,3}\))|,(?=\S))")


def _code(match: re.Match[str]) -> str:
    opening, text, closing = match.groups()
    if "<" in text:  # highlighted or nested markup: leave it alone
        return match.group(0)
    return opening + BREAK_AFTER.sub(r"\1<wbr>", text) + closing


def _cell(match: re.Match[str]) -> str:
    return CODE.sub(_code, match.group(0))


def on_page_content(content: str, **kwargs: Any) -> str:
    return CELL.sub(_cell, content)
