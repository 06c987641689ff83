"""structures.experiments.babi: data, models, training and the quick end-to-end run (bAbI 1K, Kim et al. 2017 §4.3)."""

import csv
import math

import pytest
import torch
from torch import nn

from structures import HopChainCRF
from structures.experiments import babi
from structures.experiments.babi_data import read_examples, task_files

DATA = babi.default_data_dir()
needs_data = pytest.mark.skipif(not task_files(DATA, 2)[0].exists(), reason="bAbI data not available")


@pytest.fixture(scope="module")
def task2():
    return babi.load_task(2, DATA, limit=100)


@needs_data
def test_load_task_splits_off_a_tenth_for_validation():
    task = babi.load_task(2, DATA)
    assert (len(task.train), len(task.valid), len(task.test)) == (900, 100, 1000)
    assert task.train.stories.shape[1] == 25 and (task.train.lengths <= 25).all() and (task.train.lengths >= 2).all()


@needs_data
def test_validation_is_the_last_tenth_of_the_training_file():
    """As in Sukhbaatar et al.'s and Kim et al.'s code. A random tenth shares stories with the
    training questions: task 17 asks 8 questions of each 2-fact story, 373 of its 1,000 training
    questions repeat an earlier one word for word, and a random split puts dozens of copies of
    training questions into validation."""
    examples = read_examples(task_files(DATA, 17)[0], 25)
    task = babi.load_task(17, DATA)
    assert task.valid.answers.tolist() == [task.vocab[ex.answer] for ex in examples[900:]]
    assert task.train.answers.tolist() == [task.vocab[ex.answer] for ex in examples[:900]]

    def copies(split):
        key = lambda s, q: (s.numpy().tobytes(), q.numpy().tobytes())  # noqa: E731
        train = {key(s, q) for s, q in zip(split.train.stories, split.train.queries)}
        return sum(key(s, q) in train for s, q in zip(split.valid.stories, split.valid.queries))

    assert copies(task) <= 4  # only the story cut by the split (questions 897-904) can repeat
    assert copies(babi.load_task(17, DATA, split="random")) > 20


def test_random_noise_spreads_the_temporal_indices_of_each_story():
    """Sukhbaatar et al.'s random noise: each story's n facts get n distinct temporal indices, oldest
    largest, below n + ceil(n/10), those past the memory size capped to it (as the reference code
    does); without noise they are n-1, ..., 0."""
    torch.manual_seed(0)
    lengths = torch.tensor([1, 5, 20, 25, 25])
    plain = (lengths[:, None] - 1 - torch.arange(25)).clamp_min(0)
    assert torch.equal(babi.noisy_recency(lengths, 25, 0.0), plain)
    moved = False
    for _ in range(50):
        recency = babi.noisy_recency(lengths, 25, 0.1)
        for n, row in zip(lengths.tolist(), recency):
            facts = row[:n]
            assert ((facts[:-1] > facts[1:]) | (facts[:-1] == 24)).all() and facts.min() >= 0
            assert facts.max() <= min(n + math.ceil(0.1 * n), 25) - 1 and (row[n:] == 0).all()
        moved |= not torch.equal(recency, plain)
    assert moved


@needs_data
def test_random_noise_is_used_in_training_only(task2):
    torch.manual_seed(0)
    model = babi.build_model("memn2n", task2, random_noise=0.5)
    batch = task2.test.select(slice(0, 16))
    model.eval()
    assert torch.equal(model(batch)[0], model(batch)[0])
    model.train()
    torch.manual_seed(1)
    noisy = model(batch)[0]
    torch.manual_seed(2)
    assert not torch.allclose(noisy, model(batch)[0])


