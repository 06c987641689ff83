#!/usr/bin/env bash
# The test suite: sets up .venv when needed (scripts/_setup.sh: the same one install as run.sh),
# then runs `python -m pytest -q` (extra arguments go to pytest, e.g. `-m slow` or `-k chain`).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh"
setup
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q "$@"
