"""Induced trees: the cloze masking, the per-word masked extraction, the baselines, tree statistics,
and the command on a slice of UD."""

import pytest
import torch

from brute import dependency_trees
from structures.experiments import default_data_dir, induce
from structures.experiments.significance import compare_parses
from structures.experiments.attachment import TreeStatistics, chain_trees, depths, is_tree, score_trees
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
        scores = model.masked_arc_scores(words, lengths)
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
    trees = chain_trees(SENTENCES[:1])
    assert trees == {"right-branching": [[0, 1, 2]], "left-branching": [[2, 3, 0]]}
    left = score_trees(SENTENCES[:1], trees["left-branching"])
    right = score_trees(SENTENCES[:1], trees["right-branching"])
    assert left["directed"] == 1.0 and right["directed"] == 0.0
    assert right["undirected"] == pytest.approx(2 / 3)  # 1-2 and 2-3 are gold arcs reversed
    assert left["mean_height"] == 3 and left["adjacent_arcs"] == 1.0
    assert right["same_upos_no_punct"] == pytest.approx(2 / 3)  # every word a NOUN: all but the root's child


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


def test_the_held_out_protocol_keeps_pud_out_of_the_training_text():
    dev_files, dev_eval = induce.HELD_OUT["dev"]
    test_files, test_eval = induce.HELD_OUT["test"]
    assert dev_files == test_files and dev_eval in dev_files  # one training text; settings chosen on EWT dev
    assert test_eval not in test_files  # the scored PUD sentences are never trained on
    assert test_eval in induce.LANGUAGES["en"][0]  # unlike the transductive runs


@pytest.mark.skipif(not (DATA / "ud").exists(), reason="shared UD data not available")
def test_held_out_runs_score_ewt_dev_or_pud_and_sentences_of_ten_words_apart(tmp_path):
    common = ["--quick", "--max-sentences", "20", "--objective", "dmv", "--values", "upos", "--out", str(tmp_path)]
    dev = {r["trees"]: r for r in induce.main(common + ["--evaluate", "dev"])}
    test = {r["trees"]: r for r in induce.main(common + ["--evaluate", "test"])}
    assert dev["dmv"]["train_sentences"] == test["dmv"]["train_sentences"] <= 40  # two files, PUD not among them
    assert dev["gold"]["directed_no_punct_short"] == test["gold"]["directed_no_punct_short"] == 1.0
    assert 0 < dev["dmv"]["short_sentences"] < 20 and dev["dmv"]["evaluate"] == "dev"
    assert (tmp_path / "en_bilinear_dev_dmv_upos.csv").exists() and (tmp_path / "en_bilinear_test_dmv_upos.csv").exists()
    gold = tmp_path / "en_bilinear_test_dmv_upos_gold.conllu"  # each kind's trees as CoNLL-U, for paired bootstraps
    uas_dmv, uas_left, _ = compare_parses(gold, tmp_path / "en_bilinear_test_dmv_upos_dmv.conllu",
                                          tmp_path / "en_bilinear_test_dmv_upos_left-branching.conllu", no_punct=True, samples=10)
    assert uas_dmv == pytest.approx(test["dmv"]["directed_no_punct"]) and uas_left == pytest.approx(test["left-branching"]["directed_no_punct"])
    with pytest.raises(SystemExit):
        induce.main(["--quick", "--language", "de", "--evaluate", "test", "--out", str(tmp_path)])


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
                p += out.marginals[b, h, m + 1] * side(e).softmax(-1)[words[b, m]]
            terms.append(-torch.log(p))
        assert loss.item() == pytest.approx(torch.stack(terms).mean().item(), rel=1e-5)
    trees = induce.induced_trees(model, SENTENCES, index)
    for s, heads in zip(SENTENCES, trees["masked"]):
        assert len(heads) == s.n and is_tree(heads) and heads.count(0) == 1