@needs_data
def test_select_epoch_keeps_the_best_validation_epoch(task2):
    config = babi.RunConfig(epochs=4, linear_start=1, select_epoch="softmax")
    model, result = babi.train_runs("memn2n", task2, [0], config)[0]
    assert 2 <= result["epoch"] <= 4 and not result["linear"]  # after the linear start
    assert babi.evaluate(model, task2.valid)["answer"] == result["valid_answer"]
    last = babi.train_runs("memn2n", task2, [0], babi.RunConfig(epochs=result["epoch"], linear_start=1))[0][1]
    assert last["valid_answer"] == result["valid_answer"] and last["test_answer"] == result["test_answer"]


@needs_data
def test_select_epoch_any_may_keep_a_linear_start_model_linear(task2):
    """Kim et al.'s code keeps its best held-out model from the first epoch on, linear start included."""
    config = babi.RunConfig(epochs=3, linear_start=3, select_epoch="any")
    model, result = babi.train_runs("binary", task2, [0], config)[0]
    assert result["linear"] and model.linear and result["epoch"] <= 3
    assert babi.evaluate(model, task2.valid)["answer"] == result["valid_answer"]
    with pytest.raises(ValueError, match="select_epoch"):
        babi.train_runs("binary", task2, [0], babi.RunConfig(epochs=1, select_epoch="best"))


@needs_data
@pytest.mark.parametrize("patience", [1, 2])
def test_the_linear_start_may_end_when_the_validation_loss_stops_decreasing(task2, patience):
    """Sukhbaatar et al. §4.2 (patience 1): the softmax comes back after ``patience`` epochs in a row
    whose validation loss is not below the best before them; the rest of the run is the run with
    that fixed linear start."""
    cap = 10

    def linear_validation_loss(epochs: int) -> float:
        model = babi.train_runs("memn2n", task2, [0], babi.RunConfig(epochs=epochs, linear_start=cap))[0][0]
        model.linear = True
        return babi.evaluate(model, task2.valid)["loss"].item()

    losses = [linear_validation_loss(e) for e in range(1, cap + 1)]
    stalled = [not losses[e] < min(losses[:e], default=math.inf) for e in range(cap)]
    stops = [e + 1 for e in range(cap) if all(stalled[e + 1 - patience: e + 1]) and e + 1 >= patience]
    expected = stops[0] if stops else cap
    assert expected < cap  # the rule fires here, so the test sees it
    config = babi.RunConfig(epochs=expected + 2, linear_start=cap, linear_start_patience=patience)
    model, result = babi.train_runs("memn2n", task2, [0], config)[0]
    again = babi.train_runs("memn2n", task2, [0], babi.RunConfig(epochs=expected + 2, linear_start=expected))[0][1]
    assert result["linear_epochs"] == expected and not model.linear
    assert result["test_answer"] == again["test_answer"] and result["valid_loss"] == again["valid_loss"]
    with pytest.raises(ValueError, match="one run at a time"):
        babi.train_runs("memn2n", task2, [0, 1], config)


@needs_data
def test_unlinking_the_binary_crf_leaves_independent_hops_that_do_not_repeat(task2):
    """Kim et al.'s code after its epoch 20: the binary chain without its link term."""
    config = babi.RunConfig(epochs=3, linear_start=0, unlink_after=2)
    model, result = babi.train_runs("binary", task2, [0], config)[0]
    assert result["unlinked"] and model.attention.kind == "unary" and model.attention.no_repeat
    assert babi.evaluate(model, task2.valid)["answer"] == result["valid_answer"]
    _, out = model(task2.test)
    assert out.distribution.decode().diff(dim=-1).ne(0).all()  # never the same fact twice
    model.attention.kind = "binary"
    assert babi.evaluate(model, task2.valid)["loss"] != result["valid_loss"]  # the link term mattered
    linked = babi.train_runs("binary", task2, [0], babi.RunConfig(epochs=2, linear_start=0))[0][1]
    kept = babi.train_runs("binary", task2, [0], babi.RunConfig(epochs=2, linear_start=0, unlink_after=2))[0][1]
    assert not kept["unlinked"] and kept["test_answer"] == linked["test_answer"] and kept["valid_loss"] == linked["valid_loss"]
    with pytest.raises(ValueError, match="only the binary CRF"):
        babi.train_runs("memn2n", task2, [0], config)


