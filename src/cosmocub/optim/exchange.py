"""Lion Cub's exchange, one object: how the data ranks agree on sign(Σ quantized c) and average
their momenta, flat (one vote over the data group) or two-level (hierarchy "node": c averaged in
the node, the vote across nodes on each local rank's slice, optim.hierarchy). LionCub
(optim.lion_cub) keeps the bookkeeping and calls `start`, `finish` and `average_momenta`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cosmocub.optim.collectives import (
    CommStats,
    Pending,
    build_collective,
    ring_allreduce_bytes,
)
from cosmocub.optim.hierarchy import NodeSlice, TwoLevel
from cosmocub.optim.momentum_sync import average_momenta
from cosmocub.optim.quantize import quantize, quantizer_levels, wire_bits
from cosmocub.optim.wire import WireSpec
from cosmocub.parallel.node_layout import ring_inter_fraction

HIERARCHIES = ("flat", "node")


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
    """One vote over `group`, the data ranks (None: a group of one), `data_per_node` of them a
    node for the intra/inter-node byte split."""

    two_level = False

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        *,
        collective: str,
        stats: CommStats,
        data_per_node: int,
    ) -> None:
        self.group, self.stats, self.data_per_node = group, stats, data_per_node
        self.size = 1 if group is None else dist.get_world_size(group)
        self.collective = build_collective(collective, group, stats, data_per_node)
        self.spec = WireSpec("sign", 1, 1, "int8")  # set by `wire_spec`

    @property
    def voters(self) -> str:
        return f"{self.size} data ranks"

    def wire_spec(
        self, quantizer: str, bits: int, *, collective: str, allreduce_dtype: str
    ) -> WireSpec:
        """What goes on the wire: the levels that the voters' sum allows (quantizer_levels)."""
        levels = quantizer_levels(
            quantizer,
            bits,
            self.collective.size,
            collective=collective,
            allreduce_dtype=allreduce_dtype,
        )
        self.spec = WireSpec(quantizer, levels, wire_bits(quantizer, levels), allreduce_dtype)
        return self.spec

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
        return self.collective.finish(pending, self.spec)

    def average_momenta(self, momenta: Sequence[torch.Tensor]) -> None:
        """Every data rank's momenta replaced by their mean over the group (one all-reduce)."""

        def all_reduce_sum(x: torch.Tensor) -> None:
            dist.all_reduce(x, group=self.group)

        payload = average_momenta(momenta, all_reduce_sum, self.size)
        inter = ring_inter_fraction(self.size, self.data_per_node)
        self.stats.add_bytes(ring_allreduce_bytes(payload, self.size), inter)


class TwoLevelExchange(FlatExchange):
    """hierarchy "node": c averaged in fp32 over node_groups[0] (the data ranks on my node),
    the vote across nodes on 1/G of it over node_groups[1] (my rail), the votes shared in the
    node (optim.hierarchy); levels from the number of nodes."""

    two_level = True

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        node_groups: tuple[dist.ProcessGroup, dist.ProcessGroup],
        *,
        collective: str,
        stats: CommStats,
        data_per_node: int,
    ) -> None:
        super().__init__(group, collective=collective, stats=stats, data_per_node=data_per_node)
        self.nodes = self.size // data_per_node
        self.node = TwoLevel(node_groups[0], stats)
        self.rail = node_groups[1]
        # The vote is over the rail (one data rank a node), not the whole group.
        self.collective = build_collective(collective, self.rail, stats)

    @property
    def voters(self) -> str:
        return f"{self.nodes} nodes"

    def new_wire(
        self, sizes: list[int], ties: tuple[torch.Tensor, torch.Tensor], momentum: torch.Tensor
    ) -> BucketWire:
        empty = torch.zeros(0, dtype=torch.int8, device=momentum.device)
        work = momentum.new_zeros(0) if self.spec.quantizer != "sign" else momentum[:0]
        wire = BucketWire(list(sizes), ties, empty, work)
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

        def two_level_sum(x: torch.Tensor) -> None:
            self.node.sum_over_nodes(x, self.rail, self.nodes)  # counts its own bytes

        average_momenta(momenta, two_level_sum, self.size)


def build_exchange(
    group: dist.ProcessGroup | None,
    *,
    collective: str,
    stats: CommStats,
    data_ranks_per_node: int | None,
    hierarchy: str,
    node_groups: tuple[dist.ProcessGroup, dist.ProcessGroup] | None,
) -> FlatExchange:
    """The exchange over `group`: two-level where hierarchy is "node" and the group spans
    several nodes of several data ranks (elsewhere that is the flat vote exactly); ValueError
    where data_ranks_per_node does not divide the group or node_groups do not fit."""
    if hierarchy not in HIERARCHIES:
        raise ValueError(f"LionCub: unknown hierarchy {hierarchy!r} ({', '.join(HIERARCHIES)})")
    size = 1 if group is None else dist.get_world_size(group)
    per_node = min(data_ranks_per_node or 1, size)
    if size % per_node:
        raise ValueError(
            f"LionCub: data_ranks_per_node {per_node} does not divide the group's {size} ranks"
        )
    nodes = size // per_node
    if hierarchy == "flat" or per_node == 1 or nodes == 1:
        return FlatExchange(group, collective=collective, stats=stats, data_per_node=per_node)
    sizes = None if node_groups is None else [dist.get_world_size(g) for g in node_groups]
    if node_groups is None or sizes != [per_node, nodes]:
        raise ValueError(
            f"LionCub: hierarchy 'node' over {nodes} nodes × {per_node} "
            f"ranks needs node_groups (intra-node, rail) of those sizes, got {sizes}"
        )
    return TwoLevelExchange(
        group, node_groups, collective=collective, stats=stats, data_per_node=per_node
    )
