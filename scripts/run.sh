#!/usr/bin/env bash
# The main reproduction: sets up .venv when needed (scripts/_setup.sh: torch 2.13.0, this package and
# the extras every command needs, installed once), then runs the tree
# transduction of Kim et al. 2017 (`python -m structures.experiments.transduction`). Arguments go
# to it: `--quick` (seconds), `--full` (the paper's sizes, ~18 minutes), `--help`. Default: about 7 minutes of
# CPU (one torch thread; the README's table has wall times); tables and plots land in results/transduction/.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh"
setup
cd "$ROOT"
exec "$VENV/bin/python" -m structures.experiments.transduction "$@"
