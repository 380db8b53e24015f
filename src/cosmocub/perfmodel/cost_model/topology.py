"""What a prediction runs on: the mesh of ranks (data × spatial split) and the network between
them (α–β per collective kind within a node and between nodes, shared by the streams that cross a
node's link at once).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from cosmocub.perfmodel.alpha_beta import KINDS, AlphaBeta, rounds_and_bytes


class Links(Protocol):
    """What the step model asks of a network: whether a group crosses a node's link, the
    seconds of one collective by its buffer (collective_s) or by the bytes a rank sends in it
    (sent_s), and the share of those bytes that leaves the node (inter_fraction). Network
    (α–β, fitted or assumed) and cluster_network.NcclNetwork (NCCL's model)."""

    @property
    def ranks_per_node(self) -> int: ...

    def spans_nodes(self, group_size: int, stride: int) -> bool: ...

    def collective_s(self, kind: str, nbytes: float, group_size: int, stride: int = 1) -> float: ...

    def sent_s(self, kind: str, sent_bytes: float, group_size: int, stride: int = 1) -> float: ...

    def inter_fraction(self, kind: str, group_size: int, stride: int) -> float: ...


@dataclass(frozen=True, kw_only=True)
class Network:
    """α–β per collective kind between nodes (per rank, at the node's link) and between ranks of
    one node, each fitted where it runs (cosmocub.perfmodel.measure.link_fits); a kind the model
    asks for and the mapping lacks is an error."""

    inter_node: Mapping[str, AlphaBeta]
    intra_node: Mapping[str, AlphaBeta]
    ranks_per_node: int

    @classmethod
    def uniform(cls, inter: AlphaBeta, intra: AlphaBeta, ranks_per_node: int) -> Network:
        return cls(
            inter_node=dict.fromkeys(KINDS, inter),
            intra_node=dict.fromkeys(KINDS, intra),
            ranks_per_node=ranks_per_node,
        )

    def spans_nodes(self, group_size: int, stride: int) -> bool:
        """Whether a group of `group_size` ranks, `stride` apart, crosses a node's link."""
        return group_size * stride > self.ranks_per_node

    def inter_fraction(self, kind: str, group_size: int, stride: int) -> float:
        """Of a collective's bytes, the share counted against the node's link: all of them
        when the group spans nodes (the α–β link carries the whole collective)."""
        del kind
        return 1.0 if self.spans_nodes(group_size, stride) else 0.0

    def costs(self, group_size: int, stride: int, kind: str) -> AlphaBeta:
        """The α–β that a group of `group_size` ranks, `stride` apart, sees: within a node if it
        fits in one, else the node's link, shared by the streams that cross it at once — one per
        group for a ring (min(stride, ranks per node) groups meet on a node), every rank of the
        node for an all-to-all."""
        k = self.ranks_per_node
        if not self.spans_nodes(group_size, stride):
            return _pick(self.intra_node, kind, "within a node")
        inter = _pick(self.inter_node, kind, "between nodes")
        sharing = k if kind == "alltoall" else min(stride, k)
        return AlphaBeta(alpha_s=inter.alpha_s, beta_s_per_byte=inter.beta_s_per_byte * sharing)

    def collective_s(self, kind: str, nbytes: float, group_size: int, stride: int = 1) -> float:
        """α–β of one collective, `nbytes` as rounds_and_bytes takes them."""
        return self.costs(group_size, stride, kind).time(kind, nbytes, group_size)

    def sent_s(self, kind: str, sent_bytes: float, group_size: int, stride: int = 1) -> float:
        """α per round of a ring `kind` + β per byte one rank sends; a reduce-scatter at the
        all-reduce's α–β (gloo's own), P−1 rounds."""
        if kind == "reducescatter":
            costs = self.costs(group_size, stride, "allreduce")
            rounds = float(group_size - 1)
        else:
            costs = self.costs(group_size, stride, kind)
            rounds = rounds_and_bytes(kind, 1.0, group_size)[0]
        return costs.alpha_s * rounds + costs.beta_s_per_byte * sent_bytes


def _pick(costs: Mapping[str, AlphaBeta], kind: str, where: str) -> AlphaBeta:
    if kind not in costs:
        raise ValueError(f"perf model: no alpha-beta of {kind!r} {where} (have {sorted(costs)})")
    return costs[kind]


@dataclass(frozen=True, kw_only=True)
class Mesh:
    data: int
    split: tuple[int, int, int]

    @property
    def spatial(self) -> int:
        return math.prod(self.split)

    @property
    def world(self) -> int:
        return self.data * self.spatial
