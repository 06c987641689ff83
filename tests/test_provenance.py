"""Every results file records the commit, the CPU, the torch threads and the seeds of its run."""

import re

import torch

from structures.experiments.provenance import provenance, provenance_line


def test_provenance_names_the_commit_the_cpu_the_threads_and_the_seeds():
    run = provenance([4, 5])
    assert set(run) == {"commit", "cpu", "threads", "seeds"}
    assert re.fullmatch(r"[0-9a-f]{12}(\+changes)?|unknown", run["commit"])
    assert re.search(r", \d+ cores$", run["cpu"])
    assert run["threads"] == str(torch.get_num_threads())
    assert run["seeds"] == "4 5"


def test_the_markdown_line_carries_the_same_values():
    run, line = provenance([7]), provenance_line([7])
    assert all(value in line for value in run.values())
