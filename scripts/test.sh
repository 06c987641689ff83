#!/usr/bin/env bash
# The test suite: sets up .venv when needed (scripts/_setup.sh: the same one install as run.sh),
# then runs `python -m pytest -q` in as many processes as the machine has cores, at most 4
# (pytest-xdist; extra arguments go to pytest, e.g. `-m slow`, `-k chain`, or `-n 0` for one process).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh"
setup
cd "$ROOT"
cores="$("$VENV/bin/python" -c 'import os; print(min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))')"
exec "$VENV/bin/python" -m pytest -q -n "$cores" "$@"
