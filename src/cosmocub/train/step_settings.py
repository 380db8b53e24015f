"""How the training step runs on this device: autocast, memory layout, compilation and the fused
optimizer, each a train.* key whose "auto" is made concrete here, with the refusals in one place.

Chosen defaults (auto): on a CPU, today's step (fp32, NDHWC unsplit, eager, foreach optimizer);
on a GPU, bf16 autocast, NDHWC (cuDNN's tensor-core 3D convolutions take it) and the fused
AdamW/SGD kernel. compile stays off unless asked: it costs a compilation per run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from cosmocub.config import Config, ConfigError, OptimizerKind
from cosmocub.models.memory_layout import memory_format
from cosmocub.parallel.parallel_dims import ParallelDims
from cosmocub.train import runtime


@dataclass(frozen=True, kw_only=True)
class StepSettings:
    autocast_dtype: torch.dtype | None  # None: fp32
    memory_format: torch.memory_format  # of the model's weights and of every batch
    compile: bool
    fused_optimizer: bool

    def compiled(self, module: nn.Module) -> nn.Module:
        """What the step calls: `module` itself, or its torch.compile'd form (same parameters,
        so the checkpoint keeps the plain model's keys)."""
        return torch.compile(module) if self.compile else module


def step_settings(cfg: Config, dims: ParallelDims) -> StepSettings:
    """The step's settings for this rank's device and mesh; ConfigError, naming the key and the
    values, for a combination that cannot run."""
    tc, device = cfg.train, dims.device
    split = dims.spatial > 1
    if split and tc.channels_last is True:
        raise ConfigError(
            f"key 'train.channels_last': true under a spatial split (parallel.spatial = "
            f"{dims.spatial}): the halo exchange runs in NCDHW (set it to auto or false)"
        )
    if split and tc.compile:
        raise ConfigError(
            f"key 'train.compile': true under a spatial split (parallel.spatial = "
            f"{dims.spatial}): the spatial layers' halo exchanges are not compiled (set false)"
        )
    kind = cfg.optimizer.name
    if tc.fused_optimizer is True and not kind.has_fused_kernel:
        fused_kinds = ", ".join(k.value for k in OptimizerKind if k.has_fused_kernel)
        raise ConfigError(
            f"key 'train.fused_optimizer': true, but optimizer.name {kind.value!r} has no fused "
            f"kernel (only {fused_kinds}; set auto or false)"
        )
    autocast = runtime.autocast_dtype(tc.amp, device)
    if tc.channels_last == "auto":  # the rule evaluation and the perf model follow too
        layout = memory_format(device, spatial=dims.spatial, autocast=autocast is not None)
    else:
        layout = torch.channels_last_3d if tc.channels_last else torch.contiguous_format
    if tc.fused_optimizer == "auto":
        fused = device.type == "cuda" and kind.has_fused_kernel
    else:
        fused = bool(tc.fused_optimizer)
    return StepSettings(
        autocast_dtype=autocast,
        memory_format=layout,
        compile=tc.compile,
        fused_optimizer=fused,
    )
