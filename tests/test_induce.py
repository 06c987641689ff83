"""Induced trees: the cloze masking, the per-word masked extraction, the baselines, tree statistics,
and the command on a slice of UD."""

import pytest
import torch

from structures.experiments import default_data_dir, induce
from structures.experiments.attachment import TreeStatistics, depths, is_tree
from structures.experiments.ud import Sentence

DATA = default_data_dir()


def toy(words, heads) -> Sentence:
    return Sentence(None, tuple(words), ("NOUN",) * len(words), tuple(heads), ("dep",) * len(words))


SENTENCES = [toy("the cat sat".split(), [2, 3, 0]), toy("a dog saw the cat today".split(), [2, 3, 0, 5, 3, 3]),
             toy("the dog sat".split(), [2, 3, 0])]


def test_masking_hides_known_words_only_and_at_least_one_per_sentence():
    index = induce.word_index(SENTENCES, min_count=1)
    words, lengths = induce.encode(SENTENCES, index, bucket=8)
    words[1, 5] = induce.UNK
    before = words.clone()
    masked, chosen = induce.mask_words(words, lengths, 0.0, torch.Generator().manual_seed(0))
    assert torch.equal(words, before)
    assert chosen.sum(1).tolist() == [1, 1, 1]
    assert (masked[chosen] == induce.MASK).all() and torch.equal(masked[~chosen], words[~chosen])
    _, chosen = induce.mask_words(words, lengths, 1.0, torch.Generator().manual_seed(0))
    assert chosen.sum().item() == 11  # every real known word (the UNK and the padding never)


def test_masked_scores_come_from_the_copy_with_that_word_masked():
    torch.manual_seed(0)
    index = induce.word_index(SENTENCES, min_count=1)
    model = induce.ClozeModel(len(index), dim=8, hidden=8).eval()
    words, lengths = induce.encode(SENTENCES, index, bucket=8)
    with torch.no_grad():
        scores = induce.masked_arc_scores(model, words, lengths)
        for b in range(3):
            for m in range(1, int(lengths[b]) + 1):
                copy = words[b:b + 1].clone()
                copy[0, m - 1] = induce.MASK
                direct = model(copy, lengths[b:b + 1])[1].distribution.log_potentials[0, :, m]
                assert torch.allclose(scores[b, :, m], direct, atol=1e-5)


def test_induced_trees_are_single_rooted_trees():
    torch.manual_seed(0)
    index = induce.word_index(SENTENCES, min_count=1)
    trees = induce.induced_trees(induce.ClozeModel(len(index), dim=8, hidden=8), SENTENCES, index)
    for kind in ("masked", "unmasked"):
        for s, heads in zip(SENTENCES, trees[kind]):
            assert len(heads) == s.n and is_tree(heads) and heads.count(0) == 1


def test_chain_baselines_and_their_scores():
    trees = induce.chain_trees(SENTENCES[:1])
    assert trees == {"right-branching": [[0, 1, 2]], "left-branching": [[2, 3, 0]]}
    left = induce.score_trees(SENTENCES[:1], trees["left-branching"])
    right = induce.score_trees(SENTENCES[:1], trees["right-branching"])
    assert left["directed"] == 1.0 and right["directed"] == 0.0
    assert right["undirected"] == pytest.approx(2 / 3)  # 1-2 and 2-3 are gold arcs reversed
    assert left["mean_height"] == 3 and left["adjacent_arcs"] == 1.0


def test_tree_statistics():
    assert depths([2, 0, 2]) == [2, 1, 2] and depths([3, 4, 0, 3]) == [2, 3, 1, 2]
    stats = TreeStatistics()
    stats.add([2, 0, 2])
    stats.add([3, 4, 0, 3])
    assert stats.summary() == {"mean_height": 2.5, "projective": 0.5, "mean_arc_length": 1.4,
                               "adjacent_arcs": 0.6, "mean_depth": 13 / 7}
    with pytest.raises(ValueError, match="heads"):
        stats.add([2, 1])


