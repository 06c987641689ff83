"""docs/porting.md: its examples run against torch-struct and pytorch-crf and agree with them, and
the SuPar conversions its table gives hold."""

import re
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from structures import PCFG, ConstituencyCRF, NonProjectiveDependencyCRF, ProjectiveDependencyCRF, SecondOrderDependencyCRF, SemiMarkovCRF

DOC = Path(__file__).resolve().parents[1] / "docs" / "porting.md"
PEERS = {"torch-struct": "torch_struct", "pytorch-crf": "torchcrf"}


def examples() -> dict[str, str]:
    """The ```python block under each ``## `` heading of docs/porting.md."""
    out, heading = {}, ""
    for part in re.split(r"(^## [^\n]*$|^```python\n.*?^```$)", DOC.read_text(), flags=re.M | re.S):
        if part.startswith("## "):
            heading = part[3:].strip()
        elif part.startswith("```python"):
            out[heading] = part[len("```python\n"):-3]
    return out


def test_the_guide_has_an_example_per_peer():
    assert set(examples()) == {*PEERS, "Class by class"}  # (and the move-scored alignment, below)


def test_the_move_scored_alignment_the_guide_declares_sums_its_paths():
    """Its ``MoveAlignment`` against every monotone path enumerated: a path scores the move into
    each cell it enters after (0, 0) (0 from (i, j-1), 1 from (i-1, j-1), 2 from (i-1, j))."""
    import semiring
    from structures import StructuredDistribution

    scope = {"semiring": semiring, "StructuredDistribution": StructuredDistribution}
    exec(compile(examples()["Class by class"], str(DOC), "exec"), scope)
    move = torch.randn(2, 3, 4, 3, dtype=torch.float64)

    def paths(i, j):  # the scores of the paths from (0, 0) into (i, j)
        if (i, j) == (0, 0):
            yield torch.zeros((), dtype=torch.float64)
        for op, (a, b) in enumerate(((i, j - 1), (i - 1, j - 1), (i - 1, j))):
            if a >= 0 and b >= 0:
                yield from (s + move[:, i, j, op] for s in paths(a, b))

    expected = torch.logsumexp(torch.stack(list(paths(2, 3))), 0)
    assert_close(scope["MoveAlignment"](move).log_partition, expected)


@pytest.mark.parametrize("peer", sorted(PEERS))
def test_example_runs_and_agrees_with_the_peer(peer):
    pytest.importorskip(PEERS[peer])
    torch.manual_seed(0)
    exec(compile(examples()[peer], str(DOC), "exec"), {"__name__": "docs_porting"})


@pytest.mark.parametrize("multiroot", [None, True, False], ids=["default", "multiroot", "one root"])
@pytest.mark.parametrize("theirs, ours", [("DependencyCRF", ProjectiveDependencyCRF),
                                          ("NonProjectiveDependencyCRF", NonProjectiveDependencyCRF)], ids=["projective", "nonprojective"])
def test_from_torch_struct_keeps_torch_structs_root_default(theirs, ours, multiroot):
    """torch-struct's DependencyCRF lets the root take several children by default, its
    NonProjectiveDependencyCRF one: from_torch_struct follows each (log Z differs by ~1 otherwise).
    Its non-projective log Z adds a small constant to the Laplacian: it agrees to about 1e-4."""
    torch_struct = pytest.importorskip("torch_struct")
    arcs = torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    lengths = torch.tensor([6, 4])
    chosen = {} if multiroot is None else {"multiroot": multiroot}
    expected = getattr(torch_struct, theirs)(arcs.detach().requires_grad_() * 1, lengths=lengths, **chosen).partition
    assert_close(ours.from_torch_struct(arcs, lengths, **chosen).log_partition, expected.detach(), rtol=0, atol=1e-3)


