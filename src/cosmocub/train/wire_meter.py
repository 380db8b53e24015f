"""Bytes on the wire per step: the network interface's own transmit counter over an epoch.

When GLOO_SOCKET_IFNAME names the interface the ranks talk over (emulated nodes set it, see
`cosmocub.netemu`; so do some clusters), every rank reads that interface's tx_bytes (in
/proc/net/dev) at the start and the end of the epoch's steps, so start-up traffic (rendezvous, DDP's
first broadcast) and validation stay out. Each read follows a tiny all-reduce over all ranks: a rank
can finish a collective while its own last bytes still wait in its link's queue (it needs its peers'
data, not their receipt of its own), and they would land in the next window (seen: 0.99x the counted
bytes at 100 Mbit/s); the all-reduce's ring goes through each peer, which sends on only after
receiving what this rank sent before, so what the steps sent has left by then.

The counter is the node's, shared by its ranks, and includes all framing (TCP/IP/Ethernet
headers, ACKs of what the node received). The epoch's metric is the mean over ranks — the mean
over nodes when every node runs the same number of ranks — of the node's tx bytes per step: with
one rank per node it compares directly with comm_bytes_per_step. Without such an interface the
metric is absent. NCCL traffic over InfiniBand is not counted.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

from cosmocub.parallel.parallel_dims import ParallelDims

INTERFACE_ENV = "GLOO_SOCKET_IFNAME"


def read_tx_bytes(interface: str) -> int | None:
    """The interface's transmitted bytes, None when this network namespace has no such one.

    From /proc/net/dev, which answers for the reader's network namespace, not from sysfs, which
    answers for its mounter's: a rank that entered a node's namespace by `nsenter --net` (the
    slurmd of an emulated node, scripts/slurm-emulated-nodes.sh) sees the machine's sysfs."""
    try:
        lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    except OSError:
        return None
    for line in lines:
        name, _, counters = line.partition(":")
        if name.strip() == interface:
            # receive: bytes packets errs drop fifo frame compressed multicast; then transmit
            return int(counters.split()[8])
    return None


def _settle(dims: ParallelDims) -> None:
    if dims.world_size > 1:
        dist.all_reduce(torch.zeros(1, device=dims.device), group=dims.world_group)


class WireMeter:
    """Start before the epoch's first step, `metrics(steps)` after its last (on every rank: both
    join collectives over the whole mesh)."""

    def __init__(self, dims: ParallelDims) -> None:
        self.dims = dims
        self.interface = os.environ.get(INTERFACE_ENV, "").split(",")[0]
        _settle(dims)
        self.start = read_tx_bytes(self.interface) if self.interface else None

    def metrics(self, steps: int) -> dict[str, float]:
        _settle(self.dims)
        end = read_tx_bytes(self.interface) if self.start is not None else None
        per_step = (end - self.start) / steps if end is not None and steps else 0.0
        have = 1.0 if end is not None and steps else 0.0
        both = torch.tensor([per_step, have], dtype=torch.float64, device=self.dims.device)
        world = self.dims.world_size
        if world > 1:
            # Every rank joins (a rank without the counter adds 0, 0), so none waits alone.
            dist.all_reduce(both, group=self.dims.world_group)
        total, ranks_with = both.tolist()
        if ranks_with < world:
            return {}
        return {"wire_bytes_per_step": total / world}
