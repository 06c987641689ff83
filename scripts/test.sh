#!/usr/bin/env bash
# The test suite: sets up .venv when needed (torch 2.13.0, this package with its test extras),
# then runs `python -m pytest -q` (extra arguments go to pytest, e.g. `-m slow` or `-k chain`).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh"
setup test
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q "$@"
