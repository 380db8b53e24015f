"""Per-epoch communication and time breakdown of the training step, the same for every optimizer.

comm_bytes_per_step: bytes this rank sends per step for gradients and updates — the gradient
sync's fp32 ring all-reduce (2(P−1)/P × payload over its group: DDP over the data group, or over
the whole mesh when spatial > 1; the spatial average ahead of a self-communicating optimizer)
plus what such an optimizer counted (its compressed exchange and momentum syncs).
comm_bytes_intra_per_step and comm_bytes_inter_per_step: its parts sent to ranks on this node and
to other nodes (Lion Cub counts them by its groups; a ring over ranks on several nodes crosses
each node once, counted as 1/G of every rank's bytes on a node of G; see parallel/node_layout.py).
halo_bytes_per_step: bytes this rank's halo exchanges send per step under a spatial split (the
planes sent to neighbours in forward, and their gradients sent back in backward), apart from
comm_bytes_per_step because they are activations. The feature gather before the head and the
batch-norm statistics are not counted in either.
Times are seconds per step on the device's clock (`parallel/timing.py`: the host's on a CPU;
CUDA events on a GPU, read here once an epoch, so timing never stalls the device's queue):
time_exchange_s what the step waited for its exchange: what the optimizer measured (it waits for
its collectives) plus what the gradient sync made the step wait (`grad_sync.exchange_s`: under
train.ddp_exchange_timing = overlapped the part of DDP's all-reduce left once backward has
handed over its last bucket, under blocking every bucket's whole all-reduce; the spatial
average); time_exchange_busy_s how long that exchange ran, overlapped with backward or not
(DDP overlapped: while some bucket's all-reduce was in flight, from its launch to its
completion; otherwise = time_exchange_s);
time_momentum_sync_s as the optimizer measured it, time_halo_s as the halo exchange measured
itself (`parallel/halo.py`), time_compute_s the rest of the step (forward, backward, with the
part of an overlapped all-reduce that ran under it), so the four add up to the step.
time_phase_<name>_s (Lion Cub / Distributed Lion only): the exchange's parts as the optimizer
timed them per step in host seconds (`quantize`, `encode`, the collectives' waits, `vote`; see
`optim/collectives.py`; on a GPU, the host's share only); without overlap they add up to
time_exchange_s but for the loop around them.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.optim import Optimizer

from cosmocub.optim.collectives import CommStats
from cosmocub.parallel.halo import HaloStats
from cosmocub.parallel.layers import halo_stats
from cosmocub.parallel.timing import Clock, Spans
from cosmocub.train.grad_sync import GradientSync


class CommMeter:
    def __init__(self, optimizer: Optimizer, model: nn.Module, grad_sync: GradientSync):
        self.stats: CommStats | None = getattr(optimizer, "comm_stats", None)
        payload = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        self.sync_bytes = grad_sync.bytes_sent_per_step(payload)
        self.sync_inter_bytes = self.sync_bytes * grad_sync.inter_node_fraction
        self.grad_sync = grad_sync
        self.sync_exchange_start, self.sync_busy_start = (
            grad_sync.exchange_s,
            grad_sync.exchange_busy_s,
        )
        self.steps, self.step = 0, Spans()
        if self.stats is not None:
            self.stats.reset()
        self.halo = halo_stats(model) or HaloStats()
        self.halo.reset()  # also drops what validation's forward passes sent

    def add_step(self, clock: Clock, start: Any, end: Any) -> None:
        """One step from mark `start` to mark `end` of `clock` (the device's, as the parts')."""
        self.steps += 1
        self.step.add(clock, start, end)

    def metrics(self) -> dict[str, float]:
        n = max(1, self.steps)
        s = self.stats or CommStats()
        own = s.exchange_s  # the optimizer's: what it waited is what ran (overlap not timed)
        exchange_s = own + self.grad_sync.exchange_s - self.sync_exchange_start
        busy_s = own + self.grad_sync.exchange_busy_s - self.sync_busy_start
        measured = exchange_s + s.momentum_sync_s + self.halo.seconds
        return {
            "comm_bytes_per_step": self.sync_bytes + s.bytes_sent / n,
            "comm_bytes_intra_per_step": self.sync_bytes
            - self.sync_inter_bytes
            + s.bytes_intra / n,
            "comm_bytes_inter_per_step": self.sync_inter_bytes + s.bytes_inter / n,
            "halo_bytes_per_step": self.halo.bytes_sent / n,
            "time_compute_s": max(0.0, self.step.seconds - measured) / n,
            "time_exchange_s": exchange_s / n,
            "time_exchange_busy_s": busy_s / n,
            "time_momentum_sync_s": s.momentum_sync_s / n,
            "time_halo_s": self.halo.seconds / n,
            **{f"time_phase_{k}_s": v / n for k, v in sorted(s.phase_s.items())},
        }
