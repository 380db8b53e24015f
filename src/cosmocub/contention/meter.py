"""The meter a training loop starts before an epoch's steps and reads after them: each rank's
conditions (contention/conditions.py), gathered over the mesh."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from cosmocub.contention.conditions import (
    RANK_FIELDS,
    rank_conditions,
    reduce_over_ranks,
    take_sample,
)
from cosmocub.parallel.parallel_dims import ParallelDims


def cores_granted(dims: ParallelDims) -> int:
    """The cores this rank may run on: its affinity, fewer if the launcher granted fewer."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    granted = dims.env.cpus_per_rank
    return min(cores or 1, granted) if granted else cores or 1


class ConditionsMeter:
    """Start right before the epoch's first step, `metrics()` right after its last (on every
    rank: it gathers the ranks' numbers over the whole mesh)."""

    def __init__(self, dims: ParallelDims) -> None:
        self.dims = dims
        self.threads, self.cores = torch.get_num_threads(), cores_granted(dims)
        self.start = take_sample()

    def metrics(self) -> dict[str, float]:
        mine = rank_conditions(self.start, take_sample(), threads=self.threads, cores=self.cores)
        vector = torch.tensor([mine[k] for k in RANK_FIELDS], dtype=torch.float64)
        if self.dims.world_size == 1:
            return reduce_over_ranks([mine])
        vector = vector.to(self.dims.device)
        gathered = [torch.empty_like(vector) for _ in range(self.dims.world_size)]
        dist.all_gather(gathered, vector, group=self.dims.world_group)
        ranks = [dict(zip(RANK_FIELDS, v.tolist(), strict=True)) for v in gathered]
        return reduce_over_ranks(ranks)
