"""Reading and writing CoNLL-U (multiword tokens and empty nodes kept out of the tree and written
back), reading raw tokenized text, and attachment scores (CoNLL 2018) / tree shapes against
hand-checked cases."""

from pathlib import Path

import pytest

from structures.experiments import default_data_dir
from structures.experiments.attachment import Attachment, TreeShapes, is_projective, is_tree
from structures.experiments.ud import (TREEBANKS, looks_like_conllu, read_conllu, read_sentences, read_tokenized,
                                       with_tree, write_conllu)

# A multiword token (2-3), an empty node (4.1) with enhanced deps, comments.
SAMPLE = """# sent_id = s1
# text = I don't know
1\tI\tI\tPRON\tPRP\t_\t4\tnsubj\t4:nsubj\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\tdo\tAUX\tVBP\t_\t4\taux\t4:aux\t_
3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t4:advmod\t_
4\tknow\tknow\tVERB\tVB\t_\t0\troot\t0:root\t_
4.1\tknow\tknow\tVERB\tVB\t_\t_\t_\t4:conj\tCopyOf=4
5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t4:punct\t_

# sent_id = s2
# text = Yes
1\tYes\tyes\tINTJ\tUH\t_\t0\troot\t0:root\t_

"""


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    path = tmp_path / "sample.conllu"
    path.write_text(SAMPLE, encoding="utf-8")
    return path


def test_words_exclude_multiword_tokens_and_empty_nodes(sample):
    first, second = read_conllu(sample)
    assert first.words == ("I", "do", "n't", "know", ".")
    assert first.heads == (4, 4, 4, 0, 4)
    assert first.upos[-1] == "PUNCT" and first.deprels[0] == "nsubj"
    assert first.sent_id == "s1" and second.n == 1


def test_round_trip_is_byte_identical(sample, tmp_path):
    out = tmp_path / "out.conllu"
    write_conllu(out, read_conllu(sample))
    assert out.read_text(encoding="utf-8") == SAMPLE
    s = read_conllu(sample)
    write_conllu(out, s, [x.heads for x in s], [x.deprels for x in s])
    assert out.read_text(encoding="utf-8") == SAMPLE


def test_predicted_heads_replace_only_word_heads_and_their_deps(sample, tmp_path):
    s = read_conllu(sample)
    out = tmp_path / "pred.conllu"
    write_conllu(out, s, [[2, 0, 2, 2, 2], [0]], [["a", "root", "b", "c", "d"], ["root"]])
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[2].split("\t")[6:9] == ["2", "a", "2:a"]  # deps: the predicted arc, not the gold one
    assert lines[4].split("\t")[6:9] == ["0", "root", "0:root"]
    assert lines[3] == SAMPLE.splitlines()[3]  # the multiword token
    assert lines[7] == SAMPLE.splitlines()[7]  # the empty node, its enhanced deps unchanged
    assert read_conllu(out)[0].heads == (2, 0, 2, 2, 2)
    assert read_conllu(sample)[0].heads == (4, 4, 4, 0, 4)  # the input sentence is not modified


def test_wrong_number_of_heads_is_an_error(sample):
    with pytest.raises(ValueError, match="heads"):
        with_tree(read_conllu(sample)[0], [0, 1])


def test_shared_files_round_trip():
    data = default_data_dir() / "ud"
    if not data.exists():
        pytest.skip("shared UD data not available")
    path = data / TREEBANKS["ewt"][0]
    sentences = read_conllu(path, max_sentences=60)  # sentence 58 has an empty node, 6 and 7 multiword tokens
    text = "".join(s.tokens.serialize() for s in sentences)
    assert text == "".join(path.read_text(encoding="utf-8").split("\n\n")[i] + "\n\n" for i in range(60))
    assert all(is_tree(s.heads) for s in sentences)


def test_attachment_hand_checked():
    a = Attachment()
    # gold: 1 <- 2 -> 3, 2 the root; predicted: word 3 attached to word 1 (wrong), labels differ on word 1
    a.add(gold_heads=[2, 0, 2], heads=[2, 0, 1], upos=["NOUN", "VERB", "PUNCT"],
          gold_labels=["nsubj", "root", "punct"], labels=["obj", "root", "punct"])
    assert a.uas == pytest.approx(2 / 3)
    assert a.las == pytest.approx(1 / 3)
    assert a.uas_no_punct == 1.0 and a.las_no_punct == pytest.approx(1 / 2)
    assert a.undirected_accuracy == pytest.approx(2 / 3)
    b = Attachment()
    b.add([2, 0], [0, 1], ["NOUN", "VERB"])  # the arc 1-2 reversed: undirected right, directed wrong
    assert b.uas == 0.0 and b.undirected_accuracy == 0.5


def test_conll2018_scores_count_syntactic_words_and_universal_labels(sample, tmp_path):
    gold = read_conllu(sample)
    gold_labels = [["nsubj", "aux:pass", "advmod", "root", "punct"], ["root"]]
    gold_file, predicted_file = tmp_path / "gold.conllu", tmp_path / "predicted.conllu"
    write_conllu(gold_file, gold, [s.heads for s in gold], gold_labels)
    # word 3 attached to word 2 (wrong head), word 5 labelled obj (wrong label); the subtypes differ on words 1, 2
    write_conllu(predicted_file, gold, [[4, 4, 2, 0, 4], [0]], [["nsubj:outer", "aux", "advmod", "root", "obj"], ["root"]])
    a = Attachment()
    for g, p in zip(read_conllu(gold_file), read_conllu(predicted_file)):
        a.add(g.heads, p.heads, g.upos, g.deprels, p.deprels)
    assert a.words == 6  # the multiword token 2-3 and the empty node 4.1 are not words
    assert a.uas == pytest.approx(5 / 6) and a.las == pytest.approx(4 / 6)
    assert a.uas_no_punct == pytest.approx(4 / 5) and a.las_no_punct == pytest.approx(4 / 5)  # "." is PUNCT


def test_raw_tokenized_text_reads_as_sentences_without_trees(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_text("I do n't know .\n\n  Yes  \n# not a comment\n", encoding="utf-8")
    sentences = read_tokenized(raw)
    assert [s.words for s in sentences] == [("I", "do", "n't", "know", "."), ("Yes",), ("#", "not", "a", "comment")]
    assert [s.sent_id for s in sentences] == ["1", "3", "4"] and sentences[0].heads == (0,) * 5
    assert not looks_like_conllu(raw) and read_sentences(raw) == sentences
    out = tmp_path / "out.conllu"
    write_conllu(out, sentences, [[4, 4, 4, 0, 4], [0], [0, 1, 1, 1]], [["a"] * 5, ["root"], ["b"] * 4])
    assert looks_like_conllu(out)
    parsed = read_sentences(out)
    assert [s.words for s in parsed] == [s.words for s in sentences] and parsed[0].heads == (4, 4, 4, 0, 4)
    assert parsed[0].tokens.metadata["text"] == "I do n't know ."


def test_tree_shapes():
    assert is_tree([2, 0, 2]) and not is_tree([2, 1, 0]) and not is_tree([1, 0]) and not is_tree([0, 5])
    assert is_projective([2, 0, 2]) and not is_projective([3, 4, 0, 3])  # 1<-3 crosses 2<-4
    shapes = TreeShapes()
    for heads in ([2, 0, 2], [0, 0], [3, 4, 0, 3], [2, 1]):
        shapes.add(heads)
    assert shapes.fractions() == {"valid": 0.75, "single_root": 0.5, "projective": 0.5, "non_projective": 0.25}
