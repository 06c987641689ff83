"""Data-parallel training of the transduction model on CPU processes (``torch.distributed``, gloo).

    python -m structures.experiments.distributed                 # 2 processes, 4 steps, float64
    python -m structures.experiments.distributed --steps 10 --dim 16

The structured encoder of :mod:`structures.experiments.transduction` (soft parents under a
projective dependency CRF, :class:`structures.nn.SyntacticAttention`) is trained for a few steps
with :class:`torch.nn.parallel.DistributedDataParallel` on ``world_size`` processes (spawned, gloo
backend, ``MASTER_ADDR=127.0.0.1`` and a free port), each rank taking its contiguous share of every
batch; then the same steps run in one process on the whole batches. Each rank's loss is the mean
over its share and the full-batch loss the mean over the batch, and DDP averages the ranks'
gradients, so with equal shares every update is the full-batch update: the parameters of every
rank must equal those of the single-process run (up to rounding).
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from . import command_line
from . import transduction as T


@dataclass(frozen=True)
class Config:
    """A tiny run: ``steps`` updates of Adam (``lr``) on batches of ``batch_size`` pairs (a multiple
    of ``world_size``), model dimension ``dim``, everything in ``dtype``, data and weights from ``seed``."""

    steps: int = 4
    batch_size: int = 8
    dim: int = 8
    lr: float = 0.01
    seed: int = 0
    world_size: int = 2
    dtype: torch.dtype = torch.float64


@dataclass
class Run:
    """What one process ends with: its loss at each step (on its share of the batch) and its
    parameters (``name -> tensor``, the module's names without DDP's ``module.`` prefix)."""

    losses: list[float]
    parameters: dict[str, torch.Tensor]


def training_batches(config: Config) -> list[T.Batch]:
    """``config.steps`` full batches of ``config.batch_size`` training pairs (depths 2-3), fixed by the seed."""
    if config.batch_size % config.world_size:
        raise ValueError(f"batch_size: expected a multiple of world_size = {config.world_size}, got {config.batch_size}")
    pairs_needed = 2 * config.steps * config.batch_size  # enough full batches whatever the length buckets
    data = T.make_data(pairs_needed // 2 + 1, 1, 1, train_depths=(2, 3), test_depths=(2,), seed=config.seed)
    full = [b for b in T.batches(data["train"], config.batch_size, random.Random(config.seed)) if len(b) == config.batch_size]
    if len(full) < config.steps:
        raise ValueError(f"steps: at most {len(full)} full batches of this size, got {config.steps}")
    return full[:config.steps]


def shard(batch: T.Batch, rank: int, world_size: int) -> T.Batch:
    """Rank ``rank``'s contiguous share of ``batch`` (its examples ``rank·B/W .. (rank+1)·B/W - 1``),
    padded as the whole batch is (padding does not change an example's loss)."""
    size = len(batch) // world_size
    rows = slice(rank * size, (rank + 1) * size)
    return T.Batch(batch.src[rows], batch.src_lengths[rows], batch.tgt_in[rows], batch.tgt_out[rows],
                   batch.tgt_lengths[rows], batch.depth[rows])


def _model_and_optimizer(config: Config):
    model = T.build_model("structured", config.dim, seed=config.seed).to(config.dtype)
    return model, torch.optim.Adam(model.parameters(), lr=config.lr)


def train_single(config: Config) -> Run:
    """The reference: the same steps in one process on the whole batches."""
    model, optimizer = _model_and_optimizer(config)
    losses = [T.train_step(model, batch, optimizer) for batch in training_batches(config)]
    return Run(losses, {k: v.detach().clone() for k, v in model.named_parameters()})


def _worker(rank: int, config: Config, out: str) -> None:
    """One process of :func:`train_data_parallel`: joins the group, trains, saves its :class:`Run`.
    One torch thread per process: the processes themselves are the parallelism."""
    torch.set_num_threads(1)
    try:
        # a bounded wait: a rank whose peer died raises instead of waiting in a collective for ever
        dist.init_process_group("gloo", rank=rank, world_size=config.world_size, timeout=timedelta(seconds=120))
        model, optimizer = _model_and_optimizer(config)
        ddp = DistributedDataParallel(model)  # averages the gradients of the ranks in backward
        losses = [T.train_step(ddp, shard(batch, rank, config.world_size), optimizer)
                  for batch in training_batches(config)]
        run = Run(losses, {k: v.detach().clone() for k, v in model.named_parameters()})
        torch.save({"losses": run.losses, "parameters": run.parameters}, Path(out) / f"rank{rank}.pt")
        dist.barrier()
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    # Leave without the interpreter's teardown: destroying DDP's reducer can deadlock inside torch
    # (ProcessGroupGloo's destructor joins its worker thread while holding the GIL that thread
    # waits for), which hung the test for ever now and then. Every rank has saved its run.
    os._exit(0)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_data_parallel(config: Config) -> list[Run]:
    """Train with DDP on ``config.world_size`` spawned processes (gloo, CPU); one :class:`Run` per rank."""
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this build of torch")
    training_batches(config)  # bad sizes fail here, not in every worker
    saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))  # inherited by the workers
    try:
        with tempfile.TemporaryDirectory() as out:
            mp.spawn(_worker, args=(config, out), nprocs=config.world_size, join=True)
            results = [torch.load(Path(out) / f"rank{r}.pt") for r in range(config.world_size)]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return [Run(r["losses"], r["parameters"]) for r in results]


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two sets of parameters with the same names."""
    if a.keys() != b.keys():
        raise ValueError(f"b: expected the parameters {sorted(a)}, got {sorted(b)}")
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def main(argv: Sequence[str] | None = None) -> tuple[list[Run], Run]:
    p = command_line("distributed", __doc__)
    p.add_argument("--steps", type=int, default=Config.steps)
    p.add_argument("--batch-size", type=int, default=Config.batch_size)
    p.add_argument("--dim", type=int, default=Config.dim)
    p.add_argument("--lr", type=float, default=Config.lr)
    p.add_argument("--seed", type=int, default=Config.seed)
    p.add_argument("--world-size", type=int, default=Config.world_size)
    p.add_argument("--float32", action="store_true", help="train in float32 (default float64)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the one-process run (default 1)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = Config(args.steps, args.batch_size, args.dim, args.lr, args.seed, args.world_size,
                    torch.float32 if args.float32 else torch.float64)
    ranks = train_data_parallel(config)
    single = train_single(config)
    print(f"{config.world_size} processes (gloo, CPU), {config.batch_size // config.world_size} examples each per step; "
          f"one process: {config.batch_size} per step")
    header = " | ".join(f"rank {r}" for r in range(len(ranks)))
    print(f"| step | {header} | mean of ranks | one process |")
    print("|---|" + "---|" * (len(ranks) + 2))
    for step in range(config.steps):
        losses = [run.losses[step] for run in ranks]
        print(f"| {step + 1} | " + " | ".join(f"{x:.6f}" for x in losses)
              + f" | {sum(losses) / len(losses):.6f} | {single.losses[step]:.6f} |")
    between = max(max_difference(ranks[0].parameters, run.parameters) for run in ranks[1:])
    to_single = max_difference(ranks[0].parameters, single.parameters)
    print(f"parameters after {config.steps} steps: ranks differ by at most {between:.3g}; "
          f"rank 0 differs from one-process training by at most {to_single:.3g}")
    return ranks, single


if __name__ == "__main__":
    main()
