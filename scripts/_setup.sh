# Sourced by scripts/run.sh, scripts/tour.sh and scripts/test.sh (not run on its own).
# `setup [EXTRAS]` makes $ROOT/.venv if it is missing and installs into it, only when needed:
#   torch==2.13.0 (pinned here; pyproject.toml states the range users may have), then this
#   package in editable mode (`pip install -e .` or `pip install -e '.[EXTRAS]'`).
# Environment: PYTHON (default python3, 3.10 or newer), VENV (default $ROOT/.venv).

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

say() { echo "[setup] $*" >&2; }

setup() {
    local extras="${1:-}"
    if [ ! -x "$VENV/bin/python" ]; then
        command -v "$PYTHON" >/dev/null || { say "no '$PYTHON' found: install Python 3.10+ or set PYTHON"; return 1; }
        "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
            || { say "$("$PYTHON" --version 2>&1) is too old: Python 3.10+ is needed (set PYTHON)"; return 1; }
        say "creating $VENV"
        "$PYTHON" -m venv "$VENV" || {
            say "'$PYTHON -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"
            rm -rf "$VENV"
            return 1
        }
    fi
    local py="$VENV/bin/python"
    if ! "$py" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
        say "installing torch==$TORCH_VERSION into $VENV"
        "$py" -m pip install -qq "torch==$TORCH_VERSION"
    fi
    # Reinstall the package (building the C extensions) only when pyproject.toml, setup.py, the C
    # sources, the extras or the checkout's place change.
    local stamp="$VENV/.structures-installed${extras:+-$extras}"
    local want
    want="$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT"/structures/decode/_tarjan.c "$ROOT"/structures/_matrix_tree_c.c "$ROOT"/semiring/language/_kernel.c | sha256sum | cut -d' ' -f1) $ROOT"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        say "installing this package (pip install -e '.${extras:+[$extras]}')"
        "$py" -m pip install -qq -e "$ROOT${extras:+[$extras]}"
        echo "$want" >"$stamp"
    fi
}
