"""Results files name the code, CPU and thread count they were produced with."""

import subprocess

import pytest
import torch

from structures.experiments import provenance


def test_the_commit_is_the_checkouts_head():
    try:
        head = subprocess.run(["git", "-C", str(provenance.CHECKOUT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    assert provenance.git_commit().split("+")[0] == head


def test_outside_a_checkout_the_commit_is_unknown(tmp_path):
    assert provenance.git_commit(tmp_path) == "unknown"


def test_the_description_names_torch_cpu_and_threads():
    text = provenance.describe(threads=1)
    assert torch.__version__ in text and provenance.cpu_name() in text
    assert "1 torch thread." in text
    assert "4 torch threads." in provenance.describe(threads=4)
