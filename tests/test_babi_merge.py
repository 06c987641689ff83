"""Pieces of one bAbI protocol (other seeds, other tasks) merge into the table of one long run."""

import csv

import pytest

from structures.experiments import babi, babi_merge
from structures.experiments.babi_data import task_files

needs_data = pytest.mark.skipif(not task_files(babi.default_data_dir(), 2)[0].exists(), reason="bAbI data not available")
QUICK = ["--quick", "--tasks", "2", "--models", "binary", "--link", "inputs"]


def test_settings_leave_out_what_only_says_which_piece():
    command = ("`python -m structures.experiments.babi --tasks 2 11 --models binary --runs 20 --seed 10 --link inputs "
               "--threads 1 --out results/x --batch-size 1`")
    assert babi_merge.settings(command) == (("--batch-size", "1"), ("--link", "inputs"), ("--models", "binary"))
    assert babi_merge.settings(command.replace("--link inputs", "--link=inputs")) == babi_merge.settings(command)
    reordered = command.replace(" --link inputs", "").replace("--batch-size 1", "--batch-size 1 --link inputs")
    assert babi_merge.settings(reordered) == babi_merge.settings(command)
    assert babi_merge.settings(command.replace("--tasks 2 11", "--tasks 3")) == babi_merge.settings(command)
    assert babi_merge.settings(command.replace("inputs", "outputs")) != babi_merge.settings(command)


@pytest.fixture(scope="module")
def pieces(tmp_path_factory):
    root = tmp_path_factory.mktemp("pieces")
    for seed in (0, 1):
        babi.main(QUICK + ["--seed", str(seed), "--out", str(root / f"seed{seed}")])
    babi.main(QUICK[:-1] + ["outputs", "--seed", "2", "--out", str(root / "other_link")])
    return root


@needs_data
def test_two_seeds_merge_into_one_table_of_their_best_run(pieces, tmp_path):
    rows = babi_merge.main([str(pieces / "seed0"), str(pieces / "seed1"), "--out", str(tmp_path)])
    runs = [r for f in ("seed0", "seed1") for r in csv.DictReader(open(pieces / f / "babi_runs.csv"))]
    best = max(runs, key=lambda r: (float(r["valid_answer"]), -float(r["valid_loss"])))
    task_row = rows[0]
    assert (task_row["task"], task_row["runs"], task_row["best_seed"]) == (2, 2, int(best["seed"]))
    assert task_row["test_answer"] == pytest.approx(float(best["test_answer"]))
    assert task_row["top_half_test_fact"] == pytest.approx(float(best["test_fact"]))  # the better 1 of 2
    assert len(list(csv.DictReader(open(tmp_path / "babi_runs.csv")))) == 2
    questions = list(csv.DictReader(open(tmp_path / "babi_questions.csv")))
    assert {q["seed"] for q in questions} == {best["seed"]}
    assert questions == list(csv.DictReader(open(pieces / f"seed{best['seed']}" / "babi_questions.csv")))
    assert "merged from" in (tmp_path / "babi.md").read_text()


@needs_data
def test_a_run_twice_or_other_settings_are_refused(pieces, tmp_path):
    with pytest.raises(ValueError, match="task 2 binary seed 0 was trained in"):
        babi_merge.merge([pieces / "seed0", pieces / "seed0"])
    with pytest.raises(ValueError, match="differ"):
        babi_merge.merge([pieces / "seed0", pieces / "other_link"])
    with pytest.raises(ValueError, match="to hold a babi run's babi.md"):
        babi_merge.merge([tmp_path])