def tagged(words, tags, heads) -> Sentence:
    return Sentence(None, tuple(words), tuple(tags), tuple(heads), ("dep",) * len(words))


TAGGED = [tagged("the cat sat".split(), ["DET", "NOUN", "VERB"], [2, 3, 0]),
          tagged("a dog saw the cat".split(), ["DET", "NOUN", "VERB", "DET", "NOUN"], [2, 3, 0, 5, 3])]


def brute_autoencoder_loss(theta, given, lengths, chosen) -> torch.Tensor:
    """``-sum_b log sum_t p(t) prod_{m chosen} P(x_m | x_{t(m)}) / #chosen``, single-root trees
    enumerated; ``given [B, N+1, N]`` the log word-given-head probabilities."""
    total = 0.0
    for b in range(theta.shape[0]):
        n = int(lengths[b])
        scores, joint = [], []
        for arcs in dependency_trees(n):
            if sum(h == 0 for h, _ in arcs) != 1:
                continue
            score = sum(theta[b, h, d] for h, d in arcs)
            scores.append(score)
            joint.append(score + sum(given[b, h, d - 1] for h, d in arcs if chosen[b, d - 1]))
        total = total - (torch.stack(joint).logsumexp(0) - torch.stack(scores).logsumexp(0))
    return total / chosen.sum()


@pytest.mark.parametrize("tags", [False, True])
@pytest.mark.parametrize("each", [False, True])
def test_tree_autoencoder_loss_is_the_expected_reconstruction_over_every_tree(tags, each):
    """``log Z(theta + R) - log Z(theta)`` is ``log E_{t ~ p(t | x)} prod_m P(x_m | x_head(m))``
    (Cai et al. 2017), checked by enumerating the single-root trees; ``each``: the arc scores of
    word m come from the sentence with word m (and its tag) masked."""
    torch.manual_seed(0)
    index = induce.word_index(TAGGED, min_count=1)
    tag_index = induce.word_index(TAGGED, min_count=1, field="upos") if tags else None
    model = induce.ClozeModel(len(index), dim=8, hidden=8, objective="tree_autoencoder", adjacency=True,
                              tags=len(tag_index) if tags else 0).double()
    words, lengths = induce.encode(TAGGED, index, bucket=8)
    tag_ids = induce.encode(TAGGED, tag_index, bucket=8, field="upos")[0] if tags else None
    if each:
        masked, chosen = words, (words > induce.MASK) & (torch.arange(8) < lengths.unsqueeze(-1))
    else:
        masked, chosen = induce.mask_words(words, lengths, 0.5, torch.Generator().manual_seed(1))
    loss, prior = model.loss(words, masked, lengths, chosen, tag_ids, each=each)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with torch.no_grad():
        masked_tags = None if tag_ids is None else tag_ids.masked_fill(masked == induce.MASK, induce.MASK)
        if each:
            theta = model.masked_arc_scores(words, lengths, tag_ids)
        else:
            theta = model(masked, lengths, masked_tags)[1].distribution.log_potentials
        assert torch.allclose(prior.log_potentials, theta)
        heads = model.embed(masked) if not tags else model.embed_tags(masked_tags)
        heads = torch.cat([model.attention.root_embedding.expand(2, 1, -1), heads], 1)
        given = model.given_head(heads, tag_ids if tags else words)
        expected = brute_autoencoder_loss(theta, given, lengths, chosen)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-9)


