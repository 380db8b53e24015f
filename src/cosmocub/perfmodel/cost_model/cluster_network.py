"""A GPU cluster's links as the step model asks for them: each collective of a group of ranks
priced as NCCL runs it (perfmodel.cost_model.nccl_collectives), the group laid out as
ParallelDims lays ranks out (consecutive ranks share a node; a group `stride` apart has
ranks_per_node ÷ stride of its ranks on each node it spans, each on its own GPU's NIC: rails).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cosmocub.parallel.node_layout import pairwise_inter_fraction, ring_inter_fraction
from cosmocub.perfmodel.cost_model.nccl_collectives import (
    Choice,
    NcclNode,
    alltoall_time_us,
    choose,
    sendrecv_time_us,
)


@dataclass(frozen=True, kw_only=True)
class NcclNetwork:
    """The links of nodes of `node.ranks_per_node` GPUs: NCCL's choice and time per collective
    (the same interface as topology.Network's α–β: collective_s and sent_s)."""

    node: NcclNode

    @property
    def ranks_per_node(self) -> int:
        return self.node.ranks_per_node

    def spans_nodes(self, group_size: int, stride: int) -> bool:
        return group_size * stride > self.ranks_per_node

    def layout(self, group_size: int, stride: int) -> tuple[int, int]:
        """(nodes, ranks a node) of a group of `group_size` ranks `stride` apart."""
        if not self.spans_nodes(group_size, stride):
            return 1, group_size
        per_node = max(1, min(group_size, self.ranks_per_node // stride))
        return math.ceil(group_size / per_node), per_node

    def inter_fraction(self, kind: str, group_size: int, stride: int) -> float:
        """Of the bytes a rank sends, the share through the node's NICs: a ring crosses each
        node boundary once (1/ranks a node of its hops: node_layout.ring_inter_fraction, the
        count the training's meters use), an all-to-all (P − ranks a node)/(P − 1) of what it
        sends, one equal chunk to each peer (node_layout.pairwise_inter_fraction, as the
        optimizer's meters count it), a halo face that spans nodes all of it."""
        nodes, per_node = self.layout(group_size, stride)
        if nodes == 1:
            return 0.0
        ranks = nodes * per_node
        if kind == "alltoall":
            return pairwise_inter_fraction(ranks, per_node)
        if kind == "halo":
            return 1.0
        return ring_inter_fraction(ranks, per_node)

    def choice(self, kind: str, nbytes: float, group_size: int, stride: int = 1) -> Choice:
        """NCCL's algorithm, protocol and time for a ring/tree collective (allreduce, allgather,
        reducescatter) of `nbytes` as NCCL counts them (the buffer, or the gathered total)."""
        nodes, per_node = self.layout(group_size, stride)
        return choose(self.node, kind, nbytes, nodes * per_node, nodes)

    def collective_s(self, kind: str, nbytes: float, group_size: int, stride: int = 1) -> float:
        """Seconds of one collective, `nbytes` as rounds_and_bytes takes them (the all-reduced
        buffer, the gathered total, the all-to-all buffer, one halo face)."""
        if group_size == 1:
            return 0.0
        nodes, per_node = self.layout(group_size, stride)
        if kind == "alltoall":
            return 1e-6 * alltoall_time_us(self.node, nbytes, nodes * per_node, nodes)
        if kind == "halo":  # both faces at once: one latency, twice the bytes on the rank's link
            across = self.spans_nodes(group_size, stride)
            return 1e-6 * sendrecv_time_us(self.node, 2 * nbytes, across_nodes=across)
        return self.choice(kind, nbytes, group_size, stride).seconds

    def sent_s(self, kind: str, sent_bytes: float, group_size: int, stride: int = 1) -> float:
        """Seconds of one collective given the bytes one rank sends in it (a ring's count:
        2(P−1)/P of the buffer for an all-reduce, (P−1)/P of the total otherwise)."""
        p = group_size
        if p == 1:
            return 0.0
        if kind == "allreduce":
            nbytes = sent_bytes * p / (2 * (p - 1))
        elif kind == "halo":
            nbytes = sent_bytes / 2
        else:
            nbytes = sent_bytes * p / (p - 1)
        return self.collective_s(kind, nbytes, group_size, stride)
