"""The significance tests behind every comparison of the reproductions (docs/protocol.md)."""

import itertools
import math

import numpy as np
import pytest

from structures.experiments.significance import (
    attached_per_sentence, compare_formulas, compare_questions, main, paired_bootstrap, t_two_sided, welch,
)
from structures.experiments.ud import Sentence


def test_identical_systems_are_not_different():
    scores = np.random.default_rng(0).integers(0, 2, size=300)
    result = paired_bootstrap(scores, scores)
    assert result.difference == 0 and result.p_value == 1.0
    assert result.low == result.high == 0


def test_a_clearly_better_system_is_significant_and_its_interval_excludes_zero():
    rng = np.random.default_rng(1)
    b = rng.random(500) < 0.6
    a = b | (rng.random(500) < 0.5)  # right wherever b is, and on about half of the rest
    result = paired_bootstrap(a, b, samples=2000)
    assert result.difference > 0.15
    assert result.p_value == pytest.approx(1 / 2001)
    assert 0 < result.low < result.difference < result.high


def test_the_bootstrap_p_value_matches_enumerating_every_resample():
    # four items: every one of the 4^4 ordered resamples is equally likely
    a = np.array([1.0, 1.0, 0.0, 1.0])
    b = np.array([0.0, 1.0, 0.0, 0.0])
    observed = (a - b).mean()
    far = [abs((a - b)[list(i)].mean() - observed) >= abs(observed) for i in itertools.product(range(4), repeat=4)]
    exact = sum(far) / len(far)
    result = paired_bootstrap(a, b, samples=40_000, seed=3)
    assert result.difference == observed == 0.5
    assert result.p_value == pytest.approx(exact, abs=0.01)  # Monte Carlo error ~0.002


def test_a_corpus_ratio_weighs_items_by_their_totals():
    # sentence 1 has 10 words, 9 right for a and 1 for b; sentence 2 has 1 word, a wrong, b right
    result = paired_bootstrap([9, 0], [1, 1], totals=[10, 1], samples=200)
    assert result.difference == pytest.approx((9 - 2) / 11)


def test_the_result_is_reproducible_from_its_seed():
    rng = np.random.default_rng(2)
    a, b = rng.random(50), rng.random(50)
    assert paired_bootstrap(a, b, seed=5) == paired_bootstrap(a, b, seed=5)


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="a, b, totals"):
        paired_bootstrap([1, 0], [1])
    with pytest.raises(ValueError, match="at least one item"):
        paired_bootstrap([], [])


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.5, 12.0])
def test_t_distribution_tails_equal_the_closed_forms(t):
    assert t_two_sided(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), abs=1e-12)  # Cauchy
    assert t_two_sided(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-12)


def test_t_distribution_tail_at_a_tabled_critical_value():
    assert t_two_sided(2.228139, 10) == pytest.approx(0.05, abs=1e-6)
    assert t_two_sided(1.959964, 1e7) == pytest.approx(0.05, abs=1e-5)  # the normal limit


def test_welch_on_a_textbook_case():
    result = welch([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])  # t = -5 on 8 degrees of freedom
    assert result.t == pytest.approx(-5.0)
    assert result.df == pytest.approx(8.0)
    assert result.p_value == pytest.approx(0.001053, abs=2e-6)


def test_welch_on_identical_constant_samples():
    assert welch([1.0, 1.0], [1.0, 1.0]).p_value == 1.0


def sentence(heads, upos=None):
    n = len(heads)
    return Sentence(tokens=None, words=tuple(f"w{i}" for i in range(n)), upos=tuple(upos or ["NOUN"] * n),
                    heads=tuple(heads), deprels=("dep",) * n)


def test_per_sentence_attachment_counts_right_heads_and_words():
    gold = [sentence([0, 1, 1], ["NOUN", "VERB", "PUNCT"]), sentence([2, 0])]
    predicted = [sentence([0, 1, 2]), sentence([0, 1])]
    assert attached_per_sentence(gold, predicted) == ([2, 0], [3, 2])
    assert attached_per_sentence(gold, predicted, no_punct=True) == ([2, 0], [2, 2])


def test_per_sentence_attachment_refuses_another_text():
    with pytest.raises(ValueError, match="sentences"):
        attached_per_sentence([sentence([0])], [])


def test_the_seeds_command_prints_the_test(capsys):
    main(["seeds", "--a", "1", "2", "3", "4", "5", "--b", "6", "7", "8", "9", "10"])
    assert "p = 0.00105" in capsys.readouterr().out


def conllu(heads_per_sentence):
    blocks = []
    for heads in heads_per_sentence:
        rows = [f"{i}\tw{i}\tw{i}\tNOUN\t_\t_\t{h}\tdep\t_\t_" for i, h in enumerate(heads, 1)]
        blocks.append("\n".join(rows) + "\n")
    return "\n".join(blocks) + "\n"


