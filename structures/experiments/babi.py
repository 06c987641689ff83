"""Question answering on bAbI with structured attention over facts (Kim et al. 2017, §4.3, Table 4).

Three models over the same fact and query representations (appendix A.4): MemN2N (Sukhbaatar et
al. 2015: position encoding, temporal encoding, adjacent weight tying, K greedy softmax hops), and
the unary and binary hop chain CRFs (:class:`structures.nn.HopAttention`). Each is trained per task
on the 1K training set (its last 10% held out for validation, as in Sukhbaatar et al.'s and Kim et
al.'s code) with SGD, learning rate 0.01 halved every 25 epochs for 100 epochs, gradients
renormalized above norm 40, optionally Sukhbaatar et al.'s *random noise* on the temporal indices
(``--random-noise 0.1``), and *linear start*: for the first 20
epochs MemN2N's attention has no softmax and the CRFs take their hops greedily and linearly from
the raw scores (A.4's "no log_softmax on the query scores" would change nothing in a chain CRF;
:class:`structures.nn.HopAttention`). The binary CRF's link between hops is ``o^k_i · x^{k+1}_j``
by default (``--link inputs``: A.4's printed ``x^k_i · x^{k+1}_j``). The best of
``--runs`` initializations on validation answer accuracy is reported, with answer accuracy and
supporting-fact sequence accuracy (MemN2N: the argmax of each hop's attention; the CRFs: the
decoded hop chain) on the test set. ``--parallel N`` trains N initializations at once, as the
replicas of one batched model (:class:`BabiModel`), which makes Kim et al.'s one question a step
(``--batch-size 1``) affordable.

    python -m structures.experiments.babi --tasks 2 3 11 --models memn2n binary unary --runs 3
"""

from __future__ import annotations

import copy
import csv
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor, nn

from ..nn import AttentionOutput, HopAttention, MemoryHopAttention
from . import command_line, default_data_dir
from .babi_data import Batch, build_vocab, read_examples, task_files, to_batch
from .provenance import provenance, provenance_line
from .progress import Progress, report

MODELS = ("memn2n", "binary", "unary")
LABELS = {"memn2n": "MemN2N", "binary": "Binary CRF", "unary": "Unary CRF"}

# Kim et al. 2017, Table 4: K, then (answer %, fact %) for MemN2N, binary CRF, unary CRF (None: not measured)
PAPER = {
    2: (2, (87.3, 46.8), (84.7, 81.8), (43.5, 22.3)),
    3: (3, (52.6, 1.4), (40.5, 0.1), (28.2, 0.0)),
    7: (3, (83.2, None), (83.5, None), (79.3, None)),
    8: (3, (94.1, None), (93.3, None), (87.1, None)),
    11: (2, (97.8, 38.2), (97.7, 80.8), (88.6, 0.0)),
    13: (2, (95.6, 14.8), (97.0, 36.4), (94.4, 9.3)),
    14: (2, (99.9, 77.6), (99.7, 98.2), (90.5, 30.2)),
    15: (2, (100.0, 59.3), (100.0, 89.5), (100.0, 51.4)),
    16: (3, (97.1, 91.0), (97.9, 85.6), (98.0, 41.4)),
    17: (2, (61.1, 23.9), (60.6, 49.6), (59.7, 10.5)),
    18: (2, (86.4, 3.3), (92.2, 3.9), (92.0, 1.4)),
    19: (2, (21.3, 10.2), (24.4, 11.5), (24.3, 7.8)),
}
PAPER_AVERAGE = {"memn2n": (81.4, 39.6), "binary": (81.0, 53.7), "unary": (73.8, 17.4)}
DEFAULT_TASKS = (2, 3, 11, 13, 14, 15, 16, 17, 18, 19)


def paper(task: int, model: str) -> tuple[float | None, float | None]:
    """The paper's (answer %, fact %) for ``model`` on ``task`` (None where not reported)."""
    if task not in PAPER:
        return None, None
    return PAPER[task][1 + MODELS.index(model)]


def hops_for(task: int) -> int:
    """K, the number of hops the paper uses for ``task`` (the supporting facts' count elsewhere)."""
    return PAPER[task][0] if task in PAPER else {1: 1, 4: 1, 5: 1, 6: 1, 9: 1, 10: 1, 12: 1, 20: 1}.get(task, 2)


@dataclass
class Task:
    """One bAbI task as tensors: ``train``/``valid``/``test`` :class:`Batch`es and the vocabulary."""

    number: int
    train: Batch
    valid: Batch
    test: Batch
    vocab: dict[str, int]
    test_text: list = field(default_factory=list)  # the test Examples, for the figures


