"""The docs' math (docs/mathml.py): every formula of every page, written as ``$...$`` for
``pymdownx.arithmatex``, becomes MathML when the site is built, so that it reads offline."""

import importlib.util
import re
from pathlib import Path

import pytest

markdown = pytest.importorskip("markdown")
pytest.importorskip("pymdownx.arithmatex")
pytest.importorskip("latex2mathml")

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted(DOCS.glob("*.md"))


def hook():
    """docs/mathml.py, the build's hook (not a package module)."""
    spec = importlib.util.spec_from_file_location("mathml", DOCS / "mathml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rendered(page: Path) -> str:
    """The page's HTML as the site's markdown extensions make it (mkdocs.yml), before the hook."""
    return markdown.markdown(page.read_text(), extensions=["tables", "md_in_html", "pymdownx.superfences", "pymdownx.arithmatex"],
                             extension_configs={"pymdownx.arithmatex": {"generic": True}})


def test_the_pages_with_formulas_write_them_as_math():
    with_math = {page.name for page in PAGES if 'class="arithmatex"' in rendered(page)}
    assert {"babi.md", "language.md", "nn.md", "parsing.md", "semirings.md", "shapes.md", "transduction.md"} <= with_math


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_formula_of_a_page_becomes_mathml(page):
    html = rendered(page)
    formulas = len(re.findall(r'<(?:span|div) class="arithmatex">', html))
    built = hook().on_page_content(html)
    assert 'class="arithmatex"' not in built
    assert len(re.findall(r"<math\b", built)) == formulas