def test_supar_layouts_convert_as_the_table_says():
    structs = pytest.importorskip("supar.structs")
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 3])
    scores = torch.randn(2, 6, 6, generator=g, dtype=torch.float64)  # SuPar: [b, dependent, head]
    for single_root in (True, False):  # SuPar's default is one root child (multiroot=False)
        theirs = structs.DependencyCRF(scores, lengths, multiroot=not single_root)
        ours = ProjectiveDependencyCRF(scores.transpose(1, 2), lengths, single_root=single_root)
        assert_close(ours.log_partition, theirs.log_partition)
    sibs = torch.randn(2, 6, 6, 6, generator=g, dtype=torch.float64)  # SuPar: [b, modifier, head, sibling]
    theirs = structs.Dependency2oCRF((scores, sibs), lengths)
    ours = SecondOrderDependencyCRF(scores.transpose(1, 2), sibs.permute(0, 2, 3, 1), lengths, single_root=True)
    assert_close(ours.log_partition, theirs.log_partition)
    spans = torch.randn(2, 6, 6, generator=g, dtype=torch.float64)  # SuPar: fenceposts, [i, j] covers i..j-1
    theirs = structs.ConstituencyCRF(spans, lengths)
    ours = ConstituencyCRF(spans[:, :-1, 1:, None], lengths)
    assert_close(ours.log_partition, theirs.log_partition)


def semimarkov_marginals_in_torch_structs_layout(ours, x: torch.Tensor) -> torch.Tensor:
    """Our marginals ``[B, j, k-1, y, c]`` as torch-struct's ``[B, start, k, c, y]``: a segment of
    length k ending at j starts at j-k+1; a first segment's previous label, given the segment, is
    distributed as the softmax of its scores over that label."""
    mu = ours.marginals
    B, N1, K, C, _ = x.shape
    out = torch.zeros_like(x)
    for j in range(N1):
        for k in range(1, min(K, j + 2)):
            start = j - k + 1
            if start > 0:
                out[:, start, k] = mu[:, j, k - 1].transpose(-1, -2)
            else:
                out[:, 0, k] = mu[:, j, k - 1, 0][:, :, None] * x[:, 0, k].softmax(-1)
    return out


def test_semimarkov_from_torch_struct_keeps_its_free_first_label():
    """log Z and marginals of torch-struct's SemiMarkovCRF, run example by example: torch-struct 0.5
    reads the shortest length of a batch for every example (a batch of lengths [6, 4] gives the
    6-fencepost example a wrong log Z), so a batch of mixed lengths is compared one example at a time."""
    torch_struct = pytest.importorskip("torch_struct")
    x = torch.randn(2, 5, 4, 3, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    lengths = torch.tensor([6, 4])
    ours = SemiMarkovCRF.from_torch_struct(x, lengths)
    mu = semimarkov_marginals_in_torch_structs_layout(ours, x)
    for b, n in enumerate(lengths.tolist()):
        theirs = torch_struct.SemiMarkovCRF(x[b:b + 1, :n - 1].detach().clone().requires_grad_(), lengths=lengths[b:b + 1])
        assert_close(ours.log_partition[b:b + 1], theirs.partition.detach())
        assert_close(mu[b:b + 1, :n - 1], theirs.marginals)
        assert (mu[b, n - 1:] == 0).all()


def test_a_one_word_sentence_has_no_tree_in_sentcfg_and_is_refused_by_pcfg():
    """The SentCFG row: torch-struct gives a length of 1 a log Z of its zero (about -1e5, no tree),
    without a word; PCFG refuses the length and says why."""
    torch_struct = pytest.importorskip("torch_struct")
    g = torch.Generator().manual_seed(0)
    terms, rules, roots = torch.randn(2, 3, 2, generator=g), torch.randn(2, 2, 4, 4, generator=g), torch.randn(2, 2, generator=g)
    lengths = torch.tensor([3, 1])
    theirs = torch_struct.SentCFG((terms, rules, roots), lengths=lengths).partition
    assert theirs[0] > -100 and theirs[1] < -1e4
    with pytest.raises(ValueError, match="lengths: .*a one-word sentence has no tree"):
        PCFG(terms, rules, roots, lengths)
