"""scripts/_setup.sh installs the package once for every command, and again only when what it is
built from changes (run with a fake venv whose python logs each pip call instead of running it)."""

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
FAKE_PYTHON = """#!/usr/bin/env bash
# torch is there (the version check passes); pip only logs what it was asked.
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "$*" >>"$(dirname "$0")/pip.log"; fi
exit 0
"""

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("sha256sum") is None,
                                reason="needs bash and sha256sum")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A checkout with the set-up script, the files its stamp reads, and a venv of a fake python."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPTS / "_setup.sh", tmp_path / "scripts")
    for name in ("pyproject.toml", "setup.py"):
        (tmp_path / name).write_text(f"# {name}\n")
    for package in ("semiring", "structures/spanning"):
        (tmp_path / package).mkdir(parents=True)
    (tmp_path / "structures/spanning/_kernel.c").write_text("int f(void) { return 0; }\n")
    python = tmp_path / ".venv/bin/python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return tmp_path


def run_setup(checkout: Path) -> None:
    subprocess.run(["bash", "-c", "source scripts/_setup.sh && setup"], cwd=checkout, check=True,
                   env={"PATH": "/usr/bin:/bin", "VENV": str(checkout / ".venv")}, capture_output=True)


def installs(checkout: Path) -> list[str]:
    log = checkout / ".venv/bin/pip.log"
    return [line for line in log.read_text().splitlines() if " -e " in line] if log.exists() else []


def test_every_command_after_the_first_installs_nothing(checkout):
    for _ in range(3):  # run.sh, then test.sh, then tour.sh: the same setup
        run_setup(checkout)
    assert installs(checkout) == [f"-m pip install -qq -e {checkout}[test]"]


@pytest.mark.parametrize("changed", ["pyproject.toml", "setup.py", "structures/spanning/_kernel.c"])
def test_a_changed_build_input_installs_again(checkout, changed):
    run_setup(checkout)
    with open(checkout / changed, "a") as f:
        f.write("// changed\n")
    run_setup(checkout)
    run_setup(checkout)
    assert len(installs(checkout)) == 2


def test_a_new_c_source_installs_again(checkout):
    run_setup(checkout)
    (checkout / "semiring/_new.c").write_text("int g(void) { return 1; }\n")
    run_setup(checkout)
    assert len(installs(checkout)) == 2