def test_given_head_picks_the_side_and_adjacency_outputs_and_predicts_tags():
    torch.manual_seed(0)
    index = induce.word_index(TAGGED, min_count=1)
    tag_index = induce.word_index(TAGGED, min_count=1, field="upos")
    assert set(tag_index) == {"<pad>", "<unk>", "<mask>", "det", "noun", "verb"}
    model = induce.ClozeModel(len(index), dim=8, hidden=8, objective="tree_autoencoder", adjacency=True, tags=len(tag_index))
    tags = induce.encode(TAGGED, tag_index, bucket=8, field="upos")[0]
    heads = torch.randn(2, 9, 8)
    given = model.given_head(heads, tags)
    assert given.shape == (2, 9, 8)
    outputs = {"left": model.predict, "right": model.predict_right, "next_left": model.predict_next_left,
               "next_right": model.predict_next_right}
    for m in range(1, 4):
        for h in range(9):
            if h == m:
                continue
            name = "next_left" if h == m - 1 and h > 0 else "next_right" if h == m + 1 else "left" if h < m else "right"
            expected = outputs[name](heads[1, h]).log_softmax(-1)[tags[1, m - 1]]
            assert given[1, h, m - 1].item() == pytest.approx(expected.item(), rel=1e-5)
    with pytest.raises(ValueError, match="tags"):
        induce.ClozeModel(len(index), tags=5, objective="parent")


@pytest.mark.skipif(not (DATA / "ud").exists(), reason="shared UD data not available")
def test_quick_command_tree_autoencoder_on_tags_each_word_masked_without_punctuation(tmp_path):
    rows = induce.main(["--quick", "--max-sentences", "20", "--objective", "tree_autoencoder", "--values", "upos",
                        "--targets", "each", "--encoder", "bilstm_distance", "--drop-punct", "--out", str(tmp_path)])
    assert [r["trees"] for r in rows] == ["gold", "masked", "unmasked", "posterior", "right-branching", "left-branching"]
    assert all(r["values"] == "upos" and r["targets"] == "each" for r in rows)
    assert rows[0]["directed"] == 1.0  # scored on the sentences with their punctuation
    assert (tmp_path / "en_bilinear_tree_autoencoder_each_upos_bilstm_distance_nopunct.csv").stat().st_size > 0


def test_the_distance_encoder_is_a_generative_model_whose_posterior_reads_every_word():
    """``encoder="distance"``: the arc scores see only ``h - m``, so the loss is the negative
    log-likelihood ``-log sum_t p(t) prod_m P(t_m | t_head(m))`` of a generative model; its
    posterior adds every word's ``log P(t_m | t_h)`` to the scores."""
    torch.manual_seed(0)
    index = induce.word_index(TAGGED, min_count=1)
    tag_index = induce.word_index(TAGGED, min_count=1, field="upos")
    model = induce.ClozeModel(len(index), dim=8, hidden=8, objective="tree_autoencoder", tags=len(tag_index),
                              encoder="distance").double()
    with torch.no_grad():
        model.distance.copy_(torch.randn(2 * induce.DISTANCE + 1))
    words, lengths = induce.encode(TAGGED, index, bucket=8)
    tags = induce.encode(TAGGED, tag_index, bucket=8, field="upos")[0]
    theta = model.tree_scores(words, lengths, tags)
    for h, m in [(1, 3), (3, 1), (2, 3), (0, 2)]:
        assert theta[1, h, m].item() == (0.0 if h == 0 else model.distance[h - m + induce.DISTANCE].item())
    assert torch.equal(theta[0], theta[1]) and torch.equal(theta, model.tree_scores(words.flip(1), lengths, tags))
    chosen = (tags > induce.MASK) & (torch.arange(8) < lengths.unsqueeze(-1))
    loss, _ = model.loss(words, words, lengths, chosen, tags)
    with torch.no_grad():
        given = model.given_head(model.head_values(words, tags), tags)
        assert loss.item() == pytest.approx(brute_autoencoder_loss(theta, given, lengths, chosen).item(), rel=1e-9)
        posterior = model.posterior(words, lengths, tags)
        gain = torch.nn.functional.pad(given * chosen.unsqueeze(1), (1, 0))
        assert torch.allclose(posterior.log_potentials, theta + gain)
    trees = induce.induced_trees(model, TAGGED, index, tag_index=tag_index)
    assert set(trees) == {"masked", "unmasked", "posterior"}
    for s, heads in zip(TAGGED, trees["posterior"]):
        assert len(heads) == s.n and is_tree(heads) and heads.count(0) == 1
    with pytest.raises(ValueError, match="encoder"):
        induce.ClozeModel(len(index), objective="head_mixture", encoder="distance")


