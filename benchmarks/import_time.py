"""What ``import semiring`` and ``import structures`` cost over ``import torch``.

    python -m benchmarks.import_time [--repeat 7]

Each import runs in a fresh interpreter (``python -c "import torch; t = perf_counter(); import X;
..."``), so nothing is cached in the process; the best of ``--repeat`` runs is reported (the least
disturbed by other work on the machine), as wall time and as CPU time of the process, with whether
the import pulled in ``torch._dynamo`` (the compiler, 1-2 s of CPU on its own).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = """
import json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
import torch
t1, c1 = time.perf_counter(), time.process_time()
{body}
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps(dict(torch=t1 - t0, torch_cpu=c1 - c0, extra=t2 - t1, extra_cpu=c2 - c1,
                      dynamo="torch._dynamo" in sys.modules)))
"""


def measure(module: str | None, repeat: int) -> dict:
    """Best-of-``repeat`` seconds of ``import torch`` and of importing ``module`` after it."""
    body = f"import {module}" if module else "pass"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    runs = [json.loads(subprocess.run([sys.executable, "-c", PROBE.format(body=body)], env=env, check=True,
                                      capture_output=True, text=True).stdout) for _ in range(repeat)]
    best = {k: min(r[k] for r in runs) for k in ("torch", "torch_cpu", "extra", "extra_cpu")}
    best["dynamo"] = any(r["dynamo"] for r in runs)
    return best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.import_time", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7, help="fresh interpreters per import; the best is reported")
    args = ap.parse_args(argv)
    print("| import | import torch | then the import (wall) | (CPU) | torch._dynamo loaded |")
    print("|:--|--:|--:|--:|:--|")
    for module in ("semiring", "structures"):
        r = measure(module, args.repeat)
        print(f"| {module} | {r['torch']:.2f} s | +{r['extra']:.2f} s | +{r['extra_cpu']:.2f} s | {'yes' if r['dynamo'] else 'no'} |")


if __name__ == "__main__":
    main()
