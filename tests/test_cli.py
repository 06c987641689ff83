"""Every command of the README answers --help with its program name and its defaults, without running."""

import importlib

import pytest

COMMANDS = ["structures.experiments." + m for m in ("babi", "distributed", "hmm_pos", "induce", "parse", "transduction")]


@pytest.mark.parametrize("module", COMMANDS + ["structures.tour"])
def test_help_names_the_command_and_exits(module, capsys):
    with pytest.raises(SystemExit) as exit:
        importlib.import_module(module).main(["--help"])
    assert exit.value.code == 0
    assert f"usage: python -m {module}" in capsys.readouterr().out


SUBCOMMANDS = {"structures.experiments.parse": ["train", "evaluate", "predict"]}


@pytest.mark.parametrize("module, subcommand", [(m, s) for m in COMMANDS for s in SUBCOMMANDS.get(m, [None])])
def test_help_shows_the_defaults(module, subcommand, capsys):
    with pytest.raises(SystemExit):
        importlib.import_module(module).main([subcommand, "--help"] if subcommand else ["--help"])
    assert "(default: " in capsys.readouterr().out
