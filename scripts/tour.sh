#!/usr/bin/env bash
# The tour of the library: sets up .venv when needed (scripts/_setup.sh: the same one install as run.sh), then runs
# `python -m structures.tour`. Safe to run again: nothing is reinstalled that is already there.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh"
setup
cd "$ROOT"
exec "$VENV/bin/python" -m structures.tour "$@"