@pytest.mark.skipif(not (DATA / "ud").exists(), reason="shared UD data not available")
def test_quick_command(tmp_path):
    rows = induce.main(["--quick", "--max-sentences", "20", "--out", str(tmp_path)])
    assert [r["trees"] for r in rows] == ["gold", "masked", "unmasked", "right-branching", "left-branching"]
    assert rows[0]["directed"] == 1.0 and all(0 <= r["undirected"] <= 1 for r in rows)
    for suffix in (".md", ".csv", "_epochs.csv", "_trees.png", "_marginals.png", "_depths.png"):
        assert (tmp_path / f"en_bilinear{suffix}").stat().st_size > 0


def test_hub_penalty_is_one_for_a_chain_and_n_for_a_hub():
    n = 4
    chain = torch.zeros(1, n + 1, n + 1)
    hub = torch.zeros(1, n + 1, n + 1)
    for m in range(1, n + 1):
        chain[0, m - 1, m] = 1.0  # word m headed by word m-1 (word 1 by the root)
        hub[0, 1 if m > 1 else 0, m] = 1.0  # word 1 heads every other word
    lengths = torch.tensor([n])
    assert induce.hub_penalty(chain, lengths).item() == pytest.approx((n - 1) / n)
    assert induce.hub_penalty(hub, lengths).item() == pytest.approx((n - 1) ** 2 / n)


def test_parent_objective_predicts_from_the_parent_only():
    torch.manual_seed(0)
    index = induce.word_index(SENTENCES, min_count=1)
    model = induce.ClozeModel(len(index), dim=8, hidden=8, objective="parent")
    words, lengths = induce.encode(SENTENCES, index, bucket=8)
    logits, out = model(words, lengths)
    assert logits.shape == (3, 8, len(index)) and out.context.shape == (3, 8, 8)
    trees = induce.induced_trees(model, SENTENCES, index)
    for kind in ("masked", "unmasked"):
        for s, heads in zip(SENTENCES, trees[kind]):
            assert len(heads) == s.n and is_tree(heads) and heads.count(0) == 1
    with pytest.raises(ValueError, match="objective"):
        induce.ClozeModel(len(index), objective="children")


@pytest.mark.skipif(not (DATA / "ud").exists(), reason="shared UD data not available")
def test_quick_command_parent_objective_with_hub_penalty(tmp_path):
    rows = induce.main(["--quick", "--max-sentences", "20", "--objective", "parent", "--hub-penalty", "0.1",
                        "--out", str(tmp_path)])
    assert [r["trees"] for r in rows] == ["gold", "masked", "unmasked", "right-branching", "left-branching"]
    assert all(r["objective"] == "parent" and r["hub_penalty"] == 0.1 for r in rows)
    assert all(0 <= r[k] <= 1 for r in rows for k in ("directed_no_punct", "undirected", "undirected_no_punct"))
    assert rows[0]["undirected_no_punct"] == 1.0 and rows[0]["skipped_batches"] == 0
    assert (tmp_path / "en_bilinear_parent_hub0.1_trees.png").stat().st_size > 0


@pytest.mark.parametrize("adjacency", [False, True])
def test_head_mixture_loss_is_the_mixture_of_word_given_head_over_the_marginals(adjacency):
    torch.manual_seed(0)
    index = induce.word_index(SENTENCES, min_count=1)
    model = induce.ClozeModel(len(index), dim=8, hidden=8, objective="head_mixture", adjacency=adjacency)
    words, lengths = induce.encode(SENTENCES, index, bucket=8)
    masked, chosen = induce.mask_words(words, lengths, 0.4, torch.Generator().manual_seed(1))
    loss, out = model.loss(words, masked, lengths, chosen)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with torch.no_grad():
        terms = []
        for b, m in chosen.nonzero().tolist():
            p = 0.0
            for h in range(int(lengths[b]) + 1):
                if h == m + 1:
                    continue
                e = model.attention.root_embedding if h == 0 else model.embed(masked[b, h - 1])
                side = model.predict_right if h > m + 1 else model.predict
                if adjacency and h == m + 2:
                    side = model.predict_next_right
                elif adjacency and h == m and h > 0:
                    side = model.predict_next_left
                p += out.attention[b, h, m + 1] * side(e).softmax(-1)[words[b, m]]
            terms.append(-torch.log(p))
        assert loss.item() == pytest.approx(torch.stack(terms).mean().item(), rel=1e-5)
    trees = induce.induced_trees(model, SENTENCES, index)
    for s, heads in zip(SENTENCES, trees["masked"]):
        assert len(heads) == s.n and is_tree(heads) and heads.count(0) == 1
