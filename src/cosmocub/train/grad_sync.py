"""Who reduces gradients across the mesh: a small object the training step asks.

Spatial = 1: DDP's bucketed all-reduce over the "data" axis. Spatial > 1: the spatial layers
(`parallel/layers.py`) leave on each rank S × a partial gradient of the conv stack and the full
gradient of the replicated head, so the spatial reduction is an average (of the conv stack alone:
the head's gradients are already equal over the group), and spatial average then
data average is one average over the whole mesh: DDP over all ranks. An optimizer that exchanges
compressed updates itself (Lion Cub, `communicates_gradients = True`) gets only the spatial
average, in full precision, and does the data axis itself.

`exchange_s` adds up the seconds each one made the step wait for its exchange, so every
optimizer's step splits into compute and exchange the same way; `exchange_busy_s` how long its
exchange ran, overlapped or not. Both on the device's clock (`parallel/timing.py`: host time on
a CPU, CUDA events on a GPU, read when asked, so measuring never stalls the device's queue).
DDP's all-reduce overlaps backward. With timing "overlapped" (the default) a communication hook
launches DDP's own all-reduce of each bucket (same averaging math) without waiting and marks
when it completed; the exposed part (exchange_s) is from the last bucket's launch, which is when
backward hands over its last gradients, to the last completion, and busy the time some bucket's
all-reduce was in flight (the union of each bucket's launch to its completion: the model's sum
of bucket times, perfmodel.cost_model.overlap, without the gaps where backward had no bucket
ready). With
"blocking" the hook waits for each bucket's all-reduce (on a GPU the compute stream waits for
it), so the rest of backward cannot overlap it and the exchange is measured whole: exchange_s =
exchange_busy_s, the sum of the buckets' waits.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from cosmocub.optim.collectives import ring_allreduce_bytes
from cosmocub.parallel.layers import SyncBatchNorm3d
from cosmocub.parallel.node_layout import ring_inter_fraction
from cosmocub.parallel.parallel_dims import ParallelDims
from cosmocub.parallel.timing import Spans, clock_for

DDP_TIMINGS = ("overlapped", "blocking")


class GradientSync(Protocol):
    """wrap(model) once before training; after_backward(model) after every backward pass;
    bytes_sent_per_step(payload) for the byte accounting (what this rank sends per step), and
    inter_node_fraction, the share of it that crosses nodes (a ring's one crossing a node, shared
    by the node's ranks: cosmocub.parallel.node_layout);
    exchange_s: seconds the steps waited for the exchange so far; exchange_busy_s: seconds it
    ran (more than exchange_s where it overlaps backward)."""

    name: str

    @property
    def exchange_s(self) -> float: ...

    @property
    def exchange_busy_s(self) -> float: ...

    def wrap(self, model: nn.Module) -> nn.Module: ...

    def after_backward(self, model: nn.Module) -> None: ...

    def bytes_sent_per_step(self, payload_bytes: int) -> float: ...

    @property
    def inter_node_fraction(self) -> float: ...


class DDPAllReduce:
    """DistributedDataParallel over the data axis (or the whole mesh when spatial > 1, see the
    module docstring): averaging overlaps the backward pass unless timing is "blocking"."""

    name = "ddp"

    def __init__(self, dims: ParallelDims, *, timing: str = "overlapped") -> None:
        if timing not in DDP_TIMINGS:
            raise ValueError(f"train.ddp_exchange_timing: {timing!r} is not one of {DDP_TIMINGS}")
        self.dims, self.timing = dims, timing
        self.clock = clock_for(dims.device)
        self.waited = Spans()  # what the steps waited for: exposed, or every bucket when blocking
        self.busy = Spans()  # overlapped: while some bucket's all-reduce was in flight
        # This step's marks, appended by the hook (launches) and by the futures' callbacks
        # ((launch, completion) per bucket: gloo's worker thread on a CPU), taken by
        # after_backward.
        self.launched: list[Any] = []
        self.completed: list[Any] = []

    @property
    def exchange_s(self) -> float:
        return self.waited.seconds

    @property
    def exchange_busy_s(self) -> float:
        return self.busy.seconds if self.timing == "overlapped" else self.waited.seconds

    def wrap(self, model: nn.Module) -> nn.Module:
        device_ids = [self.dims.device.index] if self.dims.device.type == "cuda" else None
        group = self.dims.group("data") if self.dims.spatial == 1 else self.dims.world_group
        # DDP broadcasts rank 0's parameters and buffers here, so every rank starts identical.
        # It would broadcast the buffers again before every forward (forward_sync_buffers): a
        # blocking collective a step, for nothing where every buffer is a synced norm's, whose
        # running statistics come from the mesh-wide batch and so stay equal on every rank.
        # (forward_sync_buffers, torch 2.13's name, keeps the broadcast at construction that
        # broadcast_buffers=False kept; only the per-forward one is switched.)
        ddp = DistributedDataParallel(
            model,
            device_ids=device_ids,
            process_group=group,
            forward_sync_buffers=has_unsynced_buffers(model),
        )
        hook = self._blocking_allreduce if self.timing == "blocking" else self._timed_allreduce
        ddp.register_comm_hook(group, hook)
        return ddp

    # No annotations on the hooks: DDP compares them with its own classes, and these would be
    # strings.
    def _blocking_allreduce(self, group, bucket):
        start = self.clock.mark()
        future = allreduce_hook(group, bucket)  # DDP's default: divide by the group size, sum
        # On a CPU the host waits; a CUDA future's wait makes the current stream wait, so the
        # rest of backward queues behind the all-reduce and the end mark is its completion.
        future.wait()
        self.waited.add(self.clock, start, self.clock.mark())
        return future

    def _timed_allreduce(self, group, bucket):
        launched = self.clock.mark()
        self.launched.append(launched)
        completed = self.completed

        def mark_completed(fut):
            # Runs when the all-reduce is done (gloo), or in its stream once queued (NCCL: the
            # event then records in the stream that runs it).
            completed.append((launched, self.clock.mark()))
            return fut.value()

        return allreduce_hook(group, bucket).then(mark_completed)

    def after_backward(self, model: nn.Module) -> None:
        if self.timing == "blocking" or not self.launched:
            return
        launched, completed = self.launched, self.completed
        self.launched, self.completed = [], []
        # DDP waited for every bucket's future (the one the hook returned, so its callback has
        # run) before backward returned: each launch has its completion.
        assert len(completed) == len(launched), (len(launched), len(completed))
        self.busy.add_intervals(self.clock, completed)
        self.waited.add(self.clock, launched[-1], *(done for _, done in completed))

    def bytes_sent_per_step(self, payload_bytes: int) -> float:
        return ring_allreduce_bytes(payload_bytes, self.dims.data * self.dims.spatial)

    @property
    def inter_node_fraction(self) -> float:
        return ring_inter_fraction(self.dims.world_size, self.dims.per_node)


class LocalGradients:
    """No exchange: one data rank, or an optimizer that communicates by itself."""

    name = "local"
    exchange_s = exchange_busy_s = inter_node_fraction = 0.0

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def after_backward(self, model: nn.Module) -> None:
        pass

    def bytes_sent_per_step(self, payload_bytes: int) -> float:
        return 0.0


class SpatialAverage:
    """Average the conv stack's gradients over the spatial group only, in full precision (one
    flat all-reduce after backward), for an optimizer that does the data axis itself.

    The replicated dense head already holds the same full gradient on every spatial rank (see
    `parallel/layers.py`): it is left out of the all-reduce and of the byte count.
    """

    name = "spatial"

    def __init__(self, dims: ParallelDims) -> None:
        self.dims = dims
        self.replicated: set[int] = set()  # ids of the head's parameters, set by wrap
        self.replicated_bytes = 0
        self.clock = clock_for(dims.device)
        self.waited = Spans()

    @property
    def exchange_s(self) -> float:
        return self.waited.seconds

    @property
    def exchange_busy_s(self) -> float:
        return self.waited.seconds  # after backward: nothing overlaps it

    def wrap(self, model: nn.Module) -> nn.Module:
        from cosmocub.models.parallelize import replicated_parameters

        params = [p for p in replicated_parameters(model) if p.requires_grad]
        self.replicated = {id(p) for p in params}
        self.replicated_bytes = sum(p.numel() * p.element_size() for p in params)
        return model

    def after_backward(self, model: nn.Module) -> None:
        grads = [
            p.grad
            for p in model.parameters()
            if p.grad is not None and id(p) not in self.replicated
        ]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        start = self.clock.mark()
        dist.all_reduce(flat, group=self.dims.group("spatial"))
        self.waited.add(self.clock, start, self.clock.mark())
        flat /= self.dims.spatial
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def bytes_sent_per_step(self, payload_bytes: int) -> float:
        return ring_allreduce_bytes(payload_bytes - self.replicated_bytes, self.dims.spatial)

    @property
    def inter_node_fraction(self) -> float:
        # A spatial group is consecutive ranks: on one node, or spanning whole nodes.
        return ring_inter_fraction(self.dims.spatial, self.dims.per_node)


def build_gradient_sync(
    optimizer: Optimizer, dims: ParallelDims, *, ddp_timing: str = "overlapped"
) -> GradientSync:
    if getattr(optimizer, "communicates_gradients", False):
        return SpatialAverage(dims) if dims.spatial > 1 else LocalGradients()
    if dims.data * dims.spatial == 1:
        return LocalGradients()
    return DDPAllReduce(dims, timing=ddp_timing)


def has_unsynced_buffers(model: nn.Module) -> bool:
    """Whether `model` holds a buffer outside a SyncBatchNorm3d (a plain norm's statistics, or
    anything else a rank may change on its own): DDP must then broadcast the buffers before
    every forward to keep the ranks equal."""
    synced = {
        id(sub)
        for module in model.modules()
        if isinstance(module, SyncBatchNorm3d)
        for sub in module.modules()
    }
    return any(
        next(module.buffers(recurse=False), None) is not None
        for module in model.modules()
        if id(module) not in synced
    )
