"""Build the configured single-process optimizer (sgd, adamw, lion) and its lr schedule.

Gradient communication is not the optimizer's business here: see `cosmocub.train.grad_sync`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.optim import Optimizer

from cosmocub.config import OptimizerConfig
from cosmocub.optim.lion import Lion
from cosmocub.optim.schedule import EpochSchedule, lr_at


def build_optimizer(
    params: Iterable[torch.Tensor], cfg: OptimizerConfig, global_batch: int
) -> Optimizer:
    """The optimizer named by cfg.name, starting at lr_at(0); the schedule moves lr from there."""
    lr = lr_at(0.0, cfg, global_batch)
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.name == "adamw":
        return torch.optim.AdamW(
            params, lr=lr, betas=cfg.resolved_betas, weight_decay=cfg.weight_decay
        )
    if cfg.name == "lion":
        return Lion(params, lr=lr, betas=cfg.resolved_betas, weight_decay=cfg.weight_decay)
    raise ValueError(f"key 'optimizer.name': unknown optimizer {cfg.name!r} (sgd, adamw, lion)")


def build_schedule(
    optimizer: Optimizer, cfg: OptimizerConfig, *, global_batch: int, steps_per_epoch: int
) -> EpochSchedule:
    return EpochSchedule(optimizer, cfg, global_batch=global_batch, steps_per_epoch=steps_per_epoch)
