"""Who averages gradients across the "data" mesh axis: a small object the training step asks.

Today that is DDP's bucketed all-reduce; an optimizer that exchanges compressed updates itself
(Lion Cub) sets `communicates_gradients = True` and gets `LocalGradients` instead.
"""

from __future__ import annotations

from typing import Protocol

from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from cosmocub.parallel.mesh import ParallelDims


class GradientSync(Protocol):
    """wrap(model) once before training; after_backward(model) after every backward pass."""

    name: str

    def wrap(self, model: nn.Module) -> nn.Module: ...

    def after_backward(self, model: nn.Module) -> None: ...


class DDPAllReduce:
    """DistributedDataParallel over the data axis: averaging overlaps the backward pass."""

    name = "ddp"

    def __init__(self, dims: ParallelDims) -> None:
        self.dims = dims

    def wrap(self, model: nn.Module) -> nn.Module:
        device_ids = [self.dims.device.index] if self.dims.device.type == "cuda" else None
        # DDP broadcasts rank 0's parameters and buffers here, so every rank starts identical.
        return DistributedDataParallel(
            model, device_ids=device_ids, process_group=self.dims.group("data")
        )

    def after_backward(self, model: nn.Module) -> None:
        pass  # DDP's hooks already averaged every gradient during backward


class LocalGradients:
    """No exchange: one data rank, or an optimizer that communicates by itself."""

    name = "local"

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def after_backward(self, model: nn.Module) -> None:
        pass


def build_gradient_sync(optimizer: Optimizer, dims: ParallelDims) -> GradientSync:
    if getattr(optimizer, "communicates_gradients", False) or dims.data == 1:
        return LocalGradients()
    return DDPAllReduce(dims)
