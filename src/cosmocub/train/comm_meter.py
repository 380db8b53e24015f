"""Per-epoch communication and time breakdown of the training step, the same for every optimizer.

comm_bytes_per_step: bytes this rank sends per step for gradients and updates — the gradient
sync's fp32 ring all-reduce (2(P−1)/P × payload over its group: DDP over the data group, or over
the whole mesh when spatial > 1; the spatial average ahead of a self-communicating optimizer)
plus what such an optimizer counted (its compressed exchange and momentum syncs).
halo_bytes_per_step: bytes this rank's halo exchanges send per step under a spatial split (the
planes sent to neighbours in forward, and their gradients sent back in backward), apart from
comm_bytes_per_step because they are activations. The feature gather before the head and the
batch-norm statistics are not counted in either.
Times are host wall-clock seconds per step:
time_exchange_s what the optimizer measured (it waits for its collectives) plus what the gradient
sync waited (`grad_sync.exchange_s`: DDP's bucket all-reduces under train.ddp_exchange_timing =
blocking, the spatial average), time_momentum_sync_s as the optimizer measured it, time_halo_s as
the halo exchange measured itself (`parallel/halo.py`), time_compute_s the rest of the step
(forward, backward, and DDP's all-reduce when "overlapped", which overlaps the backward pass and
cannot be told apart from it), so the four add up to the step.
time_phase_<name>_s (Lion Cub / Distributed Lion only): the exchange's parts as the optimizer
timed them per step (`quantize`, `encode`, the collectives' waits, `vote`; see
`optim/collectives.py`); without overlap they add up to time_exchange_s but for the loop around
them.
"""

from __future__ import annotations

from torch import nn
from torch.optim import Optimizer

from cosmocub.optim.collectives import CommStats
from cosmocub.parallel.halo import HaloStats
from cosmocub.parallel.layers import halo_stats
from cosmocub.train.grad_sync import GradientSync


class CommMeter:
    def __init__(self, optimizer: Optimizer, model: nn.Module, grad_sync: GradientSync):
        self.stats: CommStats | None = getattr(optimizer, "comm_stats", None)
        payload = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        self.sync_bytes = grad_sync.bytes_sent_per_step(payload)
        self.grad_sync, self.sync_exchange_start = grad_sync, grad_sync.exchange_s
        self.steps, self.step_s = 0, 0.0
        if self.stats is not None:
            self.stats.reset()
        self.halo = halo_stats(model) or HaloStats()
        self.halo.reset()  # also drops what validation's forward passes sent

    def add_step(self, seconds: float) -> None:
        self.steps += 1
        self.step_s += seconds

    def metrics(self) -> dict[str, float]:
        n = max(1, self.steps)
        s = self.stats or CommStats()
        exchange_s = s.exchange_s + self.grad_sync.exchange_s - self.sync_exchange_start
        measured = exchange_s + s.momentum_sync_s + self.halo.seconds
        return {
            "comm_bytes_per_step": self.sync_bytes + s.bytes_sent / n,
            "halo_bytes_per_step": self.halo.bytes_sent / n,
            "time_compute_s": max(0.0, self.step_s - measured) / n,
            "time_exchange_s": exchange_s / n,
            "time_momentum_sync_s": s.momentum_sync_s / n,
            "time_halo_s": self.halo.seconds / n,
            **{f"time_phase_{k}_s": v / n for k, v in sorted(s.phase_s.items())},
        }
