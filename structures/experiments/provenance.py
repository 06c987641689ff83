"""What a result depends on besides its seed: the code's git commit, the CPU, the thread count.

Training numbers of the reproductions are bit-for-bit reproducible only on the same code, CPU and
thread count (docs/protocol.md, rule 5), so every results file names them.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import torch

CHECKOUT = Path(__file__).resolve().parents[2]


def git_commit(checkout: Path = CHECKOUT) -> str:
    """The checkout's short commit hash, with ``+changes`` when tracked files differ from it;
    ``"unknown"`` outside a git checkout (an installed package)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
    try:
        commit = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+changes" if changed else "")


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what ``platform`` knows of it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def describe(threads: int) -> str:
    """One sentence for a results file: git commit, torch version, CPU and torch thread count."""
    return (f"Run at git {git_commit()} with torch {torch.__version__}, on {cpu_name()}, "
            f"{threads} torch thread{'s' if threads != 1 else ''}.")
