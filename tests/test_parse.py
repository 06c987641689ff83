"""The biaffine parser experiment: batches, losses, decoders, the dev split and early stopping,
checkpoints, and the train / evaluate / predict commands (on toy files, and on a slice of UD)."""

import random

import pytest
import torch

from structures import NonProjectiveDependencyCRF
from structures.experiments import biaffine, default_data_dir, parse
from structures.experiments.attachment import is_projective, is_tree
from structures.experiments.ud import PUD, TREEBANKS, Sentence, read_conllu

DATA = default_data_dir()
needs_data = pytest.mark.skipif(not (DATA / "ud").exists(), reason="shared UD data not available")


def toy(heads, words=None, labels=None) -> Sentence:
    words = words or [f"w{i}" for i in range(len(heads))]
    return Sentence(None, tuple(words), ("NOUN",) * len(heads), tuple(heads), tuple(labels or ("dep",) * len(heads)))


TOY = [toy([2, 0, 2]), toy([0, 1, 1, 3, 3, 1, 6, 6, 1]), toy([3, 3, 0, 3, 4])]


def test_batch_pads_to_a_bucket_length_with_the_root_first():
    vocab = biaffine.Vocab.build(TOY, min_count=1)
    batch = biaffine.make_batch(TOY, [0, 1, 2], vocab, bucket=8)
    assert batch.words.shape == (3, 17) and batch.chars.shape[:2] == (3, 17)
    assert (batch.words[:, 0] == biaffine.ROOT).all()
    assert batch.lengths.tolist() == [3, 9, 5]
    assert batch.heads[0].tolist() == [2, 0, 2] + [0] * 13
    assert (batch.words[0, 4:] == biaffine.PAD).all()


def test_batches_cover_every_sentence_once():
    vocab = biaffine.Vocab.build(TOY, min_count=1)
    seen = [i for b in biaffine.batches(TOY, vocab, tokens_per_batch=10, shuffle=random.Random(0)) for i in b.index]
    assert sorted(seen) == [0, 1, 2]


def test_local_loss_is_the_per_word_cross_entropy():
    torch.manual_seed(0)
    scores = torch.randn(1, 4, 4)
    heads = torch.tensor([[2, 0, 2]])
    expected = 0.0
    for m, h in enumerate([2, 0, 2], 1):
        candidates = torch.tensor([scores[0, k, m] for k in range(4) if k != m])
        expected -= float(scores[0, h, m] - candidates.logsumexp(0))
    assert float(biaffine.arc_loss("local", scores, torch.tensor([3]), heads)) == pytest.approx(expected, rel=1e-5)


def test_crf_losses_are_the_negative_log_probability_of_the_gold_tree():
    torch.manual_seed(0)
    scores = torch.randn(2, 6, 6)
    lengths = torch.tensor([5, 3])
    heads = torch.tensor([[2, 0, 2, 3, 3], [0, 1, 1, 0, 0]])
    nll = -NonProjectiveDependencyCRF(scores, lengths, single_root=True).log_prob(heads).mean()
    assert float(biaffine.arc_loss("nonprojective", scores, lengths, heads)) == pytest.approx(float(nll), rel=1e-5)
    assert float(biaffine.arc_loss("projective", scores, lengths, heads)) <= float(nll) + 1e-4  # fewer trees: smaller Z
    with pytest.raises(ValueError, match="kind"):
        biaffine.arc_loss("hinge", scores, lengths, heads)


def test_decoders_give_trees_of_their_kind():
    torch.manual_seed(1)
    scores = torch.randn(8, 11, 11) * 3
    lengths = torch.tensor([10, 9, 8, 7, 6, 5, 4, 3])
    for decoder in ("eisner", "mst"):
        heads = biaffine.decode(decoder, scores, lengths)
        for b, n in enumerate(lengths.tolist()):
            tree = heads[b, :n].tolist()
            assert is_tree(tree) and sum(h == 0 for h in tree) == 1
            assert decoder == "mst" or is_projective(tree)
            assert (heads[b, n:] == 0).all()
    argmax = biaffine.decode("argmax", scores, lengths)
    assert (argmax[1, :9] == biaffine.local_log_probs(scores, lengths)[1, :10, 1:10].argmax(0)).all()