def test_punctuation_is_dropped_for_the_model_and_attached_to_the_word_before_it_after():
    s = tagged(["Yes", ",", "the", "cat", "sat", "."], ["INTJ", "PUNCT", "DET", "NOUN", "VERB", "PUNCT"], [5, 1, 4, 5, 0, 2])
    bare = induce.without_punctuation(s)
    assert bare.words == ("Yes", "the", "cat", "sat") and bare.upos == ("INTJ", "DET", "NOUN", "VERB")
    assert bare.heads == (4, 3, 4, 0)  # "." headed by "," climbs to "Yes" (not kept as a head of anything here)
    assert induce.with_punctuation(s, [4, 3, 4, 0]) == [5, 1, 4, 5, 0, 5]
    leading = tagged(['"', "Go", "!"], ["PUNCT", "VERB", "PUNCT"], [2, 0, 2])
    assert induce.with_punctuation(leading, [0]) == [2, 0, 2]


def test_the_bilstm_distance_encoder_adds_the_distance_scores_to_the_bilinear_ones():
    torch.manual_seed(0)
    index = induce.word_index(TAGGED, min_count=1)
    plain = induce.ClozeModel(len(index), dim=8, hidden=8, objective="tree_autoencoder")
    model = induce.ClozeModel(len(index), dim=8, hidden=8, objective="tree_autoencoder", encoder="bilstm_distance")
    model.load_state_dict(plain.state_dict() | {"distance": torch.randn(2 * induce.DISTANCE + 1)})
    words, lengths = induce.encode(TAGGED, index, bucket=8)
    with torch.no_grad():
        for masked in (True, False):
            assert torch.allclose(model.tree_scores(words, lengths, masked=masked),
                                  plain.tree_scores(words, lengths, masked=masked) + model.distance_scores(lengths, 8))


def _conllu(sentences: list[list[tuple[str, str, int]]]) -> str:
    """CoNLL-U text of sentences given as (form, UPOS, head) per word."""
    blocks = []
    for k, words in enumerate(sentences):
        lines = [f"# sent_id = s{k}"] + [f"{i}\t{form}\t{form}\t{pos}\t_\t_\t{head}\tdep\t_\t_"
                                         for i, (form, pos, head) in enumerate(words, 1)]
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks) + "\n"


def test_dropping_punctuation_reads_a_sentence_of_punctuation_only_whole(tmp_path):
    """EWT dev has a sentence that is all punctuation: with --drop-punct it is read as it is (there
    is nothing else to read) and gets a tree, and the other sentences lose their punctuation."""
    text = _conllu([[("dogs", "NOUN", 2), ("bark", "VERB", 0), (".", "PUNCT", 2)],
                    [("-", "PUNCT", 0), ("-", "PUNCT", 1)],
                    [("cats", "NOUN", 2), ("sleep", "VERB", 0), ("!", "PUNCT", 2)]])
    for path in (*induce.HELD_OUT["test"][0], induce.HELD_OUT["test"][1]):
        (tmp_path / "ud" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "ud" / path).write_text(text)
    rows = induce.main(["--objective", "dmv", "--values", "upos", "--drop-punct", "--evaluate", "dev", "--epochs", "1",
                        "--data-dir", str(tmp_path), "--out", str(tmp_path / "out")])
    dmv = {r["trees"]: r for r in rows}["dmv"]
    assert dmv["eval_sentences"] == 3 and dmv["train_sentences"] == 4  # two files, the punctuation-only sentence not trained on
    assert 0 <= dmv["directed_no_punct"] <= 1
