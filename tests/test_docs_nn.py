"""The examples of docs/nn.md run as they stand."""

import re
from pathlib import Path

import pytest
import torch

DOC = Path(__file__).resolve().parents[1] / "docs" / "nn.md"


def examples() -> list[tuple[str, str]]:
    """``(heading, code)`` of every ```python block of docs/nn.md, in order."""
    out, heading = [], ""
    for part in re.split(r"(^## [^\n]*$|^```python\n.*?^```$)", DOC.read_text(), flags=re.M | re.S):
        if part.startswith("## "):
            heading = part[3:].split(":")[0].replace("`", "").strip()
        elif part.startswith("```python"):
            out.append((heading, part[len("```python\n"):-3]))
    return out


def test_the_page_has_an_example_per_layer_section():
    assert len(examples()) >= 6


@pytest.mark.parametrize("code", [c for _, c in examples()], ids=[h for h, _ in examples()])
def test_example_runs(code, capsys):
    torch.manual_seed(0)
    exec(compile(code, str(DOC), "exec"), {"__name__": "docs_nn"})
