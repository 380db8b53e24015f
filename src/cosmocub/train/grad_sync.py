"""Who reduces gradients across the mesh: a small object the training step asks.

Spatial = 1: DDP's bucketed all-reduce over the "data" axis. Spatial > 1: the spatial layers
(`parallel/layers.py`) leave on each rank S × a partial gradient of the conv stack and the full
gradient of the replicated head, so the spatial reduction is an average (of the conv stack alone:
the head's gradients are already equal over the group), and spatial average then
data average is one average over the whole mesh: DDP over all ranks. An optimizer that exchanges
compressed updates itself (Lion Cub, `communicates_gradients = True`) gets only the spatial
average, in full precision, and does the data axis itself.

`exchange_s` adds up the host seconds each one waited for its exchange, so every optimizer's
step splits into compute and exchange the same way. DDP's all-reduce overlaps backward; with
timing "blocking" a communication hook waits for each bucket's all-reduce (same averaging math
as DDP's default hook) and times that wait — no overlap, so the exchange is measured whole; with
"overlapped" DDP runs as is and its exchange stays inside the compute time (exchange_s = 0).
"""

from __future__ import annotations

import time
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from cosmocub.optim.collectives import ring_allreduce_bytes
from cosmocub.parallel.mesh import ParallelDims


class GradientSync(Protocol):
    """wrap(model) once before training; after_backward(model) after every backward pass;
    bytes_sent_per_step(payload) for the byte accounting (what this rank sends per step);
    exchange_s: seconds waited for the exchange so far."""

    name: str
    exchange_s: float

    def wrap(self, model: nn.Module) -> nn.Module: ...

    def after_backward(self, model: nn.Module) -> None: ...

    def bytes_sent_per_step(self, payload_bytes: int) -> float: ...


class DDPAllReduce:
    """DistributedDataParallel over the data axis (or the whole mesh when spatial > 1, see the
    module docstring): averaging overlaps the backward pass."""

    name = "ddp"

    def __init__(self, dims: ParallelDims, *, timing: str = "blocking") -> None:
        self.dims, self.timing = dims, timing
        self.exchange_s = 0.0

    def wrap(self, model: nn.Module) -> nn.Module:
        device_ids = [self.dims.device.index] if self.dims.device.type == "cuda" else None
        group = self.dims.group("data") if self.dims.spatial == 1 else self.dims.world_group
        # DDP broadcasts rank 0's parameters and buffers here, so every rank starts identical.
        ddp = DistributedDataParallel(model, device_ids=device_ids, process_group=group)
        if self.timing == "blocking":
            ddp.register_comm_hook(group, self._blocking_allreduce)
        return ddp

    # No annotations: DDP compares them with its own classes, and these would be strings.
    def _blocking_allreduce(self, group, bucket):
        start = time.perf_counter()
        future = allreduce_hook(group, bucket)  # DDP's default: divide by the group size, sum
        future.wait()
        if bucket.buffer().is_cuda:  # a CUDA future is done when queued, not when run
            torch.cuda.synchronize(bucket.buffer().device)
        self.exchange_s += time.perf_counter() - start
        return future

    def after_backward(self, model: nn.Module) -> None:
        pass  # DDP's hooks already averaged every gradient during backward

    def bytes_sent_per_step(self, payload_bytes: int) -> float:
        return ring_allreduce_bytes(payload_bytes, self.dims.data * self.dims.spatial)


class LocalGradients:
    """No exchange: one data rank, or an optimizer that communicates by itself."""

    name = "local"
    exchange_s = 0.0

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
        self.exchange_s = 0.0

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
        start = time.perf_counter()
        dist.all_reduce(flat, group=self.dims.group("spatial"))
        self.exchange_s += time.perf_counter() - start
        flat /= self.dims.spatial
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def bytes_sent_per_step(self, payload_bytes: int) -> float:
        return ring_allreduce_bytes(payload_bytes - self.replicated_bytes, self.dims.spatial)


def build_gradient_sync(
    optimizer: Optimizer, dims: ParallelDims, *, ddp_timing: str = "blocking"
) -> GradientSync:
    if getattr(optimizer, "communicates_gradients", False):
        return SpatialAverage(dims) if dims.spatial > 1 else LocalGradients()
    if dims.data * dims.spatial == 1:
        return LocalGradients()
    return DDPAllReduce(dims, timing=ddp_timing)
