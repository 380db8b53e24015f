"""What a LionCub sends, as one description: the exchange plan. Per bucket, in exchange order,
the collectives one rank runs (which, over which group, how many bytes it sends in each, in
what order, whether the bucket starts in backward), and the collectives of one momentum sync.

`plan_exchange` builds it from the settings, the buckets' tensor sizes and the data axis over
the nodes; LionCub builds one and `optim.exchange` runs it, and the performance model
(`perfmodel.cost_model.step_model`) prices the same object, so the two cannot drift. Flat and
two-level (hierarchy "node", optim.hierarchy) are two plans, not two code paths to keep alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from cosmocub.optim.collectives import ring_allreduce_bytes, vote_phase_bytes
from cosmocub.optim.lion_cub_settings import LionCubSettings
from cosmocub.optim.momentum_sync import is_sync_step
from cosmocub.optim.quantize import quantizer_levels, wire_bits
from cosmocub.optim.wire import WireSpec

FP32_BYTES = 4
STAT_BYTES = 8  # a scaled quantizer's per-tensor statistics travel in float64 (hierarchy.py)
# The groups a plan's collectives run over: every data rank (flat); the data ranks of my node,
# and my rail (my local index on every node), under hierarchy node.
GROUPS = ("data", "node", "rail")


@dataclass(frozen=True, kw_only=True)
class Transfer:
    """One collective one rank runs: its kind (a network's name for it), its group (GROUPS), the
    group's size, the data ranks between neighbours in it (1, or G on a rail) and the bytes this
    rank sends in it (ring algorithms, padding included, as the collectives count them).
    `overlaps_backward`: launched asynchronously in backward (an overlapped bucket's first vote
    phase; what `start` runs before it, and what `finish` runs after backward, blocks)."""

    collective: str  # allreduce, allgather, alltoall, reducescatter
    group: str
    group_size: int
    data_stride: int
    sent_bytes: float
    overlaps_backward: bool = False


@dataclass(frozen=True, kw_only=True)
class BucketPlan:
    """One bucket's exchange: its tensors and values, and the values this rank quantizes and
    votes on (the bucket, or its node slice), then its collectives in the order they run."""

    tensors: int
    elements: int
    voted_elements: int
    transfers: tuple[Transfer, ...]

    @property
    def sent_bytes(self) -> float:
        return sum(t.sent_bytes for t in self.transfers)


@dataclass(frozen=True, kw_only=True)
class ExchangePlan:
    """Every bucket's exchange in order, and one momentum sync (run on the schedule's steps)."""

    hierarchy: str  # "flat" or "node" as run: node only where it differs from flat
    data_ranks: int  # P
    data_per_node: int  # G (1 under flat where the layout is not known)
    voters: int  # P, or the nodes P / G under hierarchy node
    wire: WireSpec  # the levels the voters' sum allows
    collective: str
    overlap: bool  # each bucket's exchange starts in backward, when its gradients are ready
    buckets: tuple[BucketPlan, ...]
    momentum_sync: tuple[Transfer, ...]  # one sync of every synced momentum
    sync_schedule: tuple[str, int, float]  # (schedule, every, k), as momentum_sync.is_sync_step

    @property
    def two_level(self) -> bool:
        return self.hierarchy == "node"

    @property
    def exchange_bytes(self) -> float:
        """Bytes one rank sends in one step's exchange (every bucket), momentum syncs apart."""
        return sum(b.sent_bytes for b in self.buckets)

    @property
    def sync_bytes(self) -> float:
        """Bytes one rank sends in one momentum sync."""
        return sum(t.sent_bytes for t in self.momentum_sync)

    def is_sync_step(self, step: int) -> bool:
        schedule, every, k = self.sync_schedule
        return is_sync_step(step, schedule=schedule, every=every, k=k)

    def sync_fraction(self, steps: int) -> float:
        """The share of steps 1..`steps` after which momenta are averaged."""
        if not self.momentum_sync:
            return 0.0
        return sum(self.is_sync_step(s) for s in range(1, steps + 1)) / steps


def bucket_elements(bucket_mb: float) -> int:
    """fp32 values one exchange bucket holds (`bucket_mb` MiB of them)."""
    return int(bucket_mb * 2**20 / FP32_BYTES)


def split_into_buckets(
    sizes: Sequence[int], cap_elements: int, kinds: Sequence[object] | None = None
) -> list[list[int]]:
    """Indices of the tensors (`sizes` values each, in registration order) in each bucket: in
    reverse registration order ≈ the order backward produces gradients (as DDP buckets), a new
    bucket where the cap would be passed or the kind (dtype and device) changes."""
    kinds = kinds if kinds is not None else [None] * len(sizes)
    out: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(sizes))):
        same_kind = not current or kinds[i] == kinds[current[0]]
        if current and (size + sizes[i] > cap_elements or not same_kind):
            out.append(current)
            current, size = [], 0
        current.append(i)
        size += sizes[i]
    if current:
        out.append(current)
    return out


def bucket_tensor_sizes(sizes: Sequence[int], bucket_mb: float) -> list[list[int]]:
    """The buckets of one parameter group of fp32 tensors of `sizes` values: each bucket's
    tensor sizes, in exchange order."""
    buckets = split_into_buckets(sizes, bucket_elements(bucket_mb))
    return [[sizes[i] for i in bucket] for bucket in buckets]


