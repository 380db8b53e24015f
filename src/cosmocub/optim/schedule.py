"""Learning-rate schedule of the MLPerf CosmoFlow reference as a pure function of the epoch.

lr scales linearly with the global batch, warms up linearly, then steps down at decay epochs; a
tiny scheduler object applies it per optimizer step so that resuming mid-epoch is exact.
"""

from __future__ import annotations

from typing import Any

from torch.optim import Optimizer

from cosmocub.config import OptimizerConfig


def peak_lr(cfg: OptimizerConfig, global_batch: int) -> float:
    """The linear scaling rule: lr · global_batch / base_batch_size."""
    return cfg.lr * global_batch / cfg.base_batch_size


def lr_at(epoch: float, cfg: OptimizerConfig, global_batch: int) -> float:
    """Learning rate at fractional epoch `epoch` (0 = start of training).

    Warm-up: linear from the unscaled cfg.lr to the peak over warmup_epochs, as the MLPerf
    reference does (so with a global batch below base_batch_size it ramps down, not up).
    Decay: peak × the factor of the last decay epoch reached; the factors are absolute (0.25
    then 0.125), not cumulative.
    """
    if epoch < 0:
        raise ValueError(f"lr_at: epoch must be >= 0, got {epoch}")
    peak = peak_lr(cfg, global_batch)
    if epoch < cfg.warmup_epochs:
        return cfg.lr + (peak - cfg.lr) * epoch / cfg.warmup_epochs
    factor = 1.0
    for decay_epoch, decay_factor in sorted(zip(cfg.decay_epochs, cfg.decay_factors, strict=True)):
        if epoch >= decay_epoch:
            factor = decay_factor
    return peak * factor


def stretched(cfg: OptimizerConfig, factor: float) -> dict[str, Any]:
    """Warm-up and decay epochs × `factor` (rounded; a decay no earlier than epoch 1): the same
    schedule shape over a run `factor` times as many epochs long."""
    return {
        "warmup_epochs": round(cfg.warmup_epochs * factor),
        "decay_epochs": [max(1, round(e * factor)) for e in cfg.decay_epochs],
    }


class EpochSchedule:
    """Sets every param group's lr to `lr_at(step / steps_per_epoch)` after each optimizer step."""

    def __init__(
        self, optimizer: Optimizer, cfg: OptimizerConfig, *, global_batch: int, steps_per_epoch: int
    ) -> None:
        if steps_per_epoch < 1:
            raise ValueError(f"EpochSchedule: steps_per_epoch must be >= 1, got {steps_per_epoch}")
        self.optimizer, self.cfg = optimizer, cfg
        self.global_batch, self.steps_per_epoch = global_batch, steps_per_epoch
        self.step_count = 0
        self._apply()

    def _apply(self) -> None:
        lr = self.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    @property
    def lr(self) -> float:
        return lr_at(self.step_count / self.steps_per_epoch, self.cfg, self.global_batch)

    def step(self) -> None:
        self.step_count += 1
        self._apply()

    def state_dict(self) -> dict[str, Any]:
        return {"step_count": self.step_count, "steps_per_epoch": self.steps_per_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_count = int(state["step_count"])
        self._apply()