def test_the_parser_fits_a_few_sentences():
    torch.manual_seed(0)
    vocab = biaffine.Vocab.build(TOY, min_count=1)
    model = biaffine.parser_for(vocab, word_dim=32, char_dim=16, hidden=32, arc_dim=32, label_dim=16, dropout=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(30):
        parse.train_epoch(model, TOY, vocab, "nonprojective", optimizer, random.Random(0))
    results, _ = parse.evaluate(model, TOY, vocab, ["mst"])
    assert results["mst"].attachment.uas == 1.0


def test_a_checkpoint_saved_before_the_arc_scorer_was_nn_biaffine_loads(tmp_path):
    vocab = biaffine.Vocab.build(TOY, min_count=1)
    model = biaffine.parser_for(vocab, word_dim=8, char_dim=4, hidden=8, arc_dim=8, label_dim=4)
    torch.nn.init.normal_(model.biaffine.weight)
    biaffine.save_checkpoint(tmp_path / "new.pt", model, vocab, "projective", {})
    saved = torch.load(tmp_path / "new.pt")
    old_names = {"biaffine.weight": "biaffine", "biaffine.bias": "head_bias"}
    saved["state"] = {old_names.get(k, k): v for k, v in saved["state"].items()}
    torch.save(saved, tmp_path / "old.pt")
    loaded = biaffine.load_checkpoint(tmp_path / "old.pt").model
    assert torch.equal(loaded.biaffine.weight, model.biaffine.weight)


@needs_data
@pytest.mark.parametrize("treebank, loss, pud", [("lassysmall", "nonprojective", None), ("ewt", "projective", "en"), ("lassysmall", "local", None)])
def test_quick_command_writes_scores_trees_and_pictures(tmp_path, treebank, loss, pud):
    extra = ["--pud", pud] if pud else []
    rows = parse.main(["--treebank", treebank, "--loss", loss, "--quick", "--max-sentences", "30", "--out", str(tmp_path), *extra])
    evaluated = [treebank] + ([f"pud-{pud}"] if pud else [])
    assert [(r["eval_file"], r["decoder"]) for r in rows] == [(e, d) for e in evaluated for d in biaffine.DECODERS[loss]]
    for r in rows:
        assert 0.0 <= r["uas"] <= 1.0 and r["valid"] == (1.0 if r["decoder"] != "argmax" else r["valid"])
        assert 0.0 < r["decode_share"] <= r["decode_share_cold"] < 1.0 and r["score_s"] > 0.0 and r["first_use_s"] > 0.0
    name = f"{treebank}_{loss}"
    for suffix in (".md", ".csv", "_trees.png", "_marginals.png", f"_{rows[0]['decoder']}.conllu"):
        assert (tmp_path / f"{name}{suffix}").stat().st_size > 0
    saved = torch.load(tmp_path / f"{name}.pt")  # torch's default weights_only=True: plain containers and tensors
    biaffine.parser_for(biaffine.Vocab(**saved["vocab"]), **saved["config"]).load_state_dict(saved["state"])
    predicted = read_conllu(tmp_path / f"{name}_{rows[-1]['decoder']}.conllu")  # a tree decoder
    gold = read_conllu(DATA / "ud" / TREEBANKS[treebank][1], max_sentences=30)
    assert [s.words for s in predicted] == [s.words for s in gold]
    assert all(is_tree(s.heads) for s in predicted)
    if pud:
        on_pud = read_conllu(tmp_path / f"{name}_pud-{pud}_{rows[-1]['decoder']}.conllu")
        assert [s.words for s in on_pud] == [s.words for s in read_conllu(DATA / "ud" / PUD[pud], max_sentences=30)]


def test_dev_split_is_a_fixed_draw_kept_in_order():
    sentences = [toy([0] * (i % 3 + 1), [f"s{i}"] * (i % 3 + 1)) for i in range(40)]
    train, dev = parse.split_dev(sentences, 0.1)
    assert len(dev) == 4 and len(train) == 36
    assert parse.split_dev(sentences, 0.1) == (train, dev)  # the same draw every time
    assert sorted(train + dev, key=sentences.index) == sentences
    assert train == sorted(train, key=sentences.index) and dev == sorted(dev, key=sentences.index)
    assert parse.split_dev(sentences, 0.0) == (sentences, [])
    assert len(parse.split_dev(sentences[:3], 0.1)[1]) == 1  # a positive fraction holds out at least one


def test_early_stopping_keeps_the_first_best_epoch_and_stops_after_patience():
    stopping = parse.EarlyStopping(patience=2)
    improved = [stopping.update(e, (s,)) for e, s in enumerate([0.5, 0.7, 0.6, 0.7, 0.65], 1)]
    assert improved == [True, True, False, False, False]
    assert stopping.best_epoch == 2 and stopping.stop


def test_fit_leaves_the_model_with_its_best_dev_epoch():
    torch.manual_seed(3)
    dev = [toy([0, 1, 2, 3]), toy([2, 0, 2, 3, 2])]
    vocab = biaffine.Vocab.build(TOY, min_count=1)
    model = biaffine.parser_for(vocab, word_dim=16, char_dim=8, hidden=16, arc_dim=16, label_dim=8, dropout=0.0)
    saved = []
    curve, best = parse.fit(model, vocab, TOY, dev, "nonprojective", epochs=8, patience=3, lr=3e-2, seed=3,
                            on_best=lambda epoch, row: saved.append(epoch))
    scores = [(r["dev_las"], r["dev_uas"]) for r in curve]
    assert best == 1 + scores.index(max(scores))  # ties keep the earlier epoch
    assert len(curve) == min(8, best + 3) and saved[-1] == best and saved == sorted(saved)
    a = parse.evaluate(model, dev, vocab, ["mst"])[0]["mst"].attachment
    assert (a.las, a.uas) == scores[best - 1]  # the best epoch's weights, not the last epoch's


def conllu_text(sentences) -> str:
    """CoNLL-U of toy sentences (words, heads, labels)."""
    out = []
    for i, s in enumerate(sentences):
        out.append(f"# sent_id = t{i}\n")
        out += [f"{m}\t{w}\t_\tNOUN\t_\t_\t{h}\t{r}\t_\t_\n" for m, (w, h, r) in enumerate(zip(s.words, s.heads, s.deprels), 1)]
        out.append("\n")
    return "".join(out)


def test_train_then_evaluate_and_predict_from_the_checkpoint(tmp_path, capsys):
    words = "the dog saw a cat near our house".split()
    full = toy([2, 3, 0, 5, 3, 3, 8, 6], words, ["det", "nsubj", "root", "det", "obj", "case", "nmod:poss", "obl"])
    sentences = [full if n == 8 else toy([0] + [1] * (n - 1), words[:n], ["root"] + ["dep"] * (n - 1))
                 for n in (8, 3, 8, 5, 8, 4, 8, 2, 8, 6)]
    train_file, test_file = tmp_path / "train.conllu", tmp_path / "test.conllu"
    train_file.write_text(conllu_text(sentences), encoding="utf-8")
    test_file.write_text(conllu_text(sentences[:4]), encoding="utf-8")
    out = tmp_path / "out"
    rows = parse.main(["train", "--train-file", str(train_file), "--test-file", str(test_file), "--loss", "local",
                       "--epochs", "2", "--patience", "1", "--dev-fraction", "0.2", "--out", str(out)])
    assert rows[0]["treebank"] == "train" and rows[0]["dev_sentences"] == 2 and rows[0]["best_epoch"] in (1, 2)
    checkpoint = out / "train_local.pt"
    saved = torch.load(checkpoint)  # torch's default weights_only=True
    assert saved["loss"] == "local" and saved["info"]["epoch"] == rows[0]["best_epoch"]
    assert saved["info"]["args"]["out"] == str(out)

    evaluated = parse.main(["evaluate", str(checkpoint), str(test_file)])
    assert [(r["decoder"], r["uas"], r["las"]) for r in evaluated] == [(r["decoder"], r["uas"], r["las"]) for r in rows]

    raw = tmp_path / "raw.txt"
    raw.write_text("the dog saw a cat\n\nour house\n", encoding="utf-8")
    predicted = tmp_path / "predicted.conllu"
    assert parse.main(["predict", str(checkpoint), str(raw), "--output", str(predicted), "--decoder", "mst"]) is None
    parsed = read_conllu(predicted)
    assert [s.words for s in parsed] == [tuple("the dog saw a cat".split()), ("our", "house")]
    assert all(is_tree(s.heads) for s in parsed) and all(r in saved["vocab"]["labels"] for s in parsed for r in s.deprels)
    capsys.readouterr()
    parse.main(["predict", str(checkpoint), str(test_file)])  # CoNLL-U in, to standard output
    assert [s.words for s in read_conllu_text(capsys.readouterr().out, tmp_path)] == [s.words for s in sentences[:4]]


def read_conllu_text(text: str, tmp_path):
    path = tmp_path / "stdout.conllu"
    path.write_text(text, encoding="utf-8")
    return read_conllu(path)


@pytest.mark.parametrize("argv, message", [
    (["evaluate", "{tmp}/missing.pt", "{tmp}/x.conllu"], "missing.pt: no such file"),
    (["predict", "{tmp}/other.pt", "{tmp}/x.conllu"], "not a parser checkpoint"),
    (["predict", "{tmp}/x.conllu", "{tmp}/x.conllu"], "not a file torch.load reads"),
    (["train", "--train-file", "{tmp}/missing.conllu"], "--train-file {tmp}/missing.conllu: no such file"),
    (["train", "--train-file", "{tmp}/short.conllu", "--test-file", "{tmp}/x.conllu"], "word 1 has no upos, head, deprel column"),
    (["--dev-fraction", "1.5", "--data-dir", "{tmp}"], "--dev-fraction"),
])
def test_bad_paths_and_options_are_clear_errors_before_any_training(tmp_path, capsys, argv, message):
    torch.save({"state": {}}, tmp_path / "other.pt")
    (tmp_path / "x.conllu").write_text(conllu_text(TOY), encoding="utf-8")
    (tmp_path / "short.conllu").write_text("1\tx\n\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exit:
        parse.main([a.format(tmp=tmp_path) for a in argv])
    assert exit.value.code == 2 and message.format(tmp=tmp_path) in capsys.readouterr().err