def node_slice_elements(num_values: int, ranks_in_node: int) -> int:
    """Each local rank's slice of a bucket in the two-level exchange: the bucket padded to a
    multiple of 8·G (whole bytes of the 1-bit all-gather on every rank), split G ways."""
    g = ranks_in_node
    return (num_values + (-num_values % (8 * g))) // g


def node_sum_slice_elements(num_values: int, ranks_in_node: int) -> int:
    """The slice of a momentum sync by node (reduce-scatter, the rail's all-reduce,
    all-gather): the values padded to a multiple of G, split G ways."""
    g = ranks_in_node
    return (num_values + (-num_values % g)) // g


def plan_exchange(
    settings: LionCubSettings,
    buckets: Sequence[Sequence[int]],
    *,
    data_ranks: int,
    data_per_node: int,
    synced_elements: int,
    value_bytes: int = FP32_BYTES,
) -> ExchangePlan:
    """The plan of `settings` over `data_ranks` data ranks, `data_per_node` (G) of them a node,
    for `buckets` (each bucket's tensor sizes, in exchange order) and `synced_elements` momentum
    values averaged at a sync; parameters of `value_bytes` each. Two levels where hierarchy is
    node and the data ranks span several nodes of several ranks. ValueError where G does not
    divide the data ranks, or the voters' sum keeps no level (quantize.LevelsError)."""
    p, g = data_ranks, min(data_per_node, data_ranks)
    if p % g:
        raise ValueError(f"LionCub: data_ranks_per_node {g} does not divide the group's {p} ranks")
    nodes = p // g
    two_level = settings.hierarchy == "node" and g > 1 and nodes > 1
    voters = nodes if two_level else p
    kind = {"collective": settings.collective, "allreduce_dtype": settings.wire_dtype}
    levels = quantizer_levels(settings.quantizer, settings.bits, voters, **kind)
    wire = WireSpec(
        settings.quantizer, levels, wire_bits(settings.quantizer, levels), settings.wire_dtype
    )

    def vote(n: int, group: str, size: int, stride: int) -> list[Transfer]:
        phases = vote_phase_bytes(num_values=n, bits=wire.bits, group_size=size, **kind)
        out = [_transfer(c, group, size, stride, sent) for c, sent in phases.items()]
        if out and settings.overlap:  # the collectives' `start` launches the first phase
            out[0] = dataclasses.replace(out[0], overlaps_backward=True)
        return out

    planned = []
    for sizes in buckets:
        n = sum(sizes)
        if not two_level:
            transfers = tuple(vote(n, "data", p, 1))
            planned.append(
                BucketPlan(tensors=len(sizes), elements=n, voted_elements=n, transfers=transfers)
            )
            continue
        m = node_slice_elements(n, g)
        # c's node mean (fp32 reduce-scatter), a scaled quantizer's per-tensor statistics
        # (l0: log sums and counts), the vote on my slice over my rail, the 1-bit votes shared.
        steps = [_transfer("reducescatter", "node", g, 1, (g - 1) * m * value_bytes)]
        if settings.quantizer != "sign":
            stats = len(sizes) * (2 if settings.quantizer == "l0" else 1) * STAT_BYTES
            steps.append(_transfer("allreduce", "node", g, 1, ring_allreduce_bytes(stats, g)))
        steps += vote(m, "rail", nodes, g)
        steps.append(_transfer("allgather", "node", g, 1, (g - 1) * m / 8.0))
        planned.append(
            BucketPlan(tensors=len(sizes), elements=n, voted_elements=m, transfers=tuple(steps))
        )
    return ExchangePlan(
        hierarchy="node" if two_level else "flat",
        data_ranks=p,
        data_per_node=g,
        voters=voters,
        wire=wire,
        collective=settings.collective,
        overlap=settings.overlap,
        buckets=tuple(planned),
        momentum_sync=_momentum_sync(synced_elements, value_bytes, p, g, two_level),
        sync_schedule=(settings.momentum_sync, settings.sync_every, settings.sync_k),
    )


def _momentum_sync(
    synced: int, value_bytes: int, p: int, g: int, two_level: bool
) -> tuple[Transfer, ...]:
    """One average of `synced` momentum values: an all-reduce over the data ranks, or by node
    (reduce-scatter in the node, the slice's all-reduce over the rail, all-gather in the node)."""
    if p == 1 or synced == 0:
        return ()
    if not two_level:
        payload = synced * value_bytes
        return (_transfer("allreduce", "data", p, 1, ring_allreduce_bytes(payload, p)),)
    nodes = p // g
    slice_bytes = value_bytes * node_sum_slice_elements(synced, g)
    rail = ring_allreduce_bytes(slice_bytes, nodes)
    return (
        _transfer("reducescatter", "node", g, 1, (g - 1) * slice_bytes),
        _transfer("allreduce", "rail", nodes, g, rail),
        _transfer("allgather", "node", g, 1, (g - 1) * slice_bytes),
    )


def _transfer(collective: str, group: str, size: int, data_stride: int, sent: float) -> Transfer:
    return Transfer(
        collective=collective,
        group=group,
        group_size=size,
        data_stride=data_stride,
        sent_bytes=float(sent),
    )