def load_task(task: int, data_dir: Path | None = None, memory_size: int = 25, valid_fraction: float = 0.1,
              seed: int = 0, limit: int | None = None, split: str = "last") -> Task:
    """Read the 1K task ``task`` and split off ``valid_fraction`` of its training questions: a
    seeded shuffle (``split="random"``) or the last ones (``"last"``, as Sukhbaatar et al.'s
    reference code, so that few stories have questions on both sides of the split).
    ``limit`` keeps the first ``limit`` training and test questions (quick runs).
    Memories hold the last ``memory_size`` statements; the tensors are padded only to the longest
    memory of the task (train and test alike), which makes the short-story tasks several times faster."""
    train_path, test_path = task_files(data_dir or default_data_dir(), task)
    if not train_path.exists():
        raise FileNotFoundError(f"bAbI task {task} not found: {train_path}")
    train, test = read_examples(train_path, memory_size), read_examples(test_path, memory_size)
    if limit is not None:
        train, test = train[:limit], test[:limit]
    vocab = build_vocab(train, test)
    n_valid = max(1, int(round(valid_fraction * len(train))))
    if split == "random":
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
    elif split == "last":
        order = torch.arange(len(train)).roll(n_valid)  # the last n_valid questions first
    else:
        raise ValueError(f"split: expected 'random' or 'last', got {split!r}")
    longest = max(len(ex.memory) for ex in train + test)
    everything = to_batch(train, vocab, longest)
    test_batch = to_batch(test, vocab, longest)
    return Task(task, everything.select(order[n_valid:]), everything.select(order[:n_valid]), test_batch, vocab, test)


def position_encoding(words: Tensor, dim: int) -> Tensor:
    """Position encoding weights ``l_kj = 1 + 4 (k - (d+1)/2)(j - (J+1)/2) / (d J)`` for ``words [..., J]``
    (ids, 0 = padding; ``J`` = each sentence's own length): ``[..., J, dim]``, 0 at padding.

    This is the formula of Sukhbaatar et al.'s reference code (MemN2N-babi-matlab, ``build_model.m``):
    twice the paper's printed ``(1 - j/J) - (k/d)(1 - 2j/J)`` with centred indices, so the weights
    average 1 (a bag of words modulated by position) instead of 1/2. The factor matters: with the
    printed formula (and the N(0, 0.1) initialization) task 16 never trains past 48%.
    """
    length = (words > 0).sum(-1, keepdim=True).clamp_min(1).unsqueeze(-1).float()  # [..., 1, 1]
    j = torch.arange(1, words.shape[-1] + 1, dtype=torch.float).unsqueeze(-1)  # [J, 1]
    k = torch.arange(1, dim + 1, dtype=torch.float)  # [dim]
    weights = 1 + 4 * (k - (dim + 1) / 2) * (j - (length + 1) / 2) / (dim * length)
    return weights * (words > 0).unsqueeze(-1)


def noisy_recency(lengths: Tensor, memory_size: int, fraction: float) -> Tensor:
    """Sukhbaatar et al.'s *random noise* (§4.1, reference code ``randomize_time``): ``[B, M]``
    temporal indices (0 = newest) as if up to ``ceil(fraction · n)`` empty memories (uniformly
    many) had been inserted at random among an example's ``n`` facts: a sorted random ``n``-subset
    of ``0 .. n + blanks - 1``, capped at ``memory_size - 1``. Padded slots get index 0."""
    B = lengths.shape[0]
    blanks = (torch.rand(B) * (torch.ceil(fraction * lengths) + 1)).floor().long()
    total = lengths + blanks
    keys = torch.rand(B, int(total.max())).masked_fill(torch.arange(int(total.max())) >= total[:, None], 2.0)
    n = int(lengths.max())
    chosen = keys.argsort(-1)[:, :n]  # n distinct indices below total (n <= total)
    chosen = chosen.masked_fill(torch.arange(n) >= lengths[:, None], 0).sort(-1, descending=True).values
    slot = torch.arange(memory_size)
    chosen = nn.functional.pad(chosen, (0, max(0, memory_size - n)))[:, :memory_size]  # slot m (oldest first) gets the m-th largest
    return chosen.where(slot < lengths[:, None], 0).clamp_max(memory_size - 1)


