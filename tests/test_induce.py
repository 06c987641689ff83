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
