"""The DMV (Klein & Manning 2004) as a second-order projective CRF: its marginal likelihood and
best tree against the model's generative story, enumerated over every projective tree."""

import pytest
import torch

from brute import projective_trees
from structures.experiments import default_data_dir, induce
from structures.experiments.dmv import DMV, fit, parses
from structures.experiments.ud import Sentence

DATA = default_data_dir()


def generative_log_prob(model: DMV, tags: list[int], heads: list[int]) -> torch.Tensor:
    """``log p(tags, tree)`` by the DMV's story: the root picks its child's tag; each head, on each
    side, continues (then picks a dependent's tag, closest first) or stops, by its valence."""
    n = len(tags)
    t = torch.tensor(tags)
    attach = model.attach(model.embed(t)).view(n, 2, -1).log_softmax(-1)
    stop = model.stop(model.embed(t)).view(n, 2, 2)
    root_child = heads.index(0) + 1
    lp = model.root.log_softmax(-1)[tags[root_child - 1]]
    for h in range(1, n + 1):
        for side in (0, 1):
            kids = sorted((m for m in range(1, n + 1) if heads[m - 1] == h and (m > h) == bool(side)), key=lambda m: abs(m - h))
            valence = 0
            for m in kids:
                lp = lp + torch.nn.functional.logsigmoid(-stop[h - 1, side, valence]) + attach[h - 1, side, tags[m - 1]]
                valence = 1
            lp = lp + torch.nn.functional.logsigmoid(stop[h - 1, side, valence])
    return lp


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_likelihood_and_best_tree_are_the_generative_models(seed):
    torch.manual_seed(seed)
    model = DMV(6, dim=4).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 1.5)
    sentences = [[3, 4, 5, 3, 4], [5, 3], [4]]
    N = 8
    tags = torch.zeros(3, N, dtype=torch.long)
    for b, s in enumerate(sentences):
        tags[b, :len(s)] = torch.tensor(s)
    lengths = torch.tensor([len(s) for s in sentences])
    crf, constant = model.crf(tags, lengths)
    with torch.no_grad():
        for b, s in enumerate(sentences):
            scored = {}
            for arcs in projective_trees(len(s)):
                heads = [h for h, _ in sorted(arcs, key=lambda a: a[1])]
                if heads.count(0) == 1:
                    scored[tuple(heads)] = generative_log_prob(model, s, heads)
            expected = torch.stack(list(scored.values())).logsumexp(0)
            assert (crf.log_partition[b] + constant[b]).item() == pytest.approx(expected.item(), rel=1e-10)
            assert crf.decode()[b, :len(s)].tolist() == list(max(scored, key=lambda k: scored[k]))
    loss = model.loss(tags, lengths)
    assert loss.item() == pytest.approx(-(crf.log_partition + constant).sum().item() / 8, rel=1e-10)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_the_harmonic_bias_favours_short_arcs():
    torch.manual_seed(0)
    model = DMV(6, dim=4)
    tags, lengths = torch.tensor([[3, 4, 5, 3, 4, 5, 3]]), torch.tensor([7])
    plain, _ = model.crf(tags, lengths)
    biased, _ = model.crf(tags, lengths, harmonic=1.0)
    h, m = torch.tensor(2), torch.tensor(6)
    assert (biased.log_potentials[0, h, m] - plain.log_potentials[0, h, m]).item() == pytest.approx(-torch.log(torch.tensor(4.0)).item())
    assert torch.equal(biased.log_potentials[0, 2, 3], plain.log_potentials[0, 2, 3])


@pytest.mark.skipif(not (DATA / "ud").exists(), reason="shared UD data not available")
def test_quick_command_dmv_with_restarts_and_the_layer_it_teaches(tmp_path):
    rows = induce.main(["--quick", "--max-sentences", "20", "--objective", "dmv", "--values", "upos", "--uniform-epochs", "1",
                        "--drop-punct", "--restarts", "2", "--student-epochs", "1", "--out", str(tmp_path)])
    assert [r["trees"] for r in rows] == ["gold", "dmv", "layer", "right-branching", "left-branching"]
    assert rows[0]["seed"] in (0, 1) and rows[0]["restarts"] == 2
    assert (tmp_path / "en_bilinear_dmv_upos_nopunct_uniform1_student1_restarts2.csv").stat().st_size > 0
    with pytest.raises(SystemExit):
        induce.main(["--quick", "--objective", "dmv", "--out", str(tmp_path)])


def test_parses_are_single_rooted_projective_trees():
    torch.manual_seed(0)
    sentences = [Sentence(None, tuple("abcde"), ("DET", "NOUN", "VERB", "DET", "NOUN"), (2, 3, 0, 5, 3), ("dep",) * 5)]
    tag_index = induce.word_index(sentences, min_count=1, field="upos")
    heads = parses(DMV(len(tag_index)), sentences, tag_index)[0]
    assert len(heads) == 5 and heads.count(0) == 1


def test_restarts_keep_the_highest_likelihood():
    sentences = [Sentence(None, tuple("abcde"), ("DET", "NOUN", "VERB", "DET", "NOUN"), (2, 3, 0, 5, 3), ("dep",) * 5),
                 Sentence(None, tuple("abc"), ("NOUN", "VERB", "ADV"), (2, 0, 2), ("dep",) * 3)]
    tag_index = induce.word_index(sentences, min_count=1, field="upos")
    finals = {seed: fit(sentences, tag_index, epochs=2, seeds=[seed])[1][-1] for seed in (0, 1, 2)}
    model, curve, seed = fit(sentences, tag_index, epochs=2, seeds=[0, 1, 2])
    assert seed == min(finals, key=finals.get) and curve[-1] == pytest.approx(finals[seed])
