"""How a model's activations lie in memory on a device: one choice for training and evaluation,
so that both run the same convolution kernels."""

from __future__ import annotations

import torch


def memory_format(device: torch.device, *, spatial: int = 1) -> torch.memory_format:
    """channels_last_3d for an unsplit model on CPU: oneDNN's 3D convolutions in NDHWC took 2-5x
    less CPU per step of the default model than in NCDHW (same math, other summation order).
    Unchanged on GPUs and under a spatial split (neither measured in NDHWC)."""
    if device.type == "cpu" and spatial == 1:
        return torch.channels_last_3d
    return torch.contiguous_format
