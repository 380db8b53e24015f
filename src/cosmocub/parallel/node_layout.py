"""Which ranks of the mesh share a node, as pure arithmetic on the sizes: the data axis's ranks on
one node (the intra-node group) and those with the same local place on the others (the rails).

Global rank = data index × spatial + spatial index (the mesh's row-major layout), and a node holds
G consecutive global ranks (torchrun's and srun's block layout). A node then holds whole spatial
groups (G a multiple of spatial: g = G / spatial data ranks a node) or a spatial group spans
whole nodes (spatial a multiple of G: g = 1); either way the data axis runs node by node, g ranks
each, so data index d is on node d // g and is local index d % g there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeLayout:
    """The data axis over the nodes: `nodes` of `data_per_node` (g) data ranks each, for every
    spatial index."""

    data: int
    spatial: int
    ranks_per_node: int  # G, every rank of the node (data × spatial ranks on it)

    def __post_init__(self) -> None:
        world, per_node = self.data * self.spatial, self.ranks_per_node
        if per_node < 1 or world % per_node:
            raise ValueError(
                f"ranks per node {per_node} does not divide the world of {world} ranks "
                f"(data {self.data} × spatial {self.spatial}): nodes would be uneven"
            )
        if per_node % self.spatial and self.spatial % per_node:
            raise ValueError(
                f"ranks per node {per_node} and spatial {self.spatial}: a node must hold whole "
                "spatial groups (a multiple of spatial) or a spatial group whole nodes (a "
                "divisor), else the data axis is not split evenly over the nodes"
            )

    @property
    def data_per_node(self) -> int:
        """g: the data ranks (of one spatial index) on a node."""
        return max(1, self.ranks_per_node // self.spatial)

    @property
    def nodes(self) -> int:
        """Nodes the data axis spans: data / g."""
        return self.data // self.data_per_node

    @property
    def two_level(self) -> bool:
        """Whether a two-level exchange differs from a flat one: g > 1 and more than one node."""
        return self.data_per_node > 1 and self.nodes > 1

    def global_rank(self, data_index: int, spatial_index: int) -> int:
        return data_index * self.spatial + spatial_index

    def intra_groups(self) -> list[list[int]]:
        """Global ranks of every intra-node data group (node k, spatial index s), in a fixed order
        that every rank builds alike (torch's new_group is a collective over the world)."""
        g = self.data_per_node
        return [
            [self.global_rank(k * g + j, s) for j in range(g)]
            for s in range(self.spatial)
            for k in range(self.nodes)
        ]

    def inter_groups(self) -> list[list[int]]:
        """Global ranks of every rail: local index j of spatial index s, on each node in order."""
        g = self.data_per_node
        return [
            [self.global_rank(k * g + j, s) for k in range(self.nodes)]
            for s in range(self.spatial)
            for j in range(g)
        ]


def ring_inter_fraction(group_size: int, per_node: int) -> float:
    """Of what a group's ranks send in a ring (all-gather, ring all-reduce) in group rank order,
    node by node `per_node` ranks each, the share that crosses nodes, per rank on average: each
    node has one rank whose successor is on the next node, so 1/per_node (0 on one node)."""
    return 0.0 if group_size <= per_node else 1.0 / per_node


def pairwise_inter_fraction(group_size: int, per_node: int) -> float:
    """The same for an all-to-all (one equal chunk to every peer): the P − g peers on other
    nodes of the P − 1."""
    return 0.0 if group_size <= 1 else (group_size - min(per_node, group_size)) / (group_size - 1)
