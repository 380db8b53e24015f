"""Training batches cut where the step runs, from the sampler's own draws: the loader the loop
iterates when train.data_placement holds the training shard in the device's memory ("device"),
or, on a GPU it does not fit, in pinned host memory with the next batch copied ahead ("pinned").

Either way batch b of epoch e is what the worker DataLoader gives (data/resident_crops.py), and a
resumed epoch starts at the sampler's position, so it skips exactly the batches consumed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch.utils.data import Dataset, Sampler

from cosmocub.config import ConfigError
from cosmocub.data.dataset import FirstUniverses, ShardDataset
from cosmocub.data.resident_crops import (
    ResidentShard,
    gather_crops,
    holdable,
    host_memory_available,
    load_resident,
    resident_bytes,
)
from cosmocub.parallel.parallel_dims import ParallelDims

T = TypeVar("T")

PLACEMENTS = ("auto", "loader", "device", "pinned")
# Share of the memory still free that a resident shard may take: the rest is the model's
# activations, the optimizer's state and the allocator's slack (a GPU) or everything else (a host).
RESIDENT_SHARE = 0.5

# An epoch's draws from the sampler: rows (n,), symmetries (n,), origins (n, 3) or None.
Plan = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


@dataclass
class LoaderCounters:
    """What feeding the step cost the host, counted: a resident shard needs one plan copy an
    epoch and none per batch; the pinned path two copies a batch."""

    host_to_device_copies: int = 0
    batches: int = 0


class ResidentLoader:
    """Iterable of (x (B, C, d, h, w) float32, target) batches on `device`, in the order of the
    sampler (train/loaders.py's ResumableSampler: its `set_position` decides where an epoch
    starts), gathered from a ResidentShard."""

    def __init__(
        self,
        shard: ResidentShard,
        sampler: Sampler,
        *,
        batch_size: int,
        device: torch.device,
        memory_format: torch.memory_format = torch.contiguous_format,
    ) -> None:
        self.shard, self.sampler, self.batch_size = shard, sampler, batch_size
        self.device, self.memory_format = device, memory_format
        self.counters = LoaderCounters()
        self.placement = "device" if shard.device == device else "pinned"

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size

    def _plan(self) -> Plan:
        """The rest of the epoch's draws on the host: rows (n,), symmetries (n,), origins (n, 3)
        or None (fixed crops)."""
        draws = list(self.sampler)
        # Pinned on the way to a GPU, so that the copy queues behind the step, never waits.
        pin = self.placement == "device" and self.device.type == "cuda"

        def column(values: list) -> torch.Tensor:
            t = torch.tensor(values, dtype=torch.int64)
            return t.pin_memory() if pin else t

        if not draws or not isinstance(draws[0], tuple):
            return column(draws), column([0] * len(draws)), None
        rows, symmetries = column([d[0] for d in draws]), column([d[1] for d in draws])
        if len(draws[0]) == 2:
            return rows, symmetries, None
        return rows, symmetries, column([d[2] for d in draws])

    def _starts(self, plan: Plan) -> range:
        """Where each whole batch of the plan starts."""
        return range(0, len(plan[0]) - self.batch_size + 1, self.batch_size)

    def _cut(self, plan: Plan, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of the plan's draws from `start` on, gathered where the shard is held."""
        rows, symmetries, origins = (
            None if t is None else t[start : start + self.batch_size] for t in plan
        )
        return gather_crops(self.shard, rows, symmetries, origins, memory_format=self.memory_format)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        plan = self._plan()
        if self.placement == "pinned":
            return self._prefetched(plan)
        return self._resident(plan)

    def _resident(self, plan: Plan) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # The epoch's draws cross to the device once; every batch is then cut there. On a GPU
        # the cut is kernels queued behind the previous step, so the host waits for nothing; on
        # a CPU the cut is the host's own work (~1.3 ms a batch of 8 at 32³, memory-latency
        # bound), so batch b + 1 is cut on a helper thread while the step runs batch b.
        if self.device.type != "cpu":
            self.counters.host_to_device_copies += 1
        plan = tuple(None if t is None else t.to(self.device, non_blocking=True) for t in plan)
        starts = self._starts(plan)
        cut = functools.partial(self._cut, plan)
        batches = _one_ahead(cut, starts) if self.device.type == "cpu" else map(cut, starts)
        for batch in batches:
            self.counters.batches += 1
            yield batch

    def _prefetched(self, plan: Plan) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # Batch b + 1 is cut on the host, pinned and copied on a side stream by a helper thread
        # while the step runs batch b; the step's stream waits for its copy, the host does not.
        cuda = self.device.type == "cuda"
        side = torch.cuda.Stream(self.device) if cuda else None

        def stage(start: int) -> tuple[torch.Tensor, torch.Tensor, torch.cuda.Event | None]:
            x, y = self._cut(plan, start)
            if not cuda:
                return x, y, None
            x, y = x.pin_memory(), y.pin_memory()
            with torch.cuda.stream(side):
                x = x.to(self.device, non_blocking=True)
                y = y.to(self.device, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record(side)
            return x, y, ready

        for x, y, ready in _one_ahead(stage, self._starts(plan)):
            if ready is not None:
                current = torch.cuda.current_stream(self.device)
                current.wait_event(ready)
                x.record_stream(current)  # allocated on the side stream, used on this one
                y.record_stream(current)
                self.counters.host_to_device_copies += 2
            self.counters.batches += 1
            yield x, y


def _one_ahead(make: Callable[[int], T], starts: range) -> Iterator[T]:
    """make(start) for each start in order, the next one made on a helper thread while the
    caller uses the current one (torch's operators release the GIL while they run). A consumer
    that stops early leaves at most one batch made for nothing; an error in `make` is raised
    where its batch is taken."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch") as pool:
        pending = pool.submit(make, starts[0]) if starts else None
        for i in range(len(starts)):
            assert pending is not None
            made = pending.result()
            pending = pool.submit(make, starts[i + 1]) if i + 1 < len(starts) else None
            yield made


def resolve_placement(requested: str, dataset: Dataset, dims: ParallelDims) -> str:
    """train.data_placement made concrete for this dataset and device: "loader", "device" or
    "pinned"; a ConfigError with the numbers where the requested one cannot run.

    auto: the device when the shard takes at most RESIDENT_SHARE of its free memory (a CPU's:
    this host's available memory shared by its ranks), else pinned host memory on a GPU, else
    the worker DataLoader; datasets the resident path cannot serve always take the loader."""
    key = "key 'train.data_placement'"
    if requested not in PLACEMENTS:
        raise ConfigError(f"{key}: {requested!r} is not one of {', '.join(PLACEMENTS)}")
    if requested == "loader":
        return "loader"
    if not holdable(dataset):
        if requested == "auto":
            return "loader"
        raise ConfigError(
            f"{key}: {requested} serves a shard's samples or universes; "
            f"{type(dataset).__name__} batches come from the worker loader (set it to loader)"
        )
    device = dims.device
    if requested == "pinned" and device.type != "cuda":
        raise ConfigError(f"{key}: pinned copies batches to a GPU; this rank runs on {device}")
    need = resident_bytes(dataset, standardized=standardizes(device))  # on the device
    need_pinned = resident_bytes(dataset)
    local = max(1, dims.env.local_world_size)
    host_budget = RESIDENT_SHARE * host_memory_available() / local
    if device.type == "cuda":
        device_budget = RESIDENT_SHARE * torch.cuda.mem_get_info(device)[0]
    else:
        device_budget = host_budget
    fits_device, fits_host = need <= device_budget, need_pinned <= host_budget
    if requested == "device" and not fits_device:
        raise ConfigError(
            f"{key}: device: the training shard takes {_size(need)}, more than "
            f"{RESIDENT_SHARE:.0%} of {device}'s free memory ({_size(device_budget)} allowed); "
            f"use pinned (a GPU) or loader"
        )
    if requested == "pinned" and not fits_host:
        raise ConfigError(
            f"{key}: pinned: the training shard takes {_size(need_pinned)}, more than "
            f"{_size(host_budget)} of this host's memory per rank; use loader"
        )
    if requested != "auto":
        return requested
    if fits_device:
        return "device"
    return "pinned" if device.type == "cuda" and fits_host else "loader"


def standardizes(device: torch.device) -> bool:
    """Whether a shard held on `device` is held standardised (float32): on a CPU, where the
    per-batch arithmetic was most of a batch's cost (~2 of ~4 ms at 32³, batch 8, one core);
    a GPU does it for nothing and keeps half the memory."""
    return device.type == "cpu"


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.2f} MiB"


def build_resident_loader(
    dataset: ShardDataset | FirstUniverses,
    sampler: Sampler,
    *,
    placement: str,
    batch_size: int,
    device: torch.device,
    memory_format: torch.memory_format,
) -> ResidentLoader:
    """The shard loaded where `placement` ("device" or "pinned") says, behind `sampler`."""
    if placement == "device":
        shard = load_resident(dataset, device, standardized=standardizes(device))
    else:
        shard = load_resident(dataset, torch.device("cpu"), pin=True)
    return ResidentLoader(
        shard, sampler, batch_size=batch_size, device=device, memory_format=memory_format
    )
