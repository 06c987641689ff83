"""The tree-transduction reproduction (Kim et al. 2017, §4.1): data, model, metric and CLI."""

import csv
import random

import pytest
import torch
from torch import nn

from structures.experiments import transduction as T
from structures.experiments.arithmetic import formula, infix, prefix


def nesting(tokens):
    depth = deepest = 0
    for t in tokens:
        depth += (t == "(") - (t == ")")
        deepest = max(deepest, depth)
    return deepest


def test_the_papers_example_in_both_notations():
    f = ("*", [("+", [("+", ["15", "7"]), "1", "8"]), ("+", ["19", "0", "11"])])
    assert " ".join(prefix(f)) == "( * ( + ( + 15 7 ) 1 8 ) ( + 19 0 11 ) )"
    assert " ".join(infix(f)) == "( ( 15 + 7 ) + 1 + 8 ) * ( 19 + 0 + 11 )"


@pytest.mark.parametrize("depth", [1, 2, 3, 5])
def test_formulas_have_the_asked_depth_and_at_most_four_arguments(depth):
    rng = random.Random(depth)
    for _ in range(50):
        f = formula(rng, depth)
        assert nesting(prefix(f)) == depth
        assert nesting(infix(f)) == depth - 1  # the outermost parentheses are dropped

        def arities(g):
            return [] if isinstance(g, str) else [len(g[1])] + [a for x in g[1] for a in arities(x)]
        assert all(2 <= a <= 4 for a in arities(f))


def test_make_data_sizes_depths_and_unseen_test():
    data = T.make_data(train_per_depth=30, test_per_depth=10, valid_per_depth=5, seed=3)
    assert [len(data[k]) for k in ("train", "valid", "test")] == [90, 15, 50]
    assert sorted({p.depth for p in data["train"]}) == [2, 3, 4]
    assert sorted({p.depth for p in data["test"]}) == [2, 3, 4, 5, 6]
    assert all(nesting(p.prefix) == p.depth for p in data["train"] + data["test"])
    sources = [p.prefix for k in data for p in data[k]]
    assert len(set(sources)) == len(sources)
    assert T.make_data(30, 10, 5, seed=3) == data  # deterministic given the seed


def test_batches_put_the_root_first_and_pad_sources_to_buckets():
    data = T.make_data(20, 2, 2, seed=0)["train"]
    out = T.batches(data, 7, random.Random(0))
    assert sum(len(b) for b in out) == len(data)
    for b in out:
        assert b.src.shape[1] % 8 == 0
        assert (b.src[:, 0] == T.SOURCE_INDEX[T.ROOT]).all()
        assert (b.src_lengths <= b.src.shape[1]).all()
        assert (b.tgt_in[:, 0] == T.BOS).all()
        ends = b.tgt_out.gather(1, b.tgt_lengths[:, None]).squeeze(1)
        assert (ends == T.EOS).all()


class Oracle(nn.Module):
    """Predicts the target exactly, except at position ``error`` (if any) of every example."""

    def __init__(self, batch, error=None):
        super().__init__()
        self.batch, self.error = batch, error

    def forward(self, src, src_lengths, tgt_in):
        target = self.batch.tgt_out.clone()
        if self.error is not None:
            target[:, self.error] = (target[:, self.error] + 1) % len(T.TARGET_VOCAB)
        return nn.functional.one_hot(target, len(T.TARGET_VOCAB)).float()


def test_metric_is_the_proportion_correct_before_the_first_error():
    pairs = T.make_data(5, 1, 1, train_depths=[2], seed=1)["train"]
    batch, = T.batches(pairs, 100)
    assert torch.allclose(T.correct_prefix(Oracle(batch), batch), torch.ones(len(batch)))
    assert torch.allclose(T.correct_prefix(Oracle(batch, error=2), batch), 2 / batch.tgt_lengths.float())
    assert T.evaluate(Oracle(batch), pairs) == {2: 100.0}


def test_formula_scores_follow_the_pairs_order_whatever_the_batches():
    pairs = T.make_data(12, 1, 1, train_depths=[2, 3], seed=2)["train"]
    order = [i for index in T.batch_order(pairs, 100) for i in index]
    assert order != list(range(len(pairs)))  # the batch sorts by length: the scores must be put back
    batch = T.collate([pairs[i] for i in order])
    scores = T.formula_scores(Oracle(batch, error=1), pairs)
    assert scores == pytest.approx([1 / len(p.infix) for p in pairs])
    assert T.by_depth(pairs, scores) == pytest.approx(
        {d: 100 * sum(1 / len(p.infix) for p in pairs if p.depth == d) / 12 for d in (2, 3)})


@pytest.mark.parametrize("kind", T.KINDS)
def test_models_train_and_every_parameter_gets_a_gradient(kind):
    data = T.make_data(4, 1, 1, train_depths=[2], seed=0)["train"]
    batch = T.collate(data)
    model = T.build_model(kind, dim=8, seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    first = T.train_step(model, batch, optimizer)
    assert all(p.grad is not None for p in model.parameters())
    for _ in range(15):
        last = T.train_step(model, batch, optimizer)
    assert last < first
    logits = model(batch.src, batch.src_lengths, batch.tgt_in)
    assert logits.shape == (*batch.tgt_in.shape, len(T.TARGET_VOCAB))


def test_build_model_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        T.build_model("tree")


def test_quick_run_writes_the_table_and_figures_and_prints_the_table_once(tmp_path, capsys):
    results = T.main(["--quick", "--out", str(tmp_path), "--seed", "3"])
    assert set(results) == set(T.KINDS)
    for name in ("results.md", "results.csv", "formulas.csv", "accuracy.png", "attention.png"):
        assert (tmp_path / name).stat().st_size > 0
    formulas = list(csv.DictReader(open(tmp_path / "formulas.csv")))
    assert len(formulas) == 30 and {f["depth"] for f in formulas} == {"2", "3", "4"}
    for kind in T.KINDS:
        for depth in (2, 3, 4):
            mean = 100 * sum(float(f[kind]) for f in formulas if f["depth"] == str(depth)) / 10
            assert mean == pytest.approx(results[kind]["test"][depth], abs=1e-3)
    rows = list(csv.reader(open(tmp_path / "results.csv")))
    assert rows[0][:4] == ["depth", "none", "simple", "structured"]
    assert [r[0] for r in rows[1:]] == ["2", "3", "4", "wall_seconds", "cpu_seconds", "commit", "cpu", "threads", "seeds"]
    assert all(0 <= float(x) <= 100 for r in rows[1:4] for x in r[1:4])
    assert dict(r[:2] for r in rows[-4:])["seeds"] == "3"
    assert dict(r[:2] for r in rows[-4:])["threads"] == "1"
    printed = capsys.readouterr().out
    assert printed.count("# Tree transduction") == 1
    assert (tmp_path / "results.md").read_text() in printed
    assert "seed(s) 3." in printed


def test_depth_three_formulas_are_as_long_as_the_papers_example_on_average():
    rng = random.Random(0)
    mean = sum(len(prefix(formula(rng, 3))) for _ in range(2000)) / 2000
    assert 20 <= mean <= 23  # the paper's depth-3 example has 21 tokens


def test_learning_rate_halves_from_decay_after():
    data = T.make_data(4, 1, 1, train_depths=[2], test_depths=[2], seed=0)
    config = T.parse_args(["--quick", "--epochs", "3", "--decay-after", "2", "--lr", "0.01"])
    _, outcome = T.fit("none", data, config)
    assert [h["lr"] for h in outcome["history"]] == [0.01, 0.01, 0.005]
    assert set(outcome["test"]) == {2}
