"""Data-parallel training (DDP, gloo, 2 CPU processes) of the transduction model equals one-process training."""

import pytest
import torch
import torch.distributed as dist

from structures.experiments import distributed as D

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available in this torch build")


def test_two_gloo_processes_train_as_one_process_on_the_whole_batches():
    config = D.Config(steps=3, batch_size=8, dim=8, seed=1)
    ranks = D.train_data_parallel(config)
    single = D.train_single(config)
    assert len(ranks) == 2
    for run in ranks:
        assert len(run.losses) == 3
        assert all(p.dtype == torch.float64 for p in run.parameters.values())
    # DDP keeps the replicas identical: the same averaged gradient, the same update
    assert D.max_difference(ranks[0].parameters, ranks[1].parameters) == 0
    # each rank's loss is the mean over its half of the batch, the one-process loss the mean over the batch
    for step in range(3):
        assert ranks[0].losses[step] != ranks[1].losses[step]
        assert (ranks[0].losses[step] + ranks[1].losses[step]) / 2 == pytest.approx(single.losses[step], rel=1e-12)
    # the averaged gradient is the full-batch gradient, so every update is the one-process update
    start = D._model_and_optimizer(config)[0]
    moved = {k: v.detach() for k, v in start.named_parameters()}
    assert D.max_difference(moved, single.parameters) > 1e-3  # training changed the parameters
    for name, value in single.parameters.items():
        assert torch.allclose(ranks[0].parameters[name], value, rtol=1e-9, atol=1e-10), name


def test_shards_are_the_halves_of_each_batch_and_sizes_are_checked():
    config = D.Config(steps=2, batch_size=6, seed=0)
    batch = D.training_batches(config)[0]
    halves = [D.shard(batch, r, 2) for r in range(2)]
    assert [len(h) for h in halves] == [3, 3]
    assert torch.equal(torch.cat([h.src for h in halves]), batch.src)
    assert torch.equal(torch.cat([h.tgt_out for h in halves]), batch.tgt_out)
    with pytest.raises(ValueError, match="batch_size"):
        D.training_batches(D.Config(batch_size=7))