def test_the_parses_command_compares_two_predicted_files(tmp_path, capsys):
    (tmp_path / "gold.conllu").write_text(conllu([[0, 1, 1], [2, 0]]))
    (tmp_path / "a.conllu").write_text(conllu([[0, 1, 1], [2, 0]]))  # 5 of 5 right
    (tmp_path / "b.conllu").write_text(conllu([[0, 1, 2], [0, 1]]))  # 2 of 5
    main(["parses", str(tmp_path / "gold.conllu"), str(tmp_path / "a.conllu"), str(tmp_path / "b.conllu"),
          "--samples", "100"])
    out = capsys.readouterr().out
    assert "UAS a 100.00, b 40.00" in out and "difference +0.6" in out


def _questions(path, answers, facts=None, model="binary"):
    rows = ["task,model,seed,question,answer_correct,fact_correct"]
    for q, a in enumerate(answers):
        rows.append(f"{2 + q % 2},{model},0,{q // 2},{a},{(facts or answers)[q]}")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_two_babi_runs_are_compared_question_by_question(tmp_path, capsys):
    right = _questions(tmp_path / "a.csv", [1] * 40)
    wrong = _questions(tmp_path / "b.csv", [0] * 40, facts=[1] * 40)
    result = compare_questions(right, wrong, samples=200)
    assert set(result) == {"task 2 binary", "task 3 binary", "all"}
    acc_a, acc_b, c = result["all"]
    assert (acc_a, acc_b, c.difference) == (100.0, 0.0, 100.0) and c.p_value == 1 / 201
    same = compare_questions(right, right, samples=200)["task 2 binary"][2]
    assert same.difference == 0 and same.p_value == 1.0
    assert compare_questions(right, wrong, column="fact_correct", samples=200)["all"][2].difference == 0
    main(["questions", str(right), str(wrong), "--samples", "200"])
    assert "all: a 100.0, b 0.0; a - b: difference +100" in capsys.readouterr().out


def test_two_models_are_compared_question_by_question(tmp_path, capsys):
    binary = _questions(tmp_path / "a.csv", [1] * 40)
    memn2n = _questions(tmp_path / "b.csv", [1, 0] * 20, model="memn2n")
    result = compare_questions(binary, memn2n, samples=200, models=("binary", "memn2n"))
    assert set(result) == {"task 2 binary - memn2n", "task 3 binary - memn2n", "all"}
    assert result["task 2 binary - memn2n"][:2] == (100.0, 100.0) and result["task 3 binary - memn2n"][:2] == (100.0, 0.0)
    with pytest.raises(ValueError, match="same tasks, models and questions"):  # the models differ: no pairs
        compare_questions(binary, memn2n, samples=200)
    with pytest.raises(ValueError, match="models: expected a model that .* scores, got 'unary'"):
        compare_questions(binary, memn2n, samples=200, models=("unary", "memn2n"))
    with pytest.raises(ValueError, match="models: expected both"):
        compare_questions(binary, memn2n, samples=200, models=("binary", None))
    main(["questions", str(binary), str(memn2n), "--models", "binary", "memn2n", "--samples", "200"])
    assert "all: a 100.0, b 50.0" in capsys.readouterr().out


def test_runs_of_different_questions_are_refused(tmp_path):
    with pytest.raises(ValueError, match="same tasks, models and questions"):
        compare_questions(_questions(tmp_path / "a.csv", [1] * 40), _questions(tmp_path / "b.csv", [1] * 38))


def test_two_models_of_a_transduction_run_are_compared_formula_by_formula(tmp_path, capsys):
    path = tmp_path / "formulas.csv"
    rows = ["formula,depth,prefix,simple,structured"]
    rows += [f"{i},{2 + i % 2},+ 1 2,{0.5 if i % 2 else 0.25},{1 if i % 2 else 0.25}" for i in range(40)]
    path.write_text("\n".join(rows) + "\n")
    result = compare_formulas(path, "structured", "simple", samples=200)
    assert set(result) == {"depth 2", "depth 3", "all"}
    a, b, c = result["depth 3"]
    assert (a, b, c.difference) == (100.0, 50.0, 50.0) and c.p_value == 1 / 201
    a, b, c = result["depth 2"]
    assert (a, b, c.difference) == (25.0, 25.0, 0.0) and c.p_value == 1.0
    assert result["all"][2].difference == pytest.approx(25.0)
    with pytest.raises(ValueError, match="models of"):
        compare_formulas(path, "structured", "none")
    main(["formulas", str(path), "--a", "structured", "--b", "simple", "--samples", "200"])
    assert "depth 3: structured 100.0, simple 50.0; a - b: difference +50" in capsys.readouterr().out
