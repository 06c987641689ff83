"""One bAbI protocol cut into pieces: the runs of several ``babi`` output folders, trained with the
same settings on other tasks or seeds, merged into the table one long run would have written.

    python -m structures.experiments.babi_merge --out results/babi_a4 results/babi_a4_t2_s0 results/babi_a4_t2_s10 ...

Kim et al.'s protocol (20 initializations a task, the best by validation, facts as the mean of the
10 best) takes ~8 core-hours a model variant here, more than a working session. Each piece is one
``babi`` command (``--tasks T --runs 10 --seed S --out ...``); this module checks that the pieces
share every setting but the tasks, the seeds, the runs, the threads and the output folder, that no
task, model and seed was trained twice, and writes ``babi.md``, ``babi.csv``, ``babi_runs.csv``
and (from the pieces that have one) ``babi_questions.csv`` for the best run of each task and model.
"""

from __future__ import annotations

import argparse
import csv
import shlex
from pathlib import Path
from typing import Sequence

from . import command_line
from .babi import average_rows, summarize, write_runs, write_tables

# options that say which part of the protocol a piece ran, not how it trained
PIECE_OPTIONS = {"--tasks", "--seed", "--runs", "--threads", "--out"}
NUMBERS = ("train_loss", "valid_answer", "valid_loss", "test_answer", "test_fact", "seconds", "load")


def settings(command: str) -> tuple[tuple[str, ...], ...]:
    """A ``babi`` command's options with their values, in any order, without the
    :data:`PIECE_OPTIONS` (the command is the first line of its ``babi.md``, in backquotes; every
    word after an option is one of its values, since ``babi`` takes no positional arguments)."""
    words = shlex.split(command.strip().strip("`"))
    if "structures.experiments.babi" in words:
        words = words[words.index("structures.experiments.babi") + 1:]
    options: list[list[str]] = []
    for word in words:
        if word.startswith("--"):
            options.append(word.split("=", 1))
        elif options:
            options[-1].append(word)
    return tuple(sorted(tuple(o) for o in options if o[0] not in PIECE_OPTIONS))


def _words(options: tuple[tuple[str, ...], ...]) -> str:
    return " ".join(word for option in options for word in option)


def read_piece(folder: Path) -> tuple[str, list[dict], list[dict], str]:
    """``(command, runs, questions, commit)`` of one ``babi`` output folder: its command line,
    ``babi_runs.csv`` with numbers as numbers, ``babi_questions.csv`` rows (empty where the piece
    has none) and the commit its ``babi.csv`` names."""
    for name in ("babi.md", "babi_runs.csv", "babi.csv"):
        if not (folder / name).exists():
            raise ValueError(f"folders: expected {folder} to hold a babi run's {name}, it does not")
    command = (folder / "babi.md").read_text().splitlines()[0]
    with open(folder / "babi_runs.csv", newline="") as f:
        runs = [{**r, "task": int(r["task"]), "seed": int(r["seed"]), **{k: float(r[k]) for k in NUMBERS if k in r}}
                for r in csv.DictReader(f)]
    questions: list[dict] = []
    if (folder / "babi_questions.csv").exists():
        with open(folder / "babi_questions.csv", newline="") as f:
            questions = list(csv.DictReader(f))
    with open(folder / "babi.csv", newline="") as f:
        commit = next(csv.DictReader(f))["commit"]
    return command, runs, questions, commit


def merge(folders: Sequence[Path]) -> tuple[tuple[tuple[str, ...], ...], list[dict], list[dict], list[dict], dict[str, str]]:
    """``(settings, table rows with the averages, every run, the best runs' question rows, commit
    per folder)``; raises ``ValueError`` where the folders' settings differ or a run repeats."""
    pieces = [(folder, read_piece(folder)) for folder in folders]
    first = settings(pieces[0][1][0])
    other = [str(folder) for folder, (command, *_) in pieces if settings(command) != first]
    if other:
        raise ValueError(f"folders: expected the settings of {folders[0]} ({_words(first)}) in every folder; "
                         f"{', '.join(other)} differ")
    runs: dict[tuple[int, str], list[dict]] = {}
    seen: dict[tuple[int, str, int], int] = {}  # the piece that trained a task, model and seed
    for i, (folder, (_, rows, _, _)) in enumerate(pieces):
        for r in rows:
            key = (r["task"], r["model"], r["seed"])
            if key in seen:
                raise ValueError(f"folders: task {key[0]} {key[1]} seed {key[2]} was trained in "
                                 f"{pieces[seen[key]][0]} and in {folder}")
            seen[key] = i
            runs.setdefault((r["task"], r["model"]), []).append(r)
    rows = [summarize(task, model, rs) for (task, model), rs in sorted(runs.items())]
    models = list(dict.fromkeys(model for _, model in sorted(runs)))
    questions = [q for row in rows for q in pieces[seen[row["task"], row["model"], row["best_seed"]]][1][2]
                 if (int(q["task"]), q["model"], int(q["seed"])) == (row["task"], row["model"], row["best_seed"])]
    every = [r for rs in runs.values() for r in rs]
    return first, rows + average_rows(rows, models), every, questions, {str(f): piece[3] for f, piece in pieces}


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = command_line("babi_merge", __doc__)
    p.add_argument("folders", type=Path, nargs="+", help="babi output folders, one piece each")
    p.add_argument("--out", type=Path, required=True, help="where the merged tables go")
    args = p.parse_args(argv)
    try:
        shared, rows, every, questions, commits = merge(args.folders)
    except ValueError as error:
        p.error(str(error))
    args.out.mkdir(parents=True, exist_ok=True)
    seeds = sorted({r["seed"] for r in every})
    pieces = "; ".join(f"{folder} ({commit})" for folder, commit in commits.items())
    write_tables(rows, args.out, f"babi {_words(shared)}, merged from {pieces}", seeds)
    write_runs(every, args.out / "babi_runs.csv")
    if questions:
        with open(args.out / "babi_questions.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, list(questions[0]))
            writer.writeheader()
            writer.writerows(questions)
    print((args.out / "babi.md").read_text())
    return rows


if __name__ == "__main__":
    main()
