"""The biaffine parser experiment: batches, losses, decoders, and the command on a slice of UD."""

import random

import pytest
import torch

from structures import NonProjectiveDependencyCRF
from structures.experiments import default_data_dir, parse
from structures.experiments.attachment import is_projective, is_tree
from structures.experiments.ud import PUD, TREEBANKS, Sentence, read_conllu

DATA = default_data_dir()
needs_data = pytest.mark.skipif(not (DATA / "ud").exists(), reason="shared UD data not available")


def toy(heads, words=None) -> Sentence:
    words = words or [f"w{i}" for i in range(len(heads))]
    return Sentence(None, tuple(words), ("NOUN",) * len(heads), tuple(heads), ("dep",) * len(heads))


TOY = [toy([2, 0, 2]), toy([0, 1, 1, 3, 3, 1, 6, 6, 1]), toy([3, 3, 0, 3, 4])]


def test_batch_pads_to_a_bucket_length_with_the_root_first():
    vocab = parse.Vocab.build(TOY, min_count=1)
    batch = parse.make_batch(TOY, [0, 1, 2], vocab, bucket=8)
    assert batch.words.shape == (3, 17) and batch.chars.shape[:2] == (3, 17)
    assert (batch.words[:, 0] == parse.ROOT).all()
    assert batch.lengths.tolist() == [3, 9, 5]
    assert batch.heads[0].tolist() == [2, 0, 2] + [0] * 13
    assert (batch.words[0, 4:] == parse.PAD).all()


def test_batches_cover_every_sentence_once():
    vocab = parse.Vocab.build(TOY, min_count=1)
    seen = [i for b in parse.batches(TOY, vocab, tokens_per_batch=10, shuffle=random.Random(0)) for i in b.index]
    assert sorted(seen) == [0, 1, 2]


def test_local_loss_is_the_per_word_cross_entropy():
    torch.manual_seed(0)
    scores = torch.randn(1, 4, 4)
    heads = torch.tensor([[2, 0, 2]])
    expected = 0.0
    for m, h in enumerate([2, 0, 2], 1):
        candidates = torch.tensor([scores[0, k, m] for k in range(4) if k != m])
        expected -= float(scores[0, h, m] - candidates.logsumexp(0))
    assert float(parse.arc_loss("local", scores, torch.tensor([3]), heads)) == pytest.approx(expected, rel=1e-5)


def test_crf_losses_are_the_negative_log_probability_of_the_gold_tree():
    torch.manual_seed(0)
    scores = torch.randn(2, 6, 6)
    lengths = torch.tensor([5, 3])
    heads = torch.tensor([[2, 0, 2, 3, 3], [0, 1, 1, 0, 0]])
    nll = -NonProjectiveDependencyCRF(scores, lengths, single_root=True).log_prob(heads).mean()
    assert float(parse.arc_loss("nonprojective", scores, lengths, heads)) == pytest.approx(float(nll), rel=1e-5)
    assert float(parse.arc_loss("projective", scores, lengths, heads)) <= float(nll) + 1e-4  # fewer trees: smaller Z
    with pytest.raises(ValueError, match="kind"):
        parse.arc_loss("hinge", scores, lengths, heads)


def test_decoders_give_trees_of_their_kind():
    torch.manual_seed(1)
    scores = torch.randn(8, 11, 11) * 3
    lengths = torch.tensor([10, 9, 8, 7, 6, 5, 4, 3])
    for decoder in ("eisner", "mst"):
        heads = parse.decode(decoder, scores, lengths)
        for b, n in enumerate(lengths.tolist()):
            tree = heads[b, :n].tolist()
            assert is_tree(tree) and sum(h == 0 for h in tree) == 1
            assert decoder == "mst" or is_projective(tree)
            assert (heads[b, n:] == 0).all()
    argmax = parse.decode("argmax", scores, lengths)
    assert (argmax[1, :9] == parse.local_log_probs(scores, lengths)[1, :10, 1:10].argmax(0)).all()


def test_the_parser_fits_a_few_sentences():
    torch.manual_seed(0)
    vocab = parse.Vocab.build(TOY, min_count=1)
    model = parse.BiaffineParser(vocab, word_dim=32, char_dim=16, hidden=32, arc_dim=32, label_dim=16, dropout=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(30):
        parse.train_epoch(model, TOY, vocab, "nonprojective", optimizer, random.Random(0))
    results, _ = parse.evaluate(model, TOY, vocab, ["mst"])
    assert results["mst"].attachment.uas == 1.0


@needs_data
@pytest.mark.parametrize("treebank, loss, pud", [("lassysmall", "nonprojective", None), ("ewt", "projective", "en"), ("lassysmall", "local", None)])
def test_quick_command_writes_scores_trees_and_pictures(tmp_path, treebank, loss, pud):
    extra = ["--pud", pud] if pud else []
    rows = parse.main(["--treebank", treebank, "--loss", loss, "--quick", "--max-sentences", "30", "--out", str(tmp_path), *extra])
    evaluated = [treebank] + ([f"pud-{pud}"] if pud else [])
    assert [(r["eval_file"], r["decoder"]) for r in rows] == [(e, d) for e in evaluated for d in parse.DECODERS[loss]]
    for r in rows:
        assert 0.0 <= r["uas"] <= 1.0 and r["valid"] == (1.0 if r["decoder"] != "argmax" else r["valid"])
        assert 0.0 < r["decode_share"] <= r["decode_share_cold"] < 1.0 and r["score_s"] > 0.0 and r["first_use_s"] > 0.0
    name = f"{treebank}_{loss}"
    for suffix in (".md", ".csv", "_trees.png", "_marginals.png", f"_{rows[0]['decoder']}.conllu"):
        assert (tmp_path / f"{name}{suffix}").stat().st_size > 0
    saved = torch.load(tmp_path / f"{name}.pt", weights_only=False)  # loads outside the command's __main__
    parse.BiaffineParser(parse.Vocab(**saved["vocab"])).load_state_dict(saved["state"])
    predicted = read_conllu(tmp_path / f"{name}_{rows[-1]['decoder']}.conllu")  # a tree decoder
    gold = read_conllu(DATA / "ud" / TREEBANKS[treebank][1], max_sentences=30)
    assert [s.words for s in predicted] == [s.words for s in gold]
    assert all(is_tree(s.heads) for s in predicted)
    if pud:
        on_pud = read_conllu(tmp_path / f"{name}_pud-{pud}_{rows[-1]['decoder']}.conllu")
        assert [s.words for s in on_pud] == [s.words for s in read_conllu(DATA / "ud" / PUD[pud], max_sentences=30)]
