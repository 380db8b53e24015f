"""How a model's activations lie in memory on a device: one rule for training, evaluation and
the performance model, so that a model at the same precision runs the same convolution kernels."""

from __future__ import annotations

import torch


def memory_format(
    device: torch.device, *, spatial: int = 1, autocast: bool = False
) -> torch.memory_format:
    """channels_last_3d for an unsplit model on CPU (oneDNN's 3D convolutions in NDHWC took 2-5x
    less CPU per step of the default model than in NCDHW: same math, other summation order) and
    on a GPU under autocast (cuDNN runs bf16/fp16 3D convolutions on tensor cores in NDHWC and
    would transpose NCDHW around every one); NCDHW otherwise, and always under a spatial split
    (the halo exchange runs in NCDHW)."""
    if spatial == 1 and (device.type == "cpu" or autocast):
        return torch.channels_last_3d
    return torch.contiguous_format
