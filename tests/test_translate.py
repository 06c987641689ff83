"""Trees induced for translation (Bisk & Tran 2018): the decoder's targets, FA-NMT's flat
attention, the shared attention's gradient reaching the tree layer, the extracted trees, and the
command on a slice of the parallel PUD files."""

import pytest
import torch

from structures.experiments import default_data_dir, translate
from structures.experiments.attachment import is_tree
from structures.experiments.dmv import DMV
from structures.experiments.induce import without_punctuation
from structures.experiments.ud import Sentence
from structures.experiments.vocabulary import PAD, encode, word_index

DATA = default_data_dir()


def toy(words) -> Sentence:
    return Sentence(None, tuple(words), ("NOUN",) * len(words), tuple(range(len(words))), ("dep",) * len(words))


SOURCES = [toy("the cat sat".split()), toy("a dog saw the cat today".split()), toy("hello".split())]
TARGETS = [toy("die katze sass".split()), toy("ein hund sah heute die katze".split()), toy("hallo".split())]


def test_decoder_reads_start_then_words_and_predicts_words_then_end():
    index = translate.target_index(TARGETS)
    inputs, outputs = translate.decoder_ids(TARGETS, index)
    assert inputs.shape == outputs.shape == (3, 7)
    words = [index[w] for w in TARGETS[0].words]
    assert inputs[0].tolist() == [index["<s>"], *words, PAD, PAD, PAD]
    assert outputs[0].tolist() == [*words, index["</s>"], PAD, PAD, PAD]
    assert outputs[2].tolist() == [index["hallo"], index["</s>"], *[PAD] * 5]


def test_flat_attention_is_a_softmax_over_the_root_and_the_other_real_words():
    theta = torch.randn(2, 5, 5)
    lengths = torch.tensor([4, 2])
    beta = translate.flat_marginals(theta, lengths)
    assert torch.allclose(beta[0, :, 1:].sum(0), torch.ones(4))
    assert torch.allclose(beta[1, :, 1:3].sum(0), torch.ones(2))
    assert (beta[1, :, 3:] == 0).all() and (beta[1, 3:] == 0).all()  # padded words: neither head nor dependent
    assert (beta[:, :, 0] == 0).all() and (beta.diagonal(dim1=1, dim2=2) == 0).all()
    expected = torch.softmax(theta[1, [0, 2], 1], 0)  # word 1 of a 2-word sentence: the root or word 2
    assert torch.allclose(beta[1, [0, 2], 1], expected)


@pytest.mark.parametrize("attention, hard, head_input", [("structured", False, "states"), ("structured", True, "states"),
                                                         ("flat", False, "states"), ("structured", False, "embeddings")])
def test_the_translation_loss_trains_the_tree_scores(attention, hard, head_input):
    torch.manual_seed(0)
    source_index, index = word_index(SOURCES, min_count=1), translate.target_index(TARGETS)
    model = translate.Translator(len(source_index), len(index), dim=8, attention=attention, hard=hard, dropout=0.0,
                                   head_input=head_input)
    source, lengths = encode(SOURCES, source_index, bucket=1)
    inputs, outputs = translate.decoder_ids(TARGETS, index)
    loss, trees = model(source, lengths, inputs, outputs)
    assert torch.isfinite(loss) and loss > 0
    assert (trees is None) == (attention == "flat")
    loss.backward()
    assert model.heads.query.weight.grad.abs().sum() > 0  # through the shared attention's syntactic vectors
    batch = translate.Translator(len(source_index), len(index), dim=8, attention=attention, hard=hard, dropout=0.0,
                                   head_input=head_input)
    batch.load_state_dict(model.state_dict())
    alone = sum(batch(*encode([s], source_index, bucket=1), *translate.decoder_ids([t], index))[0]
                for s, t in zip(SOURCES, TARGETS))
    assert torch.allclose(loss, alone, atol=1e-4)  # padding changes nothing


def test_induced_trees_are_single_rooted_trees_over_the_source_words():
    torch.manual_seed(0)
    source_index = word_index(SOURCES, min_count=1)
    model = translate.Translator(len(source_index), 5, dim=8)
    for s, heads in zip(SOURCES, translate.induced_trees(model, SOURCES, source_index)):
        assert len(heads) == s.n and is_tree(heads) and heads.count(0) == 1


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="attention"):
        translate.Translator(5, 5, attention="soft")
    with pytest.raises(ValueError, match="head_input"):
        translate.Translator(5, 5, head_input="tags")


@pytest.mark.skipif(not (DATA / "ud").exists(), reason="shared UD data not available")
def test_command_scores_the_source_trees_beside_the_chains(tmp_path):
    rows = translate.main(["--quick", "--out", str(tmp_path)])
    kinds = {r["trees"]: r for r in rows}
    assert set(kinds) == {"gold", "induced", "left-branching", "right-branching"}
    assert kinds["gold"]["DA_p"] == 100.0 and kinds["gold"]["pairs"] == 40
    assert kinds["left-branching"]["DA_p"] > kinds["right-branching"]["DA_p"]
    assert 0 <= kinds["induced"]["UA_p"] <= 100
    assert {p.name for p in tmp_path.iterdir()} >= {"en_de_structured_seed0.csv", "en_de_structured_seed0_curve.png",
                                                     "en_de_structured_seed0_trees.png"}


def test_the_dmv_teacher_covers_every_word_and_puts_punctuation_where_induce_does():
    torch.manual_seed(0)
    sentence = Sentence(None, ("dogs", ",", "cats", "run", "."), ("NOUN", "PUNCT", "NOUN", "VERB", "PUNCT"), (4, 3, 1, 0, 4),
                        ("dep",) * 5)
    tag_index = word_index([sentence], min_count=1, field="upos")
    teacher = DMV(len(tag_index))
    full = translate.teacher_marginals(teacher, [sentence], tag_index)[0]
    assert full.shape == (6, 6) and torch.allclose(full[:, 1:].sum(0), torch.ones(5))
    assert full[1, 2] == 1 and full[4, 5] == 1  # each mark on the word before it
    bare = without_punctuation(sentence)
    mu = teacher.crf(*encode([bare], tag_index, field="upos", bucket=1))[0].marginals[0]
    keep = [0, 1, 3, 4]
    assert torch.allclose(full[keep][:, keep], mu)


def test_the_tree_cross_entropy_is_stationary_at_the_layers_own_marginals():
    torch.manual_seed(0)
    source_index = word_index(SOURCES, min_count=1)
    model = translate.Translator(len(source_index), 5, dim=8, dropout=0.0)
    source, lengths = encode(SOURCES, source_index, bucket=1)
    trees = lambda: model.heads.structure(model.tree_scores(source, lengths), lengths, True)  # noqa: E731
    own = trees().marginals.detach()
    translate.tree_cross_entropy(trees(), own).backward()
    assert model.heads.query.weight.grad.abs().max() < 1e-5
    model.zero_grad()
    translate.tree_cross_entropy(trees(), torch.roll(own, 1, -1)).backward()
    assert model.heads.query.weight.grad.abs().max() > 1e-3
