# Sourced by scripts/run.sh, scripts/tour.sh and scripts/test.sh (not run on its own).
# `setup` makes $VENV if it is missing and installs into it, only what is not there yet:
#   torch==2.13.0 (pinned here; pyproject.toml states the range users may have), then this package
#   in editable mode with the extras every command needs (`pip install -e '.[test]'`; the test
#   extra includes experiments and graphs), which builds the C extensions.
# All three commands share one install: the second command after the first spends seconds here.
# The package is reinstalled only when its stamp changes: the extras, pyproject.toml, setup.py, the
# C sources or the checkout's place.
# Environment: PYTHON (default python3, 3.10 or newer), VENV (default $ROOT/.venv).

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
EXTRAS="test"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

say() { echo "[setup] $*" >&2; }

make_venv() {
    command -v "$PYTHON" >/dev/null || { say "no '$PYTHON' found: install Python 3.10+ or set PYTHON"; return 1; }
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || { say "$("$PYTHON" --version 2>&1) is too old: Python 3.10+ is needed (set PYTHON)"; return 1; }
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV" || {
        say "'$PYTHON -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"
        rm -rf "$VENV"
        return 1
    }
}

# What the installed package was built from: when this changes, it is installed again.
install_stamp() {
    local sources
    sources="$(cd "$ROOT" && find semiring structures \( -name '*.c' -o -name '*.h' \) | LC_ALL=C sort)"
    echo "$( (cd "$ROOT" && cat pyproject.toml setup.py $sources) | sha256sum | cut -d' ' -f1) extras=$EXTRAS $ROOT"
}

setup() {
    [ -x "$VENV/bin/python" ] || make_venv || return 1
    local py="$VENV/bin/python"
    if ! "$py" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
        say "installing torch==$TORCH_VERSION into $VENV"
        "$py" -m pip install -qq "torch==$TORCH_VERSION"
    fi
    local stamp="$VENV/.structures-installed" want
    want="$(install_stamp)"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        say "installing this package and its C extensions (pip install -e '.[$EXTRAS]')"
        "$py" -m pip install -qq -e "$ROOT[$EXTRAS]"
        echo "$want" >"$stamp"
    fi
}