class BabiModel(nn.Module):
    """MemN2N or a hop chain CRF over a story (appendix A.4), ``dim``-dimensional embeddings;
    ``replicas`` independent copies of it, trained side by side as one batched model.

    Embedding matrices ``E_0..E_K`` and temporal encodings ``T_0..T_K`` with adjacent tying: hop
    ``k`` reads facts through ``E_{k-1}`` (``x^k``) and ``E_k`` (``o^k``), the question through
    ``E_0`` and the answer scores are ``(final query) E_K^T``. MemN2N's final query is
    ``q^K + c^K``; the CRFs' ``q^K + c`` with ``q^{k+1} = Q q^k`` (``Q`` initialized to the identity).
    ``link`` is the binary CRF's link term (:class:`~structures.nn.HopAttention`); ``random_noise``
    the fraction of :func:`noisy_recency` used while training (0: none); ``init_std`` the standard
    deviation of the embeddings' and temporal encodings' normal draw (0.1: Sukhbaatar et al.'s;
    Kim et al.'s code: 1/√10).

    Every parameter has the replica first: ``embeddings [R, K+1, V+1, D]`` (row 0, padding, is 0
    and stays 0: padded words have position weight 0), ``temporal [R, K+1, M, D]``, ``query_map
    [R, D, D]``. A batch of ``R·b`` examples is read replica-major (examples ``r·b .. r·b+b-1`` go
    to replica ``r``), so that summing the loss over it trains each replica on its own ``b``
    examples: with one example a replica, ``R`` runs of Kim et al.'s one-question SGD steps cost
    about what one run does (the steps are dominated by per-operation overhead).
    """

    def __init__(self, kind: str, vocab_size: int, hops: int, dim: int = 20, memory_size: int = 25, link: str = "outputs",
                 random_noise: float = 0.0, replicas: int = 1, init_std: float = 0.1):
        super().__init__()
        if kind not in MODELS:
            raise ValueError(f"kind: expected one of {MODELS}, got {kind!r}")
        self.kind, self.hops, self.dim, self.random_noise, self.replicas = kind, hops, dim, random_noise, replicas
        self.vocab_size, self.memory_size, self.link = vocab_size, memory_size, link
        self.embeddings = nn.Parameter(init_std * torch.randn(replicas, hops + 1, vocab_size + 1, dim))
        self.temporal = nn.Parameter(init_std * torch.randn(replicas, hops + 1, memory_size, dim))
        with torch.no_grad():
            self.embeddings[:, :, 0] = 0
        if kind == "memn2n":
            self.attention = MemoryHopAttention()
        else:
            self.attention = HopAttention(kind, link=link)
            self.query_map = nn.Parameter(torch.eye(dim).repeat(replicas, 1, 1))

    def _like(self, replicas: int, state: dict[str, Tensor]) -> BabiModel:
        """A model like this one with ``replicas`` replicas and parameters ``state``."""
        with torch.random.fork_rng(devices=[]):  # the placeholder parameters leave the global RNG alone
            model = BabiModel(self.kind, self.vocab_size, self.hops, self.dim, self.memory_size, self.link,
                              self.random_noise, replicas)
        model.load_state_dict(state)
        model.linear = self.linear
        return model

    @staticmethod
    def stack(models: list[BabiModel]) -> BabiModel:
        """One model whose replicas are ``models`` (alike but for their parameters), in order."""
        states = [m.state_dict() for m in models]
        return models[0]._like(sum(m.replicas for m in models), {name: torch.cat([s[name] for s in states]) for name in states[0]})

    def replica(self, r: int) -> BabiModel:
        """Replica ``r`` as a model of its own (a copy)."""
        return self._like(1, {name: value[r:r + 1].clone() for name, value in self.state_dict().items()})

    @property
    def linear(self) -> bool:
        return self.attention.linear

    @linear.setter
    def linear(self, value: bool) -> None:
        self.attention.linear = value

    def replica_of_rows(self, n: int) -> Tensor:
        """``[n]``: the replica that reads each of ``n`` replica-major rows."""
        if n % self.replicas:
            raise ValueError(f"batch: expected a multiple of the {self.replicas} replicas in examples, got {n}")
        return torch.arange(self.replicas).repeat_interleave(n // self.replicas)

    def encode(self, words: Tensor, k: int, weights: Tensor | None = None) -> Tensor:
        """``words [N, ..., J]`` (replica-major rows) → position-encoded bag of words ``[N, ..., dim]``
        with each row's replica's ``E_k`` (``weights``: their :func:`position_encoding`, when already computed)."""
        weights = position_encoding(words, self.dim) if weights is None else weights
        table = self.embeddings[:, k]  # [R, V+1, D]
        offset = self.replica_of_rows(words.shape[0]) * table.shape[1]
        ids = words + offset.view(-1, *[1] * (words.dim() - 1))
        return (weights * nn.functional.embedding(ids, table.flatten(0, 1))).sum(-2)

    def forward(self, batch: Batch) -> tuple[Tensor, AttentionOutput]:
        """Answer scores ``[N, V+1]`` (index 0, padding, included) and the attention output."""
        B, M, _ = batch.stories.shape
        R = self.replicas
        if self.training and self.random_noise > 0:
            recency = noisy_recency(batch.lengths, M, self.random_noise)
        else:
            recency = (batch.lengths.unsqueeze(-1) - 1 - torch.arange(M)).clamp_min(0)  # [B, M]: 0 = newest fact
        weights = position_encoding(batch.stories, self.dim)
        rows = self.replica_of_rows(B).unsqueeze(-1)
        memories = torch.stack([self.encode(batch.stories, k, weights) + self.temporal[rows, k, recency]
                                for k in range(self.hops + 1)], 1)
        inputs, outputs = memories[:, :-1], memories[:, 1:]  # [B, K, M, dim]
        query = self.encode(batch.queries, 0)
        if self.kind == "memn2n":
            out = self.attention(inputs, outputs, query, batch.lengths)
            final = query + out.context
        else:
            queries = [query]
            for _ in range(self.hops - 1):
                queries.append((queries[-1].view(R, B // R, -1) @ self.query_map.transpose(-1, -2)).view(B, -1))
            out = self.attention(inputs, outputs, torch.stack(queries, 1), batch.lengths)
            final = queries[-1] + out.context
        logits = final.view(R, B // R, -1) @ self.embeddings[:, self.hops].transpose(-1, -2)
        return logits.view(B, -1), out

    def selected_facts(self, out: AttentionOutput) -> Tensor:
        """``[N, K]``: MemN2N's argmax per hop, or the CRF's decoded hop chain."""
        return out.attention.argmax(-1) if out.distribution is None else out.distribution.decode()

    @torch.no_grad()
    def clip_grad_norms_(self, max_norm: float) -> None:
        """Renormalize each replica's gradient above norm ``max_norm``, as
        :func:`torch.nn.utils.clip_grad_norm_` does for a model of its own."""
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        norms = torch.stack([g.pow(2).flatten(1).sum(1) for g in grads]).sum(0).sqrt()  # [R]
        scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale.view(-1, *[1] * (g.dim() - 1)))


def build_model(kind: str, task: Task, hops: int | None = None, dim: int = 20, link: str = "outputs",
                random_noise: float = 0.0, init_std: float = 0.1) -> BabiModel:
    """A fresh :class:`BabiModel` for ``task`` (``hops`` defaults to the paper's K; ``link``: the
    binary CRF's link term, :class:`~structures.nn.HopAttention`; ``random_noise``: the fraction
    of :func:`noisy_recency`; ``init_std``: the standard deviation of the embeddings' normal initialization)."""
    return BabiModel(kind, len(task.vocab), hops or hops_for(task.number), dim, task.train.stories.shape[1], link,
                     random_noise, init_std=init_std)


def train_epoch(model: BabiModel, data: Batch, optimizer: torch.optim.Optimizer, batch_size: int = 32,
                max_norm: float = 40.0, generators: list[torch.Generator] | None = None) -> Tensor:
    """One pass of SGD over ``data`` in shuffled minibatches for each replica, its own order from
    its generator (loss summed over each batch, as in MemN2N; each replica's gradient renormalized
    above ``max_norm``). Returns the mean loss per question ``[R]``."""
    model.train()
    R = model.replicas
    generators = generators or [None] * R
    orders = torch.stack([torch.randperm(len(data), generator=g) for g in generators])  # [R, N]
    total = torch.zeros(R)
    for index in orders.split(batch_size, dim=1):
        batch = data.select(index.flatten())
        logits, _ = model(batch)
        losses = nn.functional.cross_entropy(logits, batch.answers, reduction="none").view(R, -1).sum(1)
        optimizer.zero_grad()
        losses.sum().backward()
        model.clip_grad_norms_(max_norm)
        optimizer.step()
        total += losses.detach()
    return total / len(data)


def fact_sequence_correct(selected: Tensor, support: Tensor) -> Tensor:
    """``[N]`` bool: the selected facts ``[N, K]`` are exactly the supporting facts ``[N, S]``
    (-1 padded) in order (a question with a different number of supporting facts than K never is)."""
    width = max(selected.shape[1], support.shape[1])
    pad = lambda t: nn.functional.pad(t, (0, width - t.shape[1]), value=-1)  # noqa: E731
    return (pad(selected) == pad(support)).all(-1) & (support.max(-1).values >= 0)


@torch.no_grad()
def evaluate(model: BabiModel, data: Batch, batch_size: int = 256) -> dict[str, Tensor]:
    """``{"loss", "answer", "fact"}``, each ``[R]``: every replica's mean loss, answer accuracy and
    supporting-fact sequence accuracy (%) on all of ``data``; ``"answer_each"``, ``"fact_each"``
    ``[R, N]`` bool: each question's (for paired comparisons)."""
    model.eval()
    R = model.replicas
    loss, answers, facts = torch.zeros(R), [], []
    per_replica = lambda t: t.view(R, -1)  # noqa: E731
    for index in torch.arange(len(data)).split(batch_size):
        batch = data.select(index.repeat(R))
        logits, out = model(batch)
        loss += per_replica(nn.functional.cross_entropy(logits, batch.answers, reduction="none")).sum(1)
        answers.append(per_replica(logits.argmax(-1) == batch.answers))
        facts.append(per_replica(fact_sequence_correct(model.selected_facts(out), batch.support)))
    answer, fact = torch.cat(answers, 1), torch.cat(facts, 1)
    n = len(data)
    return {"loss": loss / n, "answer": 100 * answer.float().sum(1) / n, "fact": 100 * fact.float().sum(1) / n,
            "answer_each": answer, "fact_each": fact}


SELECT_EPOCH = ("last", "softmax", "any")


@dataclass
class RunConfig:
    epochs: int = 100
    linear_start: int = 20
    lr: float = 0.01
    decay_every: int = 25
    batch_size: int = 32
    dim: int = 20
    link: str = "outputs"
    random_noise: float = 0.0
    init_std: float = 0.1
    linear_start_patience: int = 0  # > 0: leave the linear start after this many epochs without a lower validation loss
    unlink_after: int | None = None  # the binary CRF's hops independent (no repeats) after this many epochs
    select_epoch: str = "last"  # one of SELECT_EPOCH: the last epoch, the best after the linear start, the best of all


def train_runs(kind: str, task: Task, seeds: list[int], config: RunConfig) -> list[tuple[BabiModel, dict]]:
    """Train one model from each of ``seeds``, side by side as the replicas of one
    :class:`BabiModel`; return each with its validation/test metrics, wall time (the group's,
    divided among its runs) and the 1-minute load average at its end (the machine is shared).

    Replica ``r`` starts from the parameters ``build_model`` draws after ``torch.manual_seed(seeds[r])``
    and visits the questions in the order of a generator seeded with ``seeds[r]``; the random noise
    comes from the global RNG. ``config.select_epoch`` ``"last"`` returns the model after the last
    epoch; ``"softmax"`` the one after the epoch with the best validation answer accuracy (the first
    of equals) among the epochs after the linear start; ``"any"`` among all epochs, a linear-start
    model kept linear, as Kim et al.'s ``train-qa.lua`` keeps its best held-out model from the first
    epoch on. ``epoch`` (1-based) says which, ``linear`` whether it is a linear-start model.

    ``config.linear_start`` is the number of linear-start epochs; with ``config.linear_start_patience``
    ``P > 0`` it is at most that: the linear start ends after ``P`` epochs in a row whose validation
    loss is not below the best before them. ``P = 1`` is Sukhbaatar et al.'s rule read literally
    (§4.2: "when the validation loss stopped decreasing, the softmax layers were re-inserted"; their
    code runs a fixed 20 epochs). Each run then leaves it at its own epoch, so the runs are trained
    one at a time (one seed).

    ``config.unlink_after = N`` (binary CRF only) trains the pairwise chain for ``N`` epochs and
    from then on its hops without the link term, ``θ(i, j) = s_1(i) + s_2(j)``, ``-inf`` for
    ``i = j`` (``HopAttention("unary", no_repeat=True)``): what Kim et al.'s ``train-qa.lua`` trains
    after its epoch-20 ``LogSoftMax`` zeroes the pairwise term (docs/babi.md). ``unlinked`` says
    whether the kept model is such a one."""
    if config.select_epoch not in SELECT_EPOCH:
        raise ValueError(f"select_epoch: expected one of {SELECT_EPOCH}, got {config.select_epoch!r}")
    if config.unlink_after is not None and kind != "binary":
        raise ValueError(f"unlink_after: only the binary CRF has a link term, got {kind!r}")
    if config.linear_start_patience and len(seeds) != 1:
        raise ValueError(f"seeds: linear_start_patience trains one run at a time, got {len(seeds)} seeds")
    start = time.perf_counter()
    singles = []
    for seed in seeds:
        torch.manual_seed(seed)
        singles.append(build_model(kind, task, dim=config.dim, link=config.link, random_noise=config.random_noise,
                                   init_std=config.init_std))
    model = BabiModel.stack(singles)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    R = len(seeds)
    best_score, best_epoch = torch.full((R,), -1.0), torch.full((R,), config.epochs)
    best_linear, best_state = torch.zeros(R, dtype=torch.bool), copy.deepcopy(model.state_dict())
    linear_epochs, linear_loss, stalled = config.linear_start, math.inf, 0
    for epoch in range(config.epochs):
        model.linear = epoch < linear_epochs
        if config.unlink_after is not None:
            model.attention.kind = "unary" if epoch >= config.unlink_after else "binary"
        for group in optimizer.param_groups:
            group["lr"] = config.lr / 2 ** (epoch // config.decay_every)
        train_loss = train_epoch(model, task.train, optimizer, config.batch_size, generators=generators)
        valid = None
        if config.linear_start_patience and model.linear:
            valid = evaluate(model, task.valid)
            stalled = 0 if valid["loss"].item() < linear_loss else stalled + 1
            linear_loss = min(linear_loss, valid["loss"].item())
            if stalled == config.linear_start_patience:
                linear_epochs = epoch + 1
        if config.select_epoch == "any" or (config.select_epoch == "softmax" and not model.linear):
            score = (evaluate(model, task.valid) if valid is None else valid)["answer"]
            better = score > best_score
            for name, value in model.state_dict().items():
                best_state[name][better] = value[better]
            best_score, best_epoch[better], best_linear[better] = score.where(better, best_score), epoch + 1, model.linear
    kept = best_score >= 0  # replicas that kept a best epoch; the others keep their last
    current = model.state_dict()
    model.load_state_dict({name: best_state[name].where(kept.view(-1, *[1] * (value.dim() - 1)), value)
                           for name, value in current.items()})
    seconds = (time.perf_counter() - start) / R
    runs = []
    for r, seed in enumerate(seeds):
        single = model.replica(r)
        single.linear = bool(best_linear[r])
        unlinked = config.unlink_after is not None and int(best_epoch[r]) > config.unlink_after
        if unlinked:
            single.attention.kind = "unary"
        valid, test = evaluate(single, task.valid), evaluate(single, task.test)
        result = {"seed": seed, "train_loss": train_loss[r].item(), "linear_epochs": linear_epochs, "valid_answer": valid["answer"].item(),
                  "valid_loss": valid["loss"].item(), "test_answer": test["answer"].item(), "test_fact": test["fact"].item(),
                  "epoch": int(best_epoch[r]), "linear": single.linear, "unlinked": unlinked, "replicas": R, "seconds": seconds,
                  "load": os.getloadavg()[0]}
        if not math.isfinite(result["train_loss"]):
            result["valid_answer"] = -1.0  # a diverged run is never the best one
        runs.append((single, result))
    return runs


def validation_rank(run: dict) -> tuple[float, float]:
    """How runs are ranked to report one: validation answer accuracy, then the lower loss."""
    return run["valid_answer"], -run["valid_loss"]


def summarize(task: int, kind: str, runs: list[dict]) -> dict:
    """The table row: the best run on validation answer accuracy (then loss), means over runs, and
    ``top_half_test_fact``, the mean test fact accuracy of the better half of the runs by validation
    (Kim et al.'s Table 4 fact score: the 10 best of 20)."""
    ranked = sorted(runs, key=validation_rank, reverse=True)
    best, top_half = ranked[0], ranked[:max(1, len(ranked) // 2)]
    paper_answer, paper_fact = paper(task, kind)
    mean = lambda key, rs=runs: sum(r[key] for r in rs) / len(rs)  # noqa: E731
    return {"task": task, "K": hops_for(task), "model": kind, "runs": len(runs), "best_seed": best["seed"],
            "valid_answer": best["valid_answer"], "test_answer": best["test_answer"], "test_fact": best["test_fact"],
            "top_half_test_fact": mean("test_fact", top_half),
            "mean_test_answer": mean("test_answer"), "mean_test_fact": mean("test_fact"),
            "paper_answer": paper_answer, "paper_fact": paper_fact, "seconds": sum(r["seconds"] for r in runs)}


def average_rows(rows: list[dict], models: list[str]) -> list[dict]:
    """One row per model averaging the per-task rows (the paper's averages where the task set is theirs)."""
    averages = []
    for kind in models:
        mine = [r for r in rows if r["model"] == kind]
        if not mine:
            continue
        avg = lambda key: sum(r[key] for r in mine) / len(mine)  # noqa: E731
        paper_rows = [r for r in mine if r["paper_fact"] is not None]
        paper_mean = lambda key: sum(r[key] for r in paper_rows) / len(paper_rows) if len(paper_rows) == len(mine) else None  # noqa: E731
        averages.append({"task": "average", "K": "", "model": kind, "runs": sum(r["runs"] for r in mine), "best_seed": "",
                         "valid_answer": avg("valid_answer"), "test_answer": avg("test_answer"), "test_fact": avg("test_fact"),
                         "top_half_test_fact": avg("top_half_test_fact"),
                         "mean_test_answer": avg("mean_test_answer"), "mean_test_fact": avg("mean_test_fact"),
                         "paper_answer": paper_mean("paper_answer"), "paper_fact": paper_mean("paper_fact"),
                         "seconds": sum(r["seconds"] for r in mine)})
    return averages


COLUMNS = ["task", "K", "model", "runs", "best_seed", "valid_answer", "test_answer", "test_fact",
           "top_half_test_fact", "mean_test_answer", "mean_test_fact", "paper_answer", "paper_fact", "seconds"]


def _fmt(value) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def write_tables(rows: list[dict], out: Path, command: str, seeds: Sequence[int]) -> None:
    """``babi.csv`` and ``babi.md`` under ``out``; ``seeds``: the runs' seeds so far."""
    run = provenance(seeds)
    with open(out / "babi.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS + list(run))
        writer.writeheader()
        writer.writerows({**{k: ("" if r[k] is None else r[k]) for k in COLUMNS}, **run} for r in rows)
    header = ["task", "K", "model", "runs", "best seed", "valid ans %", "test ans %", "test fact %",
              "top-half fact %", "mean ans %", "mean fact %", "paper ans %", "paper fact %", "wall s"]
    lines = [f"`{command}`", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [_fmt(r[k]) for k in COLUMNS]
        cells[2] = LABELS[r["model"]]
        lines.append("| " + " | ".join(cells) + " |")
    (out / "babi.md").write_text("\n".join(lines) + "\n\n" + provenance_line(seeds))


def write_runs(run_rows: list[dict], path: Path) -> None:
    """Every run's metrics (``babi_runs.csv``)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, list(run_rows[0]))
        writer.writeheader()
        writer.writerows(run_rows)


def write_questions(best: dict[tuple[int, str], tuple[tuple, BabiModel, dict]], tasks: dict[int, Task], path: Path) -> None:
    """Each test question's answer and fact correctness (0/1) under the run reported for each task
    and model (``babi_questions.csv``): two runs' files give a paired bootstrap over the questions
    (``python -m structures.experiments.significance questions``)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["task", "model", "seed", "question", "answer_correct", "fact_correct"])
        for (task_number, kind), (_, model, result) in sorted(best.items()):
            test = evaluate(model, tasks[task_number].test)
            for q, (a, c) in enumerate(zip(test["answer_each"][0].tolist(), test["fact_each"][0].tolist())):
                writer.writerow([task_number, kind, result["seed"], q, int(a), int(c)])


def plot_tasks(rows: list[dict], path: Path) -> None:
    """Per-task bars of test answer and fact accuracy per model, the paper's values as black ticks."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in rows if r["task"] != "average"}, key=int)
    models = [m for m in MODELS if any(r["model"] == m for r in rows)]
    fig, axes = plt.subplots(2, 1, figsize=(max(6, 1.1 * len(tasks) + 2), 5.5), sharex=True)
    width = 0.8 / len(models)
    for ax, (key, paper_key, title) in zip(axes, [("test_answer", "paper_answer", "answer accuracy %"),
                                                  ("test_fact", "paper_fact", "supporting-fact sequence accuracy %")]):
        for m_i, kind in enumerate(models):
            xs, ys, ps = [], [], []
            for t_i, task in enumerate(tasks):
                row = next((r for r in rows if r["task"] == task and r["model"] == kind), None)
                if row is None:
                    continue
                x = t_i + (m_i - (len(models) - 1) / 2) * width
                xs.append(x), ys.append(row[key]), ps.append(row[paper_key])
            ax.bar(xs, ys, width, label=LABELS[kind], color=f"C{m_i}")
            px = [x for x, p in zip(xs, ps) if p is not None]
            ax.scatter(px, [p for p in ps if p is not None], marker="_", color="black", s=120, zorder=3,
                       label="paper" if m_i == 0 else None)
        ax.set_ylabel(title, fontsize=8)
        ax.set_ylim(0, 105)
    axes[0].legend(fontsize=7, ncol=len(models) + 1, loc="lower left")
    axes[1].set_xticks(range(len(tasks)), [f"{t}" for t in tasks])
    axes[1].set_xlabel("bAbI task (1K)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


@torch.no_grad()
def plot_hops(model: BabiModel, task: Task, path: Path, index: int | None = None) -> int:
    """Heatmap of one test story's hop marginals p(z_k = i) (facts × hops), fact texts on the left,
    supporting facts marked; like Kim et al.'s Figure 5. Picks the first correctly answered test
    question whose supporting facts the model decodes exactly, unless ``index`` is given. Returns it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model.eval()
    logits, out = model(task.test)
    chosen = model.selected_facts(out)
    if index is None:
        good = (logits.argmax(-1) == task.test.answers) & fact_sequence_correct(chosen, task.test.support)
        readable = good & (task.test.lengths <= 12)  # the longest story still short enough to read
        index = int((task.test.lengths * readable).argmax()) if readable.any() else 0
    example = task.test_text[index]
    n = len(example.memory)
    marginals = out.attention[index, :, :n].T.numpy()  # [facts, hops]
    labels = [f"{i + 1}. {' '.join(s)}" for i, s in enumerate(example.memory)]
    fig, ax = plt.subplots(figsize=(1.2 * model.hops + 1, 0.32 * n + 1.4))
    ax.imshow(marginals, cmap="Blues", vmin=0, vmax=1, aspect="auto")
    ax.set_yticks(range(n), labels, fontsize=7)
    ax.set_xticks(range(model.hops), [f"hop {k + 1}" for k in range(model.hops)], fontsize=7)
    for k, f in enumerate(example.support[: model.hops]):
        if f >= 0:
            ax.add_patch(plt.Rectangle((k - 0.5, f - 0.5), 1, 1, fill=False, edgecolor="red", lw=1.5))
    for k, f in enumerate(chosen[index].tolist()):
        ax.text(k, f, f"{marginals[f, k]:.2f}", ha="center", va="center", fontsize=6, color="orange")
    ax.set_title(f"task {task.number}, {LABELS[model.kind]}: {' '.join(example.question)}? {example.answer}\n"
                 "(red boxes: supporting facts; numbers: p(z_k = i) of the decoded chain)", fontsize=7)
    fig.savefig(path, dpi=90, bbox_inches="tight")  # the canvas grows to the fact texts and the title
    plt.close(fig)
    return index


def main(argv: list[str] | None = None) -> list[dict]:
    parser = command_line("babi", __doc__)
    parser.add_argument("--data-dir", type=Path, default=default_data_dir(),
                        help="the shared data sets (default: $STRUCTURES_DATA_DIR, else ../shared/data beside the checkout)")
    parser.add_argument("--tasks", type=int, nargs="+", default=list(DEFAULT_TASKS))
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--linear-start", type=int, default=20,
                        help="epochs of linear start: MemN2N without softmax, the CRFs' greedy linear hops")
    parser.add_argument("--linear-start-patience", type=int, default=0, metavar="P",
                        help="end each run's linear start after P epochs without a lower validation loss (1: Sukhbaatar et al. "
                             "2015, section 4.2, 'when the validation loss stopped decreasing'), after at most --linear-start "
                             "epochs; needs --parallel 1 (default 0: always --linear-start epochs)")
    parser.add_argument("--decay-every", type=int, default=25, help="epochs between halvings of the learning rate")
    parser.add_argument("--link", choices=("outputs", "inputs", "both"), default="outputs",
                        help="the binary CRF's link between hops: o^k_i . x^{k+1}_j (default), A.4's printed x^k_i . x^{k+1}_j, "
                             "or their sum")
    parser.add_argument("--unlink-after", type=int, metavar="N",
                        help="binary CRF: after N epochs drop the link term, leaving independent hops that may not repeat a "
                             "fact (what Kim et al.'s train-qa.lua trains after its epoch-20 LogSoftMax; default: never)")
    parser.add_argument("--split", choices=("last", "random"), default="last",
                        help="validation questions: the training file's last 10%% (default; Sukhbaatar et al.'s and Kim et al.'s code) "
                             "or a seeded random 10%% (before 2026-11-26; shares stories, even identical questions, with training)")
    parser.add_argument("--random-noise", type=float, default=0.0, metavar="FRACTION",
                        help="Sukhbaatar et al.'s random noise while training: up to FRACTION x n empty memories among n (reference: 0.1)")
    parser.add_argument("--select-epoch", nargs="?", choices=SELECT_EPOCH, default="last", const="softmax",
                        help="keep each run's model after its best epoch on validation: among the epochs after the linear start "
                             "(softmax, the default without a value) or all of them, a linear-start model kept linear (any: "
                             "Kim et al.'s code); default: the last epoch")
    parser.add_argument("--init-std", type=float, default=0.1,
                        help="standard deviation of the embeddings' normal initialization (0.1: Sukhbaatar et al.; "
                             "Kim et al.'s train-qa.lua draws every parameter with 1/sqrt(10) = 0.316)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="questions per SGD step, loss summed (32: A.4 and Sukhbaatar et al.; 1: Kim et al.'s train-qa.lua)")
    parser.add_argument("--runs", type=int, default=1, help="initializations per task and model; the best on validation is reported")
    parser.add_argument("--parallel", type=int, default=1, metavar="N",
                        help="train N initializations at once, as the replicas of one batched model (same results as one at a "
                             "time but for the random noise's draws; about N times faster at --batch-size 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="one task, 200 questions, 3 epochs (seconds)")
    parser.add_argument("--plot-task", type=int, default=16, help="the task whose binary CRF story is drawn (default 16, as Fig. 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    parser.add_argument("--out", type=Path, default=Path("results") / "babi")
    args = parser.parse_args(argv)
    one_hop = [t for t in args.tasks if hops_for(t) < 2]
    if args.parallel < 1:
        parser.error(f"--parallel: expected at least 1, got {args.parallel}")
    if args.linear_start_patience < 0:
        parser.error(f"--linear-start-patience: expected at least 0, got {args.linear_start_patience}")
    if args.linear_start_patience and args.parallel != 1:
        parser.error("--linear-start-patience: each run leaves the linear start at its own epoch; needs --parallel 1")
    if args.unlink_after is not None and args.models != ["binary"]:
        parser.error("--unlink-after: only the binary CRF has a link term (--models binary)")
    if "binary" in args.models and one_hop:
        parser.error(f"--models binary: the binary hop chain needs K >= 2 hops; tasks {one_hop} have one (use memn2n or unary)")
    torch.set_num_threads(args.threads)
    limit = None
    if args.quick:
        args.tasks, args.epochs, args.linear_start, args.runs, limit = args.tasks[:1], 3, 1, 1, 200
    config = RunConfig(epochs=args.epochs, linear_start=args.linear_start, decay_every=args.decay_every, link=args.link,
                       random_noise=args.random_noise, select_epoch=args.select_epoch, batch_size=args.batch_size,
                       init_std=args.init_std, linear_start_patience=args.linear_start_patience, unlink_after=args.unlink_after)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python -m structures.experiments.babi " + " ".join(argv if argv is not None else __import__("sys").argv[1:])
    plot_kind = "binary" if "binary" in args.models else args.models[0]
    plot_task = args.plot_task if args.plot_task in args.tasks else args.tasks[0]
    tasks = {t: load_task(t, args.data_dir, seed=args.seed, limit=limit, split=args.split) for t in args.tasks}
    runs: dict[tuple[int, str], list[dict]] = {}
    best: dict[tuple[int, str], tuple[tuple, BabiModel, dict]] = {}  # the reported run so far: its ranking key, model, row
    run_rows, plot_best = [], None
    bar = Progress(total=len(args.tasks) * len(args.models) * args.runs, desc="babi")
    # seeds outermost: after each group every task and model has more runs, and the tables (written
    # after every group) hold the best so far, so that a run cut short still covers every task
    for first in range(args.seed, args.seed + args.runs, args.parallel):
        seeds = list(range(first, min(first + args.parallel, args.seed + args.runs)))
        for task_number, task in tasks.items():
            for kind in args.models:
                for model, result in train_runs(kind, task, seeds, config):
                    runs.setdefault((task_number, kind), []).append(result)
                    run_rows.append({"task": task_number, "model": kind, **result})
                    rank = validation_rank(result)
                    if (task_number, kind) not in best or rank > best[task_number, kind][0]:
                        best[task_number, kind] = (rank, model, result)
                    if (task_number, kind) == (plot_task, plot_kind) and (plot_best is None or rank > plot_best):
                        plot_best = rank
                        plot_hops(model, task, args.out / "babi_hops.png")
                    report(bar, f"task {task_number} {kind} seed {result['seed']}", ans=f"{result['test_answer']:.1f}", fact=f"{result['test_fact']:.1f}")
                    bar.update()
                rows = [summarize(t, m, r) for (t, m), r in runs.items()]
                write_tables(rows + average_rows(rows, args.models), args.out, command, range(args.seed, seeds[-1] + 1))
                write_runs(run_rows, args.out / "babi_runs.csv")
                write_questions(best, tasks, args.out / "babi_questions.csv")
            plot_tasks(rows, args.out / "babi_tasks.png")
    bar.close()
    rows += average_rows(rows, args.models)
    print((args.out / "babi.md").read_text())
    return rows


if __name__ == "__main__":
    main()
