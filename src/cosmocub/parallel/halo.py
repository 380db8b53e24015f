"""Halo exchange for a volume split into blocks over the spatial group: an autograd Function.

Each rank pads its block (B, C, d, h, w) with `width` planes from its neighbours along every dim
that has a halo; the backward pass sends the halo gradients back to their owners, which add them.
What a rank sends and how long the exchanges take are counted in the plan's `HaloStats` (on the
device's clock, `parallel/timing.py`: CUDA events on a GPU, read once an epoch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from cosmocub.config import SPATIAL_DIMS
from cosmocub.parallel.timing import Spans, clock_for

# Tags keep the two messages of one swap apart when both neighbours are the same rank (a periodic
# split of 2); gloo matches on them, NCCL matches by issue order, which `_swap` also keeps right.
_TAG_TO_LOW, _TAG_TO_HIGH = 11, 12


def spatial_coords(group_rank: int, split: tuple[int, int, int]) -> tuple[int, int, int]:
    """Block coordinates (cd, ch, cw) of a spatial-group rank: row-major over (sd, sh, sw)."""
    sd, sh, sw = split
    if not 0 <= group_rank < sd * sh * sw:
        raise ValueError(f"spatial rank {group_rank} outside split {list(split)}")
    return group_rank // (sh * sw), (group_rank // sw) % sh, group_rank % sw


def spatial_rank(coords: tuple[int, int, int], split: tuple[int, int, int]) -> int:
    """The spatial-group rank owning the block at `coords` (inverse of `spatial_coords`)."""
    cd, ch, cw = coords
    return (cd * split[1] + ch) * split[2] + cw


@dataclass
class HaloStats:
    """What this rank's halo exchanges sent (bytes of the planes it sent to other ranks; a
    periodic wrap of an unsplit dim stays local) and how long they took (the forward and
    backward exchange: slab copies, transfer, wait, concatenation; host time on a CPU, device
    time between CUDA events on a GPU), since the last reset. The training loop reads it per
    epoch (`train/comm_meter.py`)."""

    bytes_sent: int = 0
    spans: Spans = field(default_factory=Spans)

    @property
    def seconds(self) -> float:
        return self.spans.seconds

    def reset(self) -> None:
        self.bytes_sent = 0
        self.spans.reset()


@dataclass(frozen=True)
class HaloPlan:
    """Who this rank's neighbours are and how wide the halo is along each spatial dim.

    widths[d] = 0: no halo along dim d (the conv zero-pads it itself). A dim with split 1 and a
    halo is periodic and wraps locally; a split dim trades planes with its neighbours, and at the
    global boundary gets zeros, or wraps round when `periodic`.
    """

    group: dist.ProcessGroup | None
    split: tuple[int, int, int]
    coords: tuple[int, int, int]
    widths: tuple[int, int, int]
    periodic: bool
    # Shared by every layer built on this plan; mutable, so not part of the plan's identity.
    stats: HaloStats = field(default_factory=HaloStats, compare=False, repr=False)

    def __post_init__(self) -> None:
        for d, (n, w) in enumerate(zip(self.split, self.widths, strict=True)):
            if n == 1 and w and not self.periodic:
                raise ValueError(f"{SPATIAL_DIMS[d]}: a halo on an unsplit dim must be periodic")

    def peers(self, d: int) -> tuple[int | None, int | None]:
        """Spatial-group ranks of the low and high neighbour along dim d (None at a wall)."""
        n, c = self.split[d], self.coords[d]
        out: list[int | None] = []
        for step in (-1, 1):
            k = c + step
            if not self.periodic and not 0 <= k < n:
                out.append(None)
                continue
            coords = list(self.coords)
            coords[d] = k % n
            out.append(spatial_rank((coords[0], coords[1], coords[2]), self.split))
        return out[0], out[1]

    @property
    def num_ranks(self) -> int:
        return math.prod(self.split)


def _swap(
    to_low: torch.Tensor, to_high: torch.Tensor, plan: HaloPlan, d: int
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Send `to_low` to the low neighbour and `to_high` to the high one along dim d; return
    (from_low, from_high): what the low neighbour sent high and the high neighbour sent low."""
    low, high = plan.peers(d)
    from_low = torch.empty_like(to_high) if low is not None else None
    from_high = torch.empty_like(to_low) if high is not None else None
    ops: list[dist.P2POp] = []
    # Order per peer: our send to it precedes our receive from it exactly when its matching
    # receive precedes its send, so NCCL's in-order matching pairs the right buffers.
    if low is not None:
        ops.append(
            dist.P2POp(dist.isend, to_low, group=plan.group, group_peer=low, tag=_TAG_TO_LOW)
        )
    if high is not None:
        ops.append(
            dist.P2POp(dist.irecv, from_high, group=plan.group, group_peer=high, tag=_TAG_TO_LOW)
        )
        ops.append(
            dist.P2POp(dist.isend, to_high, group=plan.group, group_peer=high, tag=_TAG_TO_HIGH)
        )
    if low is not None:
        ops.append(
            dist.P2POp(dist.irecv, from_low, group=plan.group, group_peer=low, tag=_TAG_TO_HIGH)
        )
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    for peer, sent in ((low, to_low), (high, to_high)):
        if peer is not None:
            plan.stats.bytes_sent += sent.numel() * sent.element_size()
    return from_low, from_high