@needs_data
def test_memories_are_padded_to_the_longest_story_only():
    task = babi.load_task(16, DATA)  # every task 16 story has 9 statements
    assert task.train.stories.shape[1] == task.test.stories.shape[1] == 9 and (task.test.lengths == 9).all()
    assert babi.build_model("binary", task).temporal.shape == (1, 4, 9, 20)


@needs_data
def test_supporting_facts_index_the_memory():
    """Task 2 asks where an object is: its last supporting fact puts the carrier in the answer's place."""
    examples = read_examples(task_files(DATA, 2)[1], 25)
    for ex in examples:
        assert len(ex.support) == 2 and min(ex.support) >= 0
        assert ex.answer in ex.memory[ex.support[1]]


def test_position_encoding_is_the_reference_codes_and_zero_at_padding():
    """``1 + 4 (k - (d+1)/2)(j - (J+1)/2) / (d J)``: twice the paper's printed formula at centred
    indices, averaging 1 over the dimensions at every position (the printed formula averages 1/2)."""
    words = torch.tensor([[5, 7, 9, 0]])
    l = babi.position_encoding(words, 4)
    J, d = 3, 4
    printed = lambda j, k: (1 - j / J) - (k / d) * (1 - 2 * j / J)  # noqa: E731
    for j in range(1, J + 1):
        for k in range(1, d + 1):
            assert l[0, j - 1, k - 1].item() == pytest.approx(1 + 4 * (k - (d + 1) / 2) * (j - (J + 1) / 2) / (d * J))
            assert l[0, j - 1, k - 1].item() == pytest.approx(2 * printed(j - 0.5, k - 0.5))
    assert l[0, :J].mean(-1).tolist() == pytest.approx([1.0] * J)
    assert (l[0, 3] == 0).all()


def test_fact_sequence_accuracy_needs_the_exact_sequence():
    selected = torch.tensor([[3, 1], [1, 3], [3, 1], [3, 1]])
    support = torch.tensor([[3, 1, -1], [3, 1, -1], [3, 1, 2], [-1, -1, -1]])
    assert babi.fact_sequence_correct(selected, support).tolist() == [True, False, False, False]


@needs_data
@pytest.mark.parametrize("kind", babi.MODELS)
def test_models_answer_over_the_vocabulary_and_select_one_fact_per_hop(task2, kind):
    model = babi.build_model(kind, task2)
    logits, out = model(task2.test.select(slice(0, 8)))
    assert logits.shape == (8, len(task2.vocab) + 1)
    facts = model.selected_facts(out)
    assert facts.shape == (8, 2) and (facts < task2.test.lengths[:8, None]).all()
    assert isinstance(out.distribution, HopChainCRF) == (kind != "memn2n")


@needs_data
@pytest.mark.parametrize("kind", babi.MODELS)
def test_linear_start_changes_every_models_answers(task2, kind):
    """MemN2N drops its softmax; the CRFs take their hops linearly (A.4's linear start, the query
    scores without log_softmax, gave a chain CRF the very same answers)."""
    torch.manual_seed(0)
    model = babi.build_model(kind, task2)
    batch = task2.test.select(slice(0, 8))
    model.linear = True
    linear, _ = model(batch)
    model.linear = False
    assert (linear - model(batch)[0]).abs().max() > 0.1  # the logits are ~0.4 at initialization


@needs_data
def test_the_binary_crfs_link_is_an_option(task2):
    batch = task2.test.select(slice(0, 8))
    logits = []
    for link in ("outputs", "inputs"):
        torch.manual_seed(0)
        model = babi.build_model("binary", task2, link=link)
        assert model.attention.link == link
        logits.append(model(batch)[0])
    assert not torch.allclose(*logits)


