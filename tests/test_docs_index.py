"""The landing page (docs/index.md): its example runs as it stands, and its gallery names every structure."""

import re
from pathlib import Path

import torch

import structures

PAGE = (Path(__file__).resolve().parents[1] / "docs" / "index.md").read_text()


def test_the_example_runs(capsys):
    (code,) = re.findall(r"^```python\n(.*?)^```$", PAGE, flags=re.M | re.S)
    assert len(code.strip().splitlines()) <= 12
    torch.manual_seed(0)
    exec(compile(code, "docs/index.md", "exec"), {"__name__": "docs_index"})
    assert capsys.readouterr().out


def test_the_gallery_has_a_line_for_every_structure():
    gallery = PAGE.split("## The structures", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(\w+)`", gallery))
    distributions = {name for name in structures.__all__ if name not in ("Distribution", "StructuredDistribution", "HMMParameters", "__version__")}
    assert distributions <= named
