"""Lion Cub's exchange, run from its plan (optim.exchange_plan): how the data ranks agree on
sign(Σ quantized c) and average their momenta. A flat plan runs one vote over the data group; a
two-level plan (hierarchy "node") averages c in the node, votes across nodes on each local
rank's slice and shares the votes in the node (optim.hierarchy). Two runners, one per kind of
plan, with the same four methods; LionCub (optim.lion_cub) keeps the bookkeeping and calls them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cosmocub.optim.collectives import CommStats, Pending, build_collective, ring_allreduce_bytes
from cosmocub.optim.exchange_plan import ExchangePlan
from cosmocub.optim.hierarchy import NodeSlice, TwoLevel
from cosmocub.optim.momentum_sync import average_momenta
from cosmocub.optim.quantize import quantize
from cosmocub.parallel.node_layout import ring_inter_fraction


@dataclass
class BucketWire:
    """One bucket's buffers for the exchange, reused every step: the flat exchange quantizes
    the whole bucket (q, and a scaled quantizer's |c| in work); the two-level one its node slice
    (`node`, with buffers of its own)."""

    sizes: list[int]  # the bucket's tensors, laid end to end
    ties: tuple[torch.Tensor, torch.Tensor]  # tie pattern on even and odd steps
    q: torch.Tensor
    work: torch.Tensor
    node: NodeSlice | None = None


class FlatExchange:
    """A flat plan run over `group`, the data ranks (None: a group of one)."""

    def __init__(self, plan: ExchangePlan, group: dist.ProcessGroup | None, stats: CommStats):
        assert not plan.two_level, "a two-level plan runs in TwoLevelExchange"
        self.plan, self.group, self.stats = plan, group, stats
        self.spec = plan.wire
        self.collective = build_collective(plan.collective, group, stats, plan.data_per_node)

    def new_wire(
        self, sizes: list[int], ties: tuple[torch.Tensor, torch.Tensor], momentum: torch.Tensor
    ) -> BucketWire:
        n = momentum.numel()
        q = torch.zeros(n, dtype=torch.int8, device=momentum.device)
        work = momentum.new_zeros(n) if self.spec.quantizer != "sign" else momentum[:0]
        return BucketWire(list(sizes), ties, q, work)

    def start(self, c: torch.Tensor, wire: BucketWire, step: int, started: float) -> Pending:
        """Quantize c (the bucket's, spent here) and start the vote; `started` is when c's
        computation began (the "quantize" phase counts both)."""
        if self.spec.quantizer == "sign":
            wire.q.copy_(c.sign_())  # = quantize(c, "sign"), without a fresh tensor
        else:
            quantize(
                c,
                quantizer=self.spec.quantizer,
                levels=self.spec.levels,
                segments=wire.sizes,
                out=wire.q,
                work=wire.work,
            )
        self.stats.lap("quantize", started)  # c and its quantization, before the wire
        return self.collective.start(wire.q, wire.ties[step % 2], self.spec)

    def finish(self, pending: Pending, wire: BucketWire) -> torch.Tensor:
        """The bucket's voted update (±1, 0 where the vote ties on the tie pattern's side)."""
        del wire  # the flat vote's buffers travel in `pending`
        return self.collective.finish(pending, self.spec)

    def average_momenta(self, momenta: Sequence[torch.Tensor]) -> None:
        """Every data rank's momenta replaced by their mean over the group (one all-reduce)."""

        def all_reduce_sum(x: torch.Tensor) -> None:
            dist.all_reduce(x, group=self.group)

        size = self.plan.data_ranks
        payload = average_momenta(momenta, all_reduce_sum, size)
        inter = ring_inter_fraction(size, self.plan.data_per_node)
        self.stats.add_bytes(ring_allreduce_bytes(payload, size), inter)


class TwoLevelExchange:
    """A two-level plan: c averaged in fp32 over node_groups[0] (the data ranks on my node),
    the vote across nodes on 1/G of it over node_groups[1] (my rail), the votes shared in the
    node (optim.hierarchy); the levels are the plan's, from the number of nodes."""

    def __init__(
        self,
        plan: ExchangePlan,
        node_groups: tuple[dist.ProcessGroup, dist.ProcessGroup],
        stats: CommStats,
    ) -> None:
        assert plan.two_level, "a flat plan runs in FlatExchange"
        self.plan, self.stats = plan, stats
        self.spec = plan.wire
        self.node = TwoLevel(node_groups[0], stats)
        self.rail = node_groups[1]
        self.collective = build_collective(plan.collective, self.rail, stats)

    def new_wire(
        self, sizes: list[int], ties: tuple[torch.Tensor, torch.Tensor], momentum: torch.Tensor
    ) -> BucketWire:
        empty = torch.zeros(0, dtype=torch.int8, device=momentum.device)
        wire = BucketWire(list(sizes), ties, empty, momentum[:0])
        wire.node = self.node.new_slice(wire.sizes, ties, momentum)
        return wire

    def start(self, c: torch.Tensor, wire: BucketWire, step: int, started: float) -> Pending:
        assert wire.node is not None
        self.stats.lap("quantize", started)
        self.node.average(c, wire.node)
        q = self.node.quantize(wire.node, self.spec.quantizer, self.spec.levels)
        return self.collective.start(q, wire.node.ties[step % 2], self.spec)

    def finish(self, pending: Pending, wire: BucketWire) -> torch.Tensor:
        assert wire.node is not None
        return self.node.share(self.collective.finish(pending, self.spec), wire.node)

    def average_momenta(self, momenta: Sequence[torch.Tensor]) -> None:
        """The mean over every data rank, by node (reduce-scatter, rail all-reduce, gather)."""
        nodes = self.plan.voters

        def two_level_sum(x: torch.Tensor) -> None:
            self.node.sum_over_nodes(x, self.rail, nodes)  # counts its own bytes

        average_momenta(momenta, two_level_sum, self.plan.data_ranks)


Exchange = FlatExchange | TwoLevelExchange


def build_exchange(
    plan: ExchangePlan,
    group: dist.ProcessGroup | None,
    *,
    stats: CommStats,
    node_groups: tuple[dist.ProcessGroup, dist.ProcessGroup] | None,
) -> Exchange:
    """The runner of `plan` over `group` (the data ranks); ValueError where the group is not
    the plan's size, or a two-level plan's node_groups (intra-node, rail) do not fit it."""
    size = 1 if group is None else dist.get_world_size(group)
    if size != plan.data_ranks:
        raise ValueError(f"LionCub: a plan for {plan.data_ranks} data ranks, a group of {size}")
    if not plan.two_level:
        return FlatExchange(plan, group, stats)
    sizes = None if node_groups is None else [dist.get_world_size(g) for g in node_groups]
    if node_groups is None or sizes != [plan.data_per_node, plan.voters]:
        raise ValueError(
            f"LionCub: hierarchy 'node' over {plan.voters} nodes × {plan.data_per_node} "
            f"ranks needs node_groups (intra-node, rail) of those sizes, got {sizes}"
        )
    return TwoLevelExchange(plan, node_groups, stats)
