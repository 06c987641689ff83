"""SynJax's side of the side-by-side benchmarks: a worker process run with SynJax's own venv
(``~/.cache/jaxvenv``, see ../shared/peers/README.md), driven by :mod:`benchmarks.synjax_peer`.

Not imported by the project (it needs jax, numba and synjax, and not torch). Protocol: one JSON
object per line on stdin, one answer per line on stdout.

* ``{"op": "load", "task": T, "single_root": bool, "x": "in.npz", "out": "out.npz"}`` with T one of
  ``log_partition``, ``marginals`` (``SpanningTreeCRF``, jitted, float32) and ``mst`` (its numba
  ``vectorized_mst``, float64 as it computes): reads ``x`` (``[B, n+1, n+1]``, ``[b, h, m]``),
  makes the first call (jit / numba compile included), writes the result to ``out`` (``value``)
  and answers ``{"id": k, "first_s": seconds}``. T ``alignment_log_partition`` or
  ``alignment_marginals`` with ``"kind": "monotone_many_to_many"`` or ``"monotone_one_to_many"``:
  its ``AlignmentCRF`` (jitted, float32) on ``x`` ``[B, n, m]``. T ``chain_marginals``: its
  ``LinearChainCRF`` (jitted, float32) on our ``x [B, N-1, C, C]`` (``[b, i, from, to]``, the first
  tag free), given as its ``[B, N, C, C]`` whose first matrix's row 0 (its initial state) is 0
  (made before the first call); the result is its marginals of our edges, ``[:, 1:]``.
* ``{"op": "lap", "id": k}``: one more call, timed here (inputs on the device, the result blocked
  on, no transfer), answers ``{"s": seconds}``.
* ``{"op": "quit"}``.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("JAXTYPING_DISABLE", "1")  # its runtime checks crash on current jaxtyping/equinox

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import synjax  # noqa: E402
from synjax._src.deptree_algorithms.deptree_non_proj_argmax import vectorized_mst  # noqa: E402


def _call(task: str, single_root: bool, x: np.ndarray, kind: str | None = None):
    """A zero-argument call of SynJax on ``x`` that returns a finished numpy-convertible result."""
    if task.startswith("alignment_"):
        def align(lp):
            crf = synjax.AlignmentCRF(lp, alignment_type=kind)
            return crf.log_partition() if task == "alignment_log_partition" else crf.marginals()

        fn = jax.jit(align)
        dev = jnp.asarray(x, dtype=jnp.float32)
        return lambda: jax.block_until_ready(fn(dev))
    if task == "chain_marginals":
        fn = jax.jit(lambda lp: synjax.LinearChainCRF(lp).marginals()[:, 1:])
        first = np.zeros((x.shape[0], 1, *x.shape[2:]), dtype=np.float32)  # rows other than 0 are ignored
        dev = jnp.asarray(np.concatenate([first, x.astype(np.float32)], 1))
        return lambda: jax.block_until_ready(fn(dev))
    if task == "mst":
        lengths = np.full(x.shape[0], x.shape[-1])  # SynJax counts the root
        return lambda: vectorized_mst(x, lengths, single_root)

    def query(lp):
        crf = synjax.SpanningTreeCRF(lp, directed=True, projective=False, single_root_edge=single_root)
        return crf.log_partition() if task == "log_partition" else crf.marginals()

    fn = jax.jit(query)
    dev = jnp.asarray(x, dtype=jnp.float32)
    return lambda: jax.block_until_ready(fn(dev))


def main() -> None:
    calls = []
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "quit":
            break
        if req["op"] == "load":
            with np.load(req["x"]) as f:
                x = f["x"]
            fn = _call(req["task"], req["single_root"], x, req.get("kind"))
            t = time.perf_counter()
            out = fn()
            first = time.perf_counter() - t
            np.savez(req["out"], value=np.asarray(out))
            calls.append(fn)
            answer = {"id": len(calls) - 1, "first_s": first}
        else:
            fn = calls[req["id"]]
            t = time.perf_counter()
            fn()
            answer = {"s": time.perf_counter() - t}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
