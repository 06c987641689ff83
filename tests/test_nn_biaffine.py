"""structures.nn's biaffine scorers and the parser's model: the scores are Dozat & Manning's formula
in the structures' arc convention, and the model runs on tensors alone (no conllu)."""

import subprocess
import sys

import torch

from structures import NonProjectiveDependencyCRF
from structures.nn import MLP, Biaffine
from structures.nn.parser import ROOT, BiaffineParser


def test_biaffine_scores_arc_head_to_modifier_as_the_formula_per_pair():
    torch.manual_seed(0)
    layer = Biaffine(3)
    with torch.no_grad():
        layer.weight.normal_()
        layer.bias.normal_()
    head, dep = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    scores = layer(head, dep)
    assert scores.shape == (2, 4, 4)
    for b in range(2):
        for h in range(4):
            for m in range(4):
                expected = dep[b, m] @ layer.weight @ head[b, h] + layer.bias @ head[b, h]
                torch.testing.assert_close(scores[b, h, m], expected)


def test_biaffine_starts_uniform():
    assert (Biaffine(5)(torch.randn(1, 3, 5), torch.randn(1, 3, 5)) == 0).all()


def test_mlp_is_a_leaky_relu_layer():
    layer = MLP(4, 2)
    x = torch.randn(3, 4)
    expected = torch.nn.functional.leaky_relu(x @ layer[0].weight.T + layer[0].bias, 0.1)
    torch.testing.assert_close(layer(x), expected)


def test_the_parser_trains_on_tensors_and_its_scores_feed_a_crf():
    torch.manual_seed(0)
    model = BiaffineParser(n_words=10, n_chars=8, n_labels=3, word_dim=8, char_dim=4, hidden=8, arc_dim=8, label_dim=4)
    words = torch.randint(3, 10, (2, 5)).index_fill_(1, torch.tensor([0]), ROOT)
    chars = torch.randint(3, 8, (2, 5, 6))
    lengths = torch.tensor([4, 2])
    h = model.encode(words, chars, lengths)
    scores = model.arc_scores(h)
    assert scores.shape == (2, 5, 5)
    heads = torch.tensor([[0, 1, 1, 3], [2, 0, 0, 0]])
    assert model.label_scores(h, heads).shape == (2, 4, 3)
    loss = -NonProjectiveDependencyCRF(scores, lengths).log_prob(heads).mean()
    loss.backward()
    assert model.biaffine.weight.grad.abs().sum() > 0


def test_the_model_imports_without_the_experiments_or_conllu():
    code = ("import sys; import structures.nn.parser; "
            "print(sorted(m for m in ('conllu', 'matplotlib', 'structures.experiments') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
