"""Per-process runtime settings for training: threads, determinism, seeds, mixed precision.

Each function sets one thing and returns what it chose (or the previous value to restore), so
`main.train` stays a straight read: parse, build, train, close.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from cosmocub.config import TrainConfig
from cosmocub.parallel.parallel_dims import ParallelDims


def set_threads(cfg: TrainConfig, dims: ParallelDims) -> int:
    """threads_per_rank; else the cores srun reserved per task; else this node's cores shared
    evenly by its ranks (torchrun: every rank sees every core)."""
    if cfg.threads_per_rank is not None:
        threads = cfg.threads_per_rank
    elif dims.env.cpus_per_rank is not None:
        threads = dims.env.cpus_per_rank
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        threads = max(1, (cores or 1) // dims.env.local_world_size)
    torch.set_num_threads(threads)
    return threads


def set_deterministic(enabled: bool) -> tuple[bool, bool, bool]:
    """Switch deterministic algorithms on or off; returns the previous settings for `restore`."""
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
    )
    if enabled:
        # cuBLAS needs this before its first call to be deterministic.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    return previous


def restore_deterministic(previous: tuple[bool, bool, bool]) -> None:
    algorithms, benchmark, deterministic = previous
    torch.use_deterministic_algorithms(algorithms)
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cudnn.deterministic = deterministic


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rank_seed(seed: int, rank: int) -> int:
    # Distinct, reproducible streams per rank (dropout masks differ across data ranks).
    return seed * 1_000_003 + 7919 * (rank + 1)


def autocast_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """amp=auto: bf16 on CUDA, none on CPU; amp=bf16: bf16 everywhere; amp=off: none."""
    if amp == "off" or (amp == "auto" and device.type != "cuda"):
        return None
    return torch.bfloat16