@pytest.mark.parametrize("std", [0.1, 0.316])
def test_the_embeddings_are_drawn_with_the_chosen_standard_deviation(std):
    """Sukhbaatar et al. draw N(0, 0.1), Kim et al.'s code N(0, 1/sqrt(10)); padding stays 0."""
    torch.manual_seed(0)
    model = babi.BabiModel("binary", vocab_size=200, hops=2, init_std=std, replicas=3)
    words = model.embeddings[:, :, 1:]
    assert words.std().item() == pytest.approx(std, rel=0.05)
    assert model.temporal.std().item() == pytest.approx(std, rel=0.1)
    assert (model.embeddings[:, :, 0] == 0).all()


@needs_data
@pytest.mark.parametrize("kind", ["memn2n", "binary"])
def test_training_lowers_the_loss(task2, kind):
    torch.manual_seed(0)
    model = babi.build_model(kind, task2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    before = babi.evaluate(model, task2.train)["loss"]
    for _ in range(2):
        babi.train_epoch(model, task2.train, optimizer, generators=[torch.Generator().manual_seed(0)])
    assert babi.evaluate(model, task2.train)["loss"] < before


@needs_data
def test_a_run_is_deterministic_given_its_seed(task2):
    config = babi.RunConfig(epochs=1, linear_start=1)
    first = babi.train_runs("binary", task2, [3], config)[0][1]
    second = babi.train_runs("binary", task2, [3], config)[0][1]
    timing = ("seconds", "load")  # (the wall time and the machine's load average at the end vary)
    assert {k: v for k, v in first.items() if k not in timing} == {k: v for k, v in second.items() if k not in timing}


@needs_data
def test_quick_run_writes_tables_and_figures(tmp_path):
    rows = babi.main(["--quick", "--out", str(tmp_path)])
    assert [r["model"] for r in rows] == list(babi.MODELS) * 2
    for name in ("babi.md", "babi.csv", "babi_runs.csv", "babi_tasks.png", "babi_hops.png"):
        assert (tmp_path / name).stat().st_size > 0
    with open(tmp_path / "babi.csv") as f:
        table = list(csv.DictReader(f))
    assert {r["task"] for r in table} == {"2", "average"}
    assert all(0 <= float(r["test_answer"]) <= 100 and 0 <= float(r["test_fact"]) <= 100 for r in table)
    assert table[0]["paper_answer"] == "87.3" and float(table[0]["seconds"]) > 0
    with open(tmp_path / "babi_questions.csv") as f:
        questions = list(csv.DictReader(f))
    for r in table[:-len(babi.MODELS)]:  # the reported run's questions give its test accuracies
        mine = [q for q in questions if q["task"] == r["task"] and q["model"] == r["model"]]
        assert {q["seed"] for q in mine} == {r["best_seed"]} and len(mine) == 200
        assert 100 * sum(int(q["answer_correct"]) for q in mine) / len(mine) == pytest.approx(float(r["test_answer"]))
        assert 100 * sum(int(q["fact_correct"]) for q in mine) / len(mine) == pytest.approx(float(r["test_fact"]))


def test_options_that_cannot_run_are_refused_before_any_training(capsys):
    """Task 1 has one hop; the binary chain needs two: an argparse error, not a crash after MemN2N trained."""
    with pytest.raises(SystemExit):
        babi.main(["--tasks", "1", "2", "--models", "memn2n", "binary", "--data-dir", "/nonexistent"])
    assert "the binary hop chain needs K >= 2 hops; tasks [1]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        babi.main(["--tasks", "2", "--linear-start-patience", "1", "--parallel", "2", "--data-dir", "/nonexistent"])
    assert "--linear-start-patience: each run leaves the linear start at its own epoch" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        babi.main(["--tasks", "2", "--models", "memn2n", "binary", "--unlink-after", "20", "--data-dir", "/nonexistent"])
    assert "--unlink-after: only the binary CRF" in capsys.readouterr().err


@needs_data
def test_the_command_line_schedule_reaches_every_run(monkeypatch, tmp_path):
    seen = []

    def stop(kind, task, seeds, config):
        seen.append((seeds, config))
        raise KeyboardInterrupt

    monkeypatch.setattr(babi, "train_runs", stop)
    with pytest.raises(KeyboardInterrupt):
        babi.main(["--tasks", "2", "--models", "binary", "--batch-size", "1", "--random-noise", "0.1", "--select-epoch", "any",
                   "--link", "both", "--init-std", "0.316", "--runs", "3", "--parallel", "2", "--out", str(tmp_path)])
    assert seen == [([0, 1], babi.RunConfig(batch_size=1, random_noise=0.1, select_epoch="any", link="both", init_std=0.316))]
    with pytest.raises(KeyboardInterrupt):
        babi.main(["--tasks", "2", "--models", "memn2n", "--linear-start", "40", "--linear-start-patience", "3", "--out", str(tmp_path)])
    assert seen[1] == ([0], babi.RunConfig(linear_start=40, linear_start_patience=3))
    with pytest.raises(KeyboardInterrupt):
        babi.main(["--tasks", "2", "--models", "binary", "--unlink-after", "20", "--out", str(tmp_path)])
    assert seen[2] == ([0], babi.RunConfig(unlink_after=20))


@needs_data
@pytest.mark.parametrize("kind", babi.MODELS)
def test_runs_trained_side_by_side_are_the_runs_trained_alone(task2, kind):
    """Replicas share nothing but the batch: each ends with the parameters and metrics it has
    when trained alone from its seed (without random noise, whose draws are shared)."""
    config = babi.RunConfig(epochs=3, linear_start=1, batch_size=4, select_epoch="any")
    together = babi.train_runs(kind, task2, [3, 5], config)
    for seed, (model, result) in zip([3, 5], together):
        alone, alone_result = babi.train_runs(kind, task2, [seed], config)[0]
        for (name, value), expected in zip(model.state_dict().items(), alone.state_dict().values()):
            assert torch.allclose(value, expected, atol=1e-6), name
        skip = ("replicas", "seconds", "load")
        assert {k: v for k, v in result.items() if k not in skip} == {k: v for k, v in alone_result.items() if k not in skip}
        assert model.linear == alone.linear and model.replicas == 1


@needs_data
def test_each_replica_is_clipped_by_its_own_gradient_norm(task2):
    torch.manual_seed(0)
    model = babi.BabiModel.stack([babi.build_model("binary", task2) for _ in range(3)])
    batch = task2.train.select(torch.arange(6))
    logits, _ = model(batch)
    (nn.functional.cross_entropy(logits, batch.answers, reduction="none") * torch.tensor([1.0, 1, 1e4, 1e4, 0, 0])).sum().backward()
    norms = lambda: torch.stack([p.grad.flatten(1).pow(2).sum(1) for p in model.parameters()]).sum(0).sqrt()  # noqa: E731
    before = norms()
    model.clip_grad_norms_(40.0)
    after = norms()
    assert before[0] < 40 and after[0] == pytest.approx(before[0].item())  # untouched
    assert before[1] > 40 and after[1] == pytest.approx(40.0, rel=1e-4)
    assert before[2] == after[2] == 0


@needs_data
def test_a_batch_must_split_evenly_among_the_replicas(task2):
    model = babi.BabiModel.stack([babi.build_model("memn2n", task2) for _ in range(2)])
    with pytest.raises(ValueError, match="multiple of the 2 replicas"):
        model(task2.train.select(torch.arange(3)))


def test_the_fact_score_averages_the_better_half_of_the_runs_by_validation():
    runs = [{"seed": s, "valid_answer": v, "valid_loss": 1.0, "test_answer": 50.0, "test_fact": f, "seconds": 1.0}
            for s, (v, f) in enumerate([(90.0, 10.0), (95.0, 30.0), (80.0, 0.0), (99.0, 60.0)])]
    row = babi.summarize(2, "binary", runs)
    assert (row["best_seed"], row["test_fact"]) == (3, 60.0)
    assert row["top_half_test_fact"] == 45.0  # seeds 3 and 1, not the mean of all four (25.0)
    assert row["mean_test_fact"] == 25.0
