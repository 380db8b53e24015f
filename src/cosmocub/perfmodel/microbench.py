"""Time gloo (or NCCL) collectives over message sizes and rank counts, for the α–β fit.

Runs inside a process group that is already up (torchrun here, an emulated node's agent, srun on
a cluster): for every group size 2..P it forms the group of the first ranks and times all-reduce,
all-gather, all-to-all and a halo swap (each rank sends one face to each ring neighbour). A
sample's time is the slowest rank's median over repeats, as a training step waits for the last.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from cosmocub.io import atomic_path, read_tsv
from cosmocub.optim.collectives import all_gather_flat
from cosmocub.perfmodel.costs import KINDS, Sample

COLUMNS = ("kind", "group_size", "nbytes", "seconds")


def _op(kind: str, buf: torch.Tensor, group: dist.ProcessGroup, rank: int, size: int):
    """One collective on `buf` (nbytes as rounds_and_bytes takes them)."""
    if kind == "allreduce":
        return lambda: dist.all_reduce(buf, group=group)
    if kind == "allgather":
        mine = buf[: buf.numel() // size].clone()
        return lambda: all_gather_flat(buf, mine, group=group)
    if kind == "alltoall":
        out = torch.empty_like(buf)
        return lambda: dist.all_to_all_single(out, buf, group=group)
    if kind == "halo":
        recv = [torch.empty_like(buf), torch.empty_like(buf)]
        ranks = dist.get_process_group_ranks(group)
        left, right = ranks[(rank - 1) % size], ranks[(rank + 1) % size]

        def swap() -> None:
            ops = [
                dist.P2POp(dist.isend, buf, right, group),
                dist.P2POp(dist.isend, buf, left, group),
                dist.P2POp(dist.irecv, recv[0], left, group),
                dist.P2POp(dist.irecv, recv[1], right, group),
            ]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        return swap
    raise ValueError(f"unknown collective {kind!r} ({', '.join(KINDS)})")


def run_microbench(
    *,
    sizes_bytes: Sequence[int],
    group_sizes: Sequence[int] | None = None,
    kinds: Sequence[str] = KINDS,
    repeats: int = 5,
    device: torch.device | None = None,
) -> list[Sample]:
    """Every rank of the world calls this; returns the samples (on every rank)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    device = device or torch.device("cpu")
    group_sizes = list(group_sizes or range(2, world + 1))
    samples = []
    for p in group_sizes:
        if not 2 <= p <= world:
            raise ValueError(f"micro-benchmark: group size {p} outside 2..{world} (world size)")
        group = dist.new_group(list(range(p)))  # every rank takes part in creating it
        for kind in kinds:
            for nbytes in sizes_bytes:
                elements = max(p, nbytes // 4 // p * p)  # fp32, a multiple of p
                seconds = torch.zeros(1, dtype=torch.float64)
                if rank < p:
                    buf = torch.ones(elements, dtype=torch.float32, device=device)
                    op = _op(kind, buf, group, rank, p)
                    op()  # warm-up: connections, buffers
                    times = []
                    for _ in range(repeats):
                        dist.barrier(group=group)
                        start = time.perf_counter()
                        op()
                        if device.type == "cuda":
                            torch.cuda.synchronize(device)
                        times.append(time.perf_counter() - start)
                    seconds[0] = float(torch.tensor(times).median())
                dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank's
                samples.append(
                    Sample(kind=kind, nbytes=4 * elements, group_size=p, seconds=float(seconds))
                )
    return samples


def write_samples(samples: Sequence[Sample], path: Path) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(COLUMNS)
        for s in samples:
            writer.writerow([s.kind, s.group_size, int(s.nbytes), f"{s.seconds:.6g}"])


def read_samples(path: Path) -> list[Sample]:
    rows = read_tsv(path, not_found="micro-benchmark samples not found")
    if not rows:
        raise ValueError(f"{path}: no samples")
    if missing := set(COLUMNS) - set(rows[0]):
        raise ValueError(f"{path}: columns {sorted(missing)} missing")
    return [
        Sample(
            kind=r["kind"],
            group_size=int(r["group_size"]),
            nbytes=float(r["nbytes"]),
            seconds=float(r["seconds"]),
        )
        for r in rows
    ]
