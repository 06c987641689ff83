"""The bAbI question answering tasks (Weston et al. 2015), v1.2, read into padded tensors.

A task file holds stories: numbered lines, statements (``1 Mary moved to the bathroom.``) and
questions (``7 Where is the football? \\tgarden\\t3 6``: question, answer, the line numbers of the
supporting facts). Each question becomes one example whose memory is the story's statements
before it (the last ``memory_size``, oldest first).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

TASK_NAMES = {
    1: "single-supporting-fact", 2: "two-supporting-facts", 3: "three-supporting-facts",
    4: "two-arg-relations", 5: "three-arg-relations", 6: "yes-no-questions", 7: "counting",
    8: "lists-sets", 9: "simple-negation", 10: "indefinite-knowledge", 11: "basic-coreference",
    12: "conjunction", 13: "compound-coreference", 14: "time-reasoning", 15: "basic-deduction",
    16: "basic-induction", 17: "positional-reasoning", 18: "size-reasoning", 19: "path-finding",
    20: "agents-motivations",
}


@dataclass
class Example:
    """One question: the memory (tokenized statements, oldest first), the question, the answer and
    the supporting facts as indices into the memory (-1 for a fact outside it)."""

    memory: list[list[str]]
    question: list[str]
    answer: str
    support: list[int]


@dataclass
class Batch:
    """Padded tensors of ``N`` examples with ``M`` memories of ``J`` words, word ids (0 = padding).

    ``stories [N, M, J]``, ``lengths [N]`` (memories per example, >= 1), ``queries [N, Jq]``,
    ``answers [N]``, ``support [N, S]`` (memory indices of the supporting facts in the order the
    data lists them, -1 padding; an index past the memory also reads -1).
    """

    stories: Tensor
    lengths: Tensor
    queries: Tensor
    answers: Tensor
    support: Tensor

    def __len__(self) -> int:
        return self.answers.shape[0]

    def select(self, index: Tensor) -> "Batch":
        """The examples at ``index`` (a long tensor or slice)."""
        return Batch(*(t[index] for t in (self.stories, self.lengths, self.queries, self.answers, self.support)))


def tokenize(text: str) -> list[str]:
    return re.findall(r"[a-z0-9,]+", text.lower())


def read_examples(path: Path, memory_size: int) -> list[Example]:
    """Every question of a bAbI task file as an :class:`Example` (memory: its last ``memory_size`` statements)."""
    examples: list[Example] = []
    story: list[tuple[int, list[str]]] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        number, text = line.split(" ", 1)
        if int(number) == 1:
            story = []
        if "\t" in text:
            question, answer, support = text.split("\t")
            memory = story[-memory_size:]
            where = {line_id: i for i, (line_id, _) in enumerate(memory)}
            facts = [where.get(int(s), -1) for s in support.split()]
            examples.append(Example([words for _, words in memory], tokenize(question), answer.strip().lower(), facts))
        else:
            story.append((int(number), tokenize(text)))
    return examples


def task_files(data_dir: Path, task: int) -> tuple[Path, Path]:
    """``(train, test)`` files of the 1K English task ``task`` under ``data_dir``."""
    folder = Path(data_dir) / "babi_tasks_1-20_v1-2" / "en"
    name = f"qa{task}_{TASK_NAMES[task]}"
    return folder / f"{name}_train.txt", folder / f"{name}_test.txt"


def build_vocab(*example_lists: list[Example]) -> dict[str, int]:
    """Word → id (0 is padding), over every word and answer of the examples, in a fixed order."""
    words = set()
    for examples in example_lists:
        for ex in examples:
            words.update(w for sentence in ex.memory for w in sentence)
            words.update(ex.question)
            words.add(ex.answer)
    return {w: i + 1 for i, w in enumerate(sorted(words))}


def to_batch(examples: list[Example], vocab: dict[str, int], memory_size: int) -> Batch:
    """Pad ``examples`` into a :class:`Batch` (``M = memory_size``)."""
    J = max(len(s) for ex in examples for s in ex.memory)
    Jq = max(len(ex.question) for ex in examples)
    S = max(len(ex.support) for ex in examples)
    N = len(examples)
    stories = torch.zeros(N, memory_size, J, dtype=torch.long)
    queries = torch.zeros(N, Jq, dtype=torch.long)
    support = torch.full((N, S), -1, dtype=torch.long)
    for n, ex in enumerate(examples):
        for m, sentence in enumerate(ex.memory):
            stories[n, m, : len(sentence)] = torch.tensor([vocab[w] for w in sentence])
        queries[n, : len(ex.question)] = torch.tensor([vocab[w] for w in ex.question])
        support[n, : len(ex.support)] = torch.tensor(ex.support)
    lengths = torch.tensor([len(ex.memory) for ex in examples])
    answers = torch.tensor([vocab[ex.answer] for ex in examples])
    return Batch(stories, lengths, queries, answers, support)