def _pad_dim(x: torch.Tensor, d: int, plan: HaloPlan) -> torch.Tensor:
    dim, w = 2 + d, plan.widths[d]
    n = x.shape[dim]
    first, last = x.narrow(dim, 0, w), x.narrow(dim, n - w, w)
    if plan.split[d] == 1:  # periodic along an unsplit dim: our own far side
        return torch.cat([last, x, first], dim)
    from_low, from_high = _swap(first.contiguous(), last.contiguous(), plan, d)
    low = from_low if from_low is not None else torch.zeros_like(first)
    high = from_high if from_high is not None else torch.zeros_like(last)
    return torch.cat([low, x, high], dim)


def _unpad_dim(g: torch.Tensor, d: int, plan: HaloPlan) -> torch.Tensor:
    """The adjoint of `_pad_dim`: strip the halo along d and add its gradient to its owner."""
    dim, w = 2 + d, plan.widths[d]
    n = g.shape[dim] - 2 * w
    g_low, g_high = g.narrow(dim, 0, w), g.narrow(dim, n + w, w)
    inner = g.narrow(dim, w, n).clone(memory_format=torch.contiguous_format)
    if plan.split[d] == 1:
        inner.narrow(dim, n - w, w).add_(g_low)
        inner.narrow(dim, 0, w).add_(g_high)
        return inner
    from_low, from_high = _swap(g_low.contiguous(), g_high.contiguous(), plan, d)
    if from_low is not None:  # the low neighbour's high-halo gradient: our first planes
        inner.narrow(dim, 0, w).add_(from_low)
    if from_high is not None:
        inner.narrow(dim, n - w, w).add_(from_high)
    return inner


class _HaloExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_bcdhw: torch.Tensor, plan: HaloPlan) -> torch.Tensor:  # type: ignore[override]
        ctx.plan = plan
        clock = clock_for(x_bcdhw.device)
        start = clock.mark()
        # Dims one after another, each padding the halos already received: the second exchange
        # carries the first one's halo planes along, which fills edges and corners.
        for d in range(3):
            if plan.widths[d]:
                x_bcdhw = _pad_dim(x_bcdhw, d, plan)
        plan.stats.spans.add(clock, start, clock.mark())
        return x_bcdhw

    @staticmethod
    def backward(ctx, g_bcdhw: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        plan = ctx.plan
        clock = clock_for(g_bcdhw.device)
        start = clock.mark()
        for d in reversed(range(3)):
            if plan.widths[d]:
                g_bcdhw = _unpad_dim(g_bcdhw, d, plan)
        plan.stats.spans.add(clock, start, clock.mark())
        return g_bcdhw, None


def halo_exchange(x_bcdhw: torch.Tensor, plan: HaloPlan) -> torch.Tensor:
    """(B, C, d, h, w) → (B, C, d + 2·wd, h + 2·wh, w + 2·ww), halos from the neighbours."""
    for d, w in enumerate(plan.widths):
        if w > x_bcdhw.shape[2 + d]:
            raise ValueError(
                f"halo of {w} along {SPATIAL_DIMS[d]} is wider than the local extent "
                f"{x_bcdhw.shape[2 + d]}"
            )
    return _HaloExchange.apply(x_bcdhw, plan)
