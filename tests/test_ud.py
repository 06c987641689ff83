"""Reading and writing CoNLL-U (multiword tokens and empty nodes kept out of the tree and written
back), and attachment scores / tree shapes against hand-checked cases."""

from pathlib import Path

import pytest

from structures.experiments import default_data_dir
from structures.experiments.attachment import Attachment, TreeShapes, is_projective, is_tree
from structures.experiments.ud import TREEBANKS, read_conllu, with_tree, write_conllu

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


def test_predicted_heads_replace_only_word_heads(sample, tmp_path):
    s = read_conllu(sample)
    out = tmp_path / "pred.conllu"
    write_conllu(out, s, [[2, 0, 2, 2, 2], [0]], [["a", "root", "b", "c", "d"], ["root"]])
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[2].split("\t")[6:8] == ["2", "a"]
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


def test_tree_shapes():
    assert is_tree([2, 0, 2]) and not is_tree([2, 1, 0]) and not is_tree([1, 0]) and not is_tree([0, 5])
    assert is_projective([2, 0, 2]) and not is_projective([3, 4, 0, 3])  # 1<-3 crosses 2<-4
    shapes = TreeShapes()
    for heads in ([2, 0, 2], [0, 0], [3, 4, 0, 3], [2, 1]):
        shapes.add(heads)
    assert shapes.fractions() == {"valid": 0.75, "single_root": 0.5, "projective": 0.5, "non_projective": 0.25}
