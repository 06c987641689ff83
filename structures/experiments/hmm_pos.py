"""Unsupervised part-of-speech induction: a 45-state HMM trained by EM on UD English EWT.

Words are lowercased and every word type is kept (no unknown-word class, no other preprocessing).
As in Johnson (2007), who trains and evaluates on the whole WSJ, the model is trained and evaluated on
the same sentences: the dev and test files of EWT, the only ones here (4,078 sentences, 50,241 words).
EM starts from near-uniform random parameters (each distribution proportional to ``1 + u``,
``u ~ U(0, 1)``) with no smoothing (``--smoothing`` adds pseudo-counts). The induced tags of Viterbi
and of posterior decoding are scored against the gold UPOS tags (17) by many-to-one accuracy and
V-measure. hmmlearn's ``CategoricalHMM``, started from the same parameters on the same sequences in
the same process, is the speed anchor (time per EM iteration, 1 thread; its log-likelihoods are
checked against ours); without hmmlearn the comparison is skipped.

    python -m structures.experiments.hmm_pos --iterations 300
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from structures.hmm import Batch, HMMParameters, batches, em_step, fit

from .clustering import many_to_one, v_measure
from .provenance import provenance
from . import command_line, default_data_dir
from .ud import TREEBANKS, Sentence, read_conllu


def encode(sentences: Sequence[Sentence]) -> tuple[list[list[int]], dict[str, int]]:
    """Word ids of the lowercased words of every sentence, and the vocabulary (in order of first use)."""
    vocabulary: dict[str, int] = {}
    return [[vocabulary.setdefault(w.lower(), len(vocabulary)) for w in s.words] for s in sentences], vocabulary


def tag(params: HMMParameters, data: Sequence[Batch], count: int, how: str) -> list[list[int]]:
    """The induced tags of every sequence (in input order) by ``viterbi`` or ``posterior`` decoding."""
    out: list[list[int]] = [[] for _ in range(count)]
    with torch.no_grad():
        for batch in data:
            hmm = params.posterior(batch.words, batch.lengths)
            states = hmm.decode() if how == "viterbi" else hmm.posterior_decode()
            for i, z, n in zip(batch.index.tolist(), states.tolist(), batch.lengths.tolist()):
                out[i] = z[:n]
    return out


def score(tags: Sequence[Sequence[int]], sentences: Sequence[Sentence]) -> dict[str, float]:
    predicted = [t for s in tags for t in s]
    gold = [u for s in sentences for u in s.upos]
    h, c, v = v_measure(predicted, gold)
    return {"many_to_one": many_to_one(predicted, gold), "v_measure": v, "homogeneity": h, "completeness": c}


def side_by_side(params: HMMParameters, data: Sequence[Batch], sequences: Sequence[Sequence[int]], iterations: int,
                 implementation: str) -> dict | None:
    """EM steps of ours and of hmmlearn's ``CategoricalHMM`` (``implementation`` "log" or "scaling")
    from the same parameters on the same sequences, one of each in turn so that both meet the same
    machine load: the median seconds per iteration of each, and how far the log-likelihoods differ
    (relative); ``None`` without hmmlearn."""
    try:
        from hmmlearn.base import ConvergenceMonitor
        from hmmlearn.hmm import CategoricalHMM
    except ImportError:
        return None

    class Timed(ConvergenceMonitor):  # the time of the EM loop alone, without fit's input checks
        def _reset(self):
            super()._reset()
            self.stamps = [time.perf_counter()]

        def report(self, log_prob):
            super().report(log_prob)
            self.stamps.append(time.perf_counter())

    logging.getLogger("hmmlearn").setLevel(logging.ERROR)  # warns of degenerate solutions and zero rows, as EM makes them
    C, V = params.emission.shape
    model = CategoricalHMM(n_components=C, n_features=V, n_iter=1, tol=-np.inf, init_params="", implementation=implementation)
    model.startprob_, model.transmat_, model.emissionprob_ = (t.double().exp().cpu().numpy() for t in
                                                              (params.start, params.transitions, params.emission))
    model.monitor_ = Timed(model.tol, model.n_iter, model.verbose)
    X, lengths = np.concatenate(sequences)[:, None], [len(s) for s in sequences]
    ours, theirs, difference = [], [], 0.0
    for _ in range(iterations):
        start = time.perf_counter()
        params, ll = em_step(params, data)
        ours.append(time.perf_counter() - start)
        with np.errstate(divide="ignore"):  # log 0 = -inf for the events EM gives up
            model.fit(X, lengths)  # one iteration, from where the last one left off
        theirs.append(model.monitor_.stamps[1] - model.monitor_.stamps[0])
        difference = max(difference, abs(ll - model.monitor_.history[-1]) / abs(ll))
    return {"seconds_per_iteration": statistics.median(theirs), "ours_seconds_per_iteration": statistics.median(ours),
            "ours_faster": statistics.median(theirs) / statistics.median(ours),
            "max_relative_log_likelihood_difference": difference}


def draw(curve: list[dict], tokens: int, path: Path, title: str) -> None:
    """The log-likelihood per word against the iteration, with the many-to-one accuracy at checkpoints."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot([c["iteration"] for c in curve], [c["log_likelihood"] / tokens for c in curve], color="C0")
    ax.set_xlabel("EM iteration")
    ax.set_ylabel("log-likelihood per word", color="C0")
    marks = [c for c in curve if "many_to_one" in c]
    right = ax.twinx()
    right.plot([c["iteration"] for c in marks], [c["many_to_one"] for c in marks], "o-", color="C1", markersize=3)
    right.set_ylabel("many-to-one accuracy (Viterbi)", color="C1")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict:
    p = command_line("hmm_pos", __doc__)
    p.add_argument("--states", type=int, default=45)
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--smoothing", type=float, default=0.0, help="pseudo-count added to every expected count")
    p.add_argument("--batch-size", type=int, default=256, help="sentences per batch (sorted by length)")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--eval-every", type=int, default=10, help="many-to-one accuracy every this many iterations")
    p.add_argument("--peer-iterations", type=int, default=10, help="EM iterations timed side by side with hmmlearn, per implementation (0: none)")
    p.add_argument("--quick", action="store_true", help="200 sentences, 5 iterations (seconds)")
    p.add_argument("--max-sentences", type=int, default=None, help="read at most this many sentences of each file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", type=Path, default=default_data_dir(),
                   help="the shared data sets (default: $STRUCTURES_DATA_DIR, else ../shared/data beside the checkout)")
    p.add_argument("--out", type=Path, default=Path("results/hmm_pos"))
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.quick:
        args.max_sentences, args.iterations, args.eval_every, args.peer_iterations = args.max_sentences or 100, 5, 2, 2
    torch.set_num_threads(args.threads)

    ud = args.data_dir / "ud"
    sentences = [s for f in TREEBANKS["ewt"] for s in read_conllu(ud / f, args.max_sentences)]
    sequences, vocabulary = encode(sentences)
    tokens = sum(map(len, sequences))
    data = batches(sequences, args.batch_size)
    params = HMMParameters.random(args.states, len(vocabulary), generator=torch.Generator().manual_seed(args.seed),
                                  dtype=getattr(torch, args.dtype))

    curve: list[dict] = []
    seconds: list[float] = []
    last = time.perf_counter()

    def record(it: int, new: HMMParameters, ll: float) -> None:
        nonlocal last
        seconds.append(time.perf_counter() - last)
        curve.append({"iteration": it, "log_likelihood": ll})
        if it % args.eval_every == 0:
            curve[-1]["many_to_one"] = score(tag(new, data, len(sequences), "viterbi"), sentences)["many_to_one"]
        last = time.perf_counter()

    start = params
    params, history = fit(params, data, args.iterations, args.smoothing, progress=True, callback=record)
    result = {
        "states": args.states, "sentences": len(sequences), "tokens": tokens, "vocabulary": len(vocabulary),
        "iterations": len(history), "smoothing": args.smoothing, "dtype": args.dtype, "batch_size": args.batch_size,
        "seed": args.seed, "log_likelihood": history, "seconds_per_iteration": statistics.median(seconds),
        **{k: {how: score(tag(params, data, len(sequences), how), sentences)[k] for how in ("viterbi", "posterior")}
           for k in ("many_to_one", "v_measure", "homogeneity", "completeness")},
        "curve": curve, "hmmlearn": {}, "run": provenance([args.seed]),
    }
    for implementation in ("log", "scaling") if args.peer_iterations else ():
        peer = side_by_side(start, data, sequences, args.peer_iterations, implementation)
        if peer is None:
            print("hmmlearn is not installed: no speed comparison (pip install hmmlearn, or the 'bench' extra)")
            break
        result["hmmlearn"][implementation] = peer

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hmm_pos.json").write_text(json.dumps(result, indent=1))
    draw(curve, tokens, args.out / "hmm_pos_log_likelihood.png",
         f"{args.states}-state HMM, EM on UD English EWT ({len(sequences)} sentences, {tokens} words)")
    print(summary(result))
    return result


def summary(r: dict) -> str:
    """A short text report of a run."""
    lines = [f"{r['states']} states, {r['sentences']} sentences, {r['tokens']} words, {r['vocabulary']} word types, "
             f"{r['iterations']} EM iterations ({r['dtype']}): log-likelihood per word "
             f"{r['log_likelihood'][0] / r['tokens']:.3f} -> {r['log_likelihood'][-1] / r['tokens']:.3f}"]
    for how in ("viterbi", "posterior"):
        lines.append(f"  {how:9s} many-to-one {r['many_to_one'][how]:.3f}  V-measure {r['v_measure'][how]:.3f} "
                     f"(h {r['homogeneity'][how]:.3f}, c {r['completeness'][how]:.3f})")
    lines.append(f"  seconds per EM iteration: ours {r['seconds_per_iteration']:.3f}")
    for name, peer in r["hmmlearn"].items():
        lines.append(f"  side by side: hmmlearn ({name}) {peer['seconds_per_iteration']:.3f}, ours {peer['ours_seconds_per_iteration']:.3f}: "
                     f"ours {peer['ours_faster']:.2f}x faster; "
                     f"log-likelihoods agree to {peer['max_relative_log_likelihood_difference']:.1e} (relative)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
