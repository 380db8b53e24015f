"""Time gloo (or NCCL) collectives over message sizes and rank counts, for the α–β fit of one link.

Runs inside a process group that is already up (torchrun on one node for loopback, one agent per
emulated node, srun on a cluster): for every group size 2..P it forms the group of the first
ranks and times, per size, an fp32 all-reduce (DDP's gradients), an all-gather and an all-to-all
of uint8 (Lion Cub's packed codes) and an fp32 halo swap (each rank sends one face to each ring
neighbour). A sample's time is the slowest rank's median over repeats, as a step waits for the
last (small messages repeated more); the smallest sizes measure gloo's per-call latency.
"""

from __future__ import annotations

import csv
import itertools
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from cosmocub.io import atomic_path, read_tsv
from cosmocub.optim.collectives import all_gather_flat
from cosmocub.perfmodel.alpha_beta import KINDS
from cosmocub.perfmodel.measure.alpha_beta_fit import Sample

COLUMNS = ("link", "kind", "group_size", "nbytes", "seconds")
MIN_SAMPLE_S, MAX_REPEATS = 0.1, 50  # small messages are repeated up to this long, this often
# What training sends with each kind: fp32 gradients and activations, Lion Cub's uint8 codes.
KIND_DTYPES = {
    "allreduce": torch.float32,
    "allgather": torch.uint8,
    "alltoall": torch.uint8,
    "halo": torch.float32,
}


def _op(kind: str, buf: torch.Tensor, group: dist.ProcessGroup, rank: int, size: int):
    """One collective on `buf` (its bytes as rounds_and_bytes takes them)."""
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


def buffer_elements(kind: str, nbytes: int, group_size: int) -> int:
    """Elements of `kind`'s dtype nearest below `nbytes`, a multiple of the group (at least one
    per rank), so every rank's share is whole."""
    return max(group_size, nbytes // _itemsize(kind) // group_size * group_size)


def _itemsize(kind: str) -> int:
    return torch.empty(0, dtype=KIND_DTYPES[kind]).element_size()


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
    if unknown := [k for k in kinds if k not in KIND_DTYPES]:
        raise ValueError(f"micro-benchmark: unknown collectives {unknown} ({', '.join(KINDS)})")
    samples = []
    for p in group_sizes:
        if not 2 <= p <= world:
            raise ValueError(f"micro-benchmark: group size {p} outside 2..{world} (world size)")
        group = dist.new_group(list(range(p)))  # every rank takes part in creating it
        for kind, nbytes in itertools.product(kinds, sizes_bytes):
            elements = buffer_elements(kind, nbytes, p)
            seconds = torch.zeros(1, dtype=torch.float64)
            if rank < p:
                buf = torch.ones(elements, dtype=KIND_DTYPES[kind], device=device)
                seconds[0] = _median_op_s(_op(kind, buf, group, rank, p), repeats, group, device)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank's
            nbytes_buf = elements * _itemsize(kind)
            samples.append(
                Sample(kind=kind, nbytes=nbytes_buf, group_size=p, seconds=float(seconds))
            )
    return samples


def _median_op_s(op, repeats: int, group: dist.ProcessGroup, device: torch.device) -> float:
    """The median of `op`'s times after a warm-up (connections, buffers), each after a barrier."""
    op()
    times = []
    for _ in range(_repeats(op, repeats, group, device)):
        dist.barrier(group=group)
        start = time.perf_counter()
        op()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return float(torch.tensor(times).median())


def _repeats(op, repeats: int, group: dist.ProcessGroup, device: torch.device) -> int:
    """At least `repeats`, and as many more as fit in MIN_SAMPLE_S (at most MAX_REPEATS), from
    a second warm-up's time (the group's slowest, so that every rank repeats alike): small
    messages' times scatter (scheduling, ACKs), and their median then needs more of them."""
    start = time.perf_counter()
    op()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX, group=group)
    return max(repeats, min(MAX_REPEATS, int(MIN_SAMPLE_S / max(float(took), 1e-9))))


def write_samples(samples_by_link: Mapping[str, Sequence[Sample]], path: Path) -> None:
    """The samples of every link as one TSV (COLUMNS), atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(COLUMNS)
        for link, samples in samples_by_link.items():
            for s in samples:
                writer.writerow([link, s.kind, s.group_size, int(s.nbytes), f"{s.seconds:.6g}"])


def read_samples(path: Path) -> dict[str, list[Sample]]:
    """link -> its samples, in the file's order."""
    rows = read_tsv(path, not_found="micro-benchmark samples not found")
    if not rows:
        raise ValueError(f"{path}: no samples")
    if missing := set(COLUMNS) - set(rows[0]):
        raise ValueError(f"{path}: columns {sorted(missing)} missing (need {', '.join(COLUMNS)})")
    out: dict[str, list[Sample]] = {}
    for r in rows:
        out.setdefault(r["link"], []).append(
            Sample(
                kind=r["kind"],
                group_size=int(r["group_size"]),
                nbytes=float(r["nbytes"]),
                seconds=float(r["seconds"]),
            )
        )
    return out
