"""Per-epoch communication and time breakdown of the training step, the same for every optimizer.

comm_bytes_per_step: bytes this rank sends per step over the data group — DDP's fp32 ring
all-reduce of every gradient (2(P−1)/P × payload), or what a self-communicating optimizer counted
(its compressed exchange and momentum syncs). Times are host wall-clock seconds per step:
time_exchange_s and time_momentum_sync_s as the optimizer measured them (it waits for its
collectives), time_compute_s the rest of the step (forward, backward, and DDP's all-reduce, which
overlaps the backward pass and cannot be told apart from it).
"""

from __future__ import annotations

from torch import nn
from torch.optim import Optimizer

from cosmocub.optim.collectives import CommStats, ring_allreduce_bytes


class CommMeter:
    def __init__(self, optimizer: Optimizer, model: nn.Module, *, data_size: int, ddp: bool):
        self.stats: CommStats | None = getattr(optimizer, "comm_stats", None)
        payload = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        self.ddp_bytes = ring_allreduce_bytes(payload, data_size) if ddp else 0.0
        self.steps, self.step_s = 0, 0.0
        if self.stats is not None:
            self.stats.reset()

    def add_step(self, seconds: float) -> None:
        self.steps += 1
        self.step_s += seconds

    def metrics(self) -> dict[str, float]:
        n = max(1, self.steps)
        s = self.stats or CommStats()
        return {
            "comm_bytes_per_step": self.ddp_bytes + s.bytes_sent / n,
            "time_compute_s": max(0.0, self.step_s - s.exchange_s - s.momentum_sync_s) / n,
            "time_exchange_s": s.exchange_s / n,
            "time_momentum_sync_s": s.momentum_sync_s / n,
        }
