"""SynJax (DeepMind, JAX) as a peer of the side-by-side benchmarks, run in a worker process with
its own venv (:mod:`benchmarks.synjax_worker`; how to make the venv: ../shared/peers/README.md).

The worker inherits this process's CPU affinity: pin it first (:func:`benchmarks.common.pin_one_core`)
so that both sides run on the same core (XLA's flags alone do not keep it to one thread). Inputs and
results cross as ``.npz`` files outside the timed region; every lap is timed inside the worker
(``common.Lap``), so the pipe's round trip is not counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from benchmarks.common import Lap

VENV_PYTHON = os.path.expanduser(os.environ.get("SYNJAX_PYTHON", "~/.cache/jaxvenv/bin/python"))
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "synjax_worker.py")


class SynJax:
    """A running SynJax worker. ``SynJax.start()`` is None (with the reason printed) without its venv."""

    def __init__(self, proc: subprocess.Popen):
        self._proc = proc
        self._dir = tempfile.TemporaryDirectory(prefix="synjax-")
        self._files = 0

    @classmethod
    def start(cls) -> SynJax | None:
        if not os.path.exists(VENV_PYTHON):
            print(f"SynJax: no venv at {VENV_PYTHON} (see ../shared/peers/README.md); its column is skipped", file=sys.stderr)
            return None
        env = dict(os.environ, JAXTYPING_DISABLE="1", JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1",
                   XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
        proc = subprocess.Popen([VENV_PYTHON, _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        return cls(proc)

    @classmethod
    @contextmanager
    def running(cls, wanted: bool = True) -> Iterator[SynJax | None]:
        """A worker for the block (None where not wanted or without its venv), closed after it
        whatever happens. The caller pins its core first (the worker inherits it)."""
        synjax = cls.start() if wanted else None
        try:
            yield synjax
        finally:
            if synjax is not None:
                synjax.close()

    def _ask(self, req: dict) -> dict:
        self._proc.stdin.write(json.dumps(req) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"SynJax worker exited (code {self._proc.poll()}) on {req}")
        return json.loads(line)

    def load(self, task: str, x: np.ndarray, single_root: bool = False, kind: str | None = None) -> tuple[int, np.ndarray, float]:
        """Prepare ``task`` (``log_partition``, ``marginals`` or ``mst`` on ``x [B, n+1, n+1]``;
        ``alignment_log_partition`` or ``alignment_marginals`` on ``x [B, n, m]`` with ``kind`` its
        ``alignment_type``; ``chain_marginals`` on our ``x [B, N-1, C, C]``): ``(id, result of the first call, seconds of the first call, compile
        included)``."""
        self._files += 1
        src = os.path.join(self._dir.name, f"x{self._files}.npz")
        dst = os.path.join(self._dir.name, f"y{self._files}.npz")
        np.savez(src, x=x)
        ans = self._ask({"op": "load", "task": task, "single_root": single_root, "kind": kind, "x": src, "out": dst})
        with np.load(dst) as f:
            value = f["value"]
        return ans["id"], value, ans["first_s"]

    def lap(self, call_id: int) -> Lap:
        """One more call of a loaded task, timed by the worker."""
        return Lap(self._ask({"op": "lap", "id": call_id})["s"])

    def close(self) -> None:
        try:
            self._proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self._proc.stdin.close()
        finally:
            self._proc.wait(timeout=30)
            self._dir.cleanup()
