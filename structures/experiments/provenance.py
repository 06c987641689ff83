"""What every results file records about the run that wrote it: the commit, the CPU, the torch
threads and the seeds, so that a table can be traced to its code and its machine."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Sequence

import torch

CHECKOUT = Path(__file__).resolve().parents[2]


def commit() -> str:
    """The checkout's commit (short hash), ``+changes`` when tracked files differ from it;
    ``unknown`` outside a git checkout."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        head = git("rev-parse", "--short=12", "HEAD")
        return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu() -> str:
    """The processor's model name and the cores this process may use."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name}, {cores} cores"


def provenance(seeds: Sequence[int]) -> dict[str, str]:
    """``{"commit", "cpu", "threads", "seeds"}`` of this run, as strings (CSV columns, JSON keys)."""
    return {"commit": commit(), "cpu": cpu(), "threads": str(torch.get_num_threads()),
            "seeds": " ".join(str(s) for s in seeds)}


def provenance_line(seeds: Sequence[int]) -> str:
    """The same as one markdown sentence, the last line of a results table."""
    p = provenance(seeds)
    return (f"Commit {p['commit']}, CPU {p['cpu']}, {p['threads']} torch thread(s), "
            f"seed(s) {p['seeds']}.\n")
