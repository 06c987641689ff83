"""Importing the library stays light: the compiler (torch._dynamo) is imported only by what compiles.
(Import times are measured by benchmarks/import_time.py, not here.)"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modules_after(code: str) -> set[str]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         env=env, check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_import_structures_does_not_import_the_compiler():
    assert "torch._dynamo" not in _modules_after("import structures")


def test_running_a_program_does_not_import_the_compiler():
    code = ("import torch, semiring as sr\n"
            "sr.program('x[i] = a[i]\\ngoal += x[n-1]')(sr.Log, a=torch.zeros(2, 3))")
    assert "torch._dynamo" not in _modules_after(code)
