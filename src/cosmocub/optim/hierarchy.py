"""Lion Cub's two-level exchange (hierarchy node): average c in fp32 over the data ranks of a node,
vote across the nodes on each local rank's 1/G of it ("rails"), then share the vote in the node.

With G data ranks a node, a node's link carries 1/G of a flat exchange's bytes: each local rank
sends the vote on its slice to its own rail (the ranks with its local index on the other nodes),
and the fast intra-node link carries the fp32 reduce-scatter and the 1-bit all-gather. What is
voted is each node's quantized mean c, so the vote is over nodes, not ranks: a different update
from a flat vote over all ranks (equal with one rank a node). A scaled quantizer's scale stays
per parameter tensor of the node's mean c: the slices' partial sums (or maxima) are combined in
the node by a tiny all-reduce before each slice is quantized.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cosmocub.optim.collectives import CommStats, all_gather_flat, ring_allreduce_bytes
from cosmocub.optim.exchange_plan import node_slice_elements, node_sum_slice_elements
from cosmocub.optim.packing import pack_bits, unpack_bits
from cosmocub.optim.quantize import quantize
from cosmocub.optim.vote import bits_to_signs
from cosmocub.optim.wire import pad
from cosmocub.parallel.node_layout import NodeLayout

# torch 2.13 renamed reduce_scatter_tensor (deprecated) to reduce_scatter_single.
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
# How the slices' partial statistics of a tensor combine into the whole tensor's.
STATS_OP = {"l1": dist.ReduceOp.SUM, "linf": dist.ReduceOp.MAX, "l0": dist.ReduceOp.SUM}


def slice_segments(sizes: Sequence[int], lo: int, hi: int) -> list[int]:
    """The pieces of [lo, hi) that fall in each of the tensors laid end to end (`sizes`; 0 where
    none does), then the padding beyond their end."""
    out, offset = [], 0
    for n in sizes:
        out.append(max(0, min(hi, offset + n) - max(lo, offset)))
        offset += n
    out.append(hi - lo - sum(out))
    return out


def partial_stats(a: torch.Tensor, segments: Sequence[int], quantizer: str) -> torch.Tensor:
    """|c| of a slice → what each tensor's scale needs of it, in float64 (the padding's piece
    left out): l1 the sums, linf the maxima (k,); l0 the sums of log|c| over the non-zero |c|,
    then their counts (2k,). Summed (l1, l0) or maxed (linf) over a node's slices."""
    parts = torch.split(a, list(segments))[:-1]
    zero = a.new_zeros((), dtype=torch.float64)
    if quantizer == "l1":
        return torch.stack([p.sum(dtype=torch.float64) if p.numel() else zero for p in parts])
    if quantizer == "linf":
        return torch.stack([p.amax().double() if p.numel() else zero for p in parts])
    if quantizer == "l0":
        nonzero = a > 0
        logs = torch.where(nonzero, a, 1.0).log_()
        sums = [x.sum(dtype=torch.float64) for x in torch.split(logs, list(segments))[:-1]]
        counts = [x.sum(dtype=torch.float64) for x in torch.split(nonzero, list(segments))[:-1]]
        return torch.stack(sums + counts) if sums else zero[None][:0]
    raise ValueError(f"unknown scaled quantizer {quantizer!r} (l1, linf, l0)")


def scales_from_stats(stats: torch.Tensor, sizes: Sequence[int], quantizer: str) -> torch.Tensor:
    """A node's combined `partial_stats` → one scale per tensor, as `quantize` takes them from
    the whole tensor: mean|c|, max|c|, geometric mean of the non-zero |c| (0 where none)."""
    if quantizer == "linf":
        return stats
    if quantizer == "l1":
        n = torch.tensor(list(sizes), dtype=torch.float64, device=stats.device)
        return torch.where(n > 0, stats / n.clamp(min=1), 0.0)
    k = len(sizes)
    sums, counts = stats[:k], stats[k:]
    return torch.where(counts > 0, (sums / counts.clamp(min=1)).exp(), 0.0)


def world_node_groups(data_ranks_per_node: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """(the ranks on my node, my rail) for a script whose data group is the whole world, G ranks
    a node (torchrun: LOCAL_WORLD_SIZE), as LionCub's node_groups; every rank must call it (it
    makes every group, a collective over the world)."""
    layout = NodeLayout(data=dist.get_world_size(), spatial=1, ranks_per_node=data_ranks_per_node)
    rank = dist.get_rank()
    intra = [dist.new_group(r) for r in layout.intra_groups()][rank // data_ranks_per_node]
    rail = [dist.new_group(r) for r in layout.inter_groups()][rank % data_ranks_per_node]
    return intra, rail


@dataclass
class NodeSlice:
    """One bucket's part in the two-level exchange: this local rank's slice [lo, lo + m) of the
    bucket padded to G·m values (m a multiple of 8, for the 1-bit all-gather), and its buffers."""

    sizes: list[int]
    lo: int
    m: int
    segments: list[int]
    padded: torch.Tensor  # (G·m,) c, zero beyond the bucket
    part: torch.Tensor  # (m,) the node's mean c on the slice
    q: torch.Tensor  # (m,) int8
    work: torch.Tensor  # (m,) |c|
    ties: tuple[torch.Tensor, torch.Tensor]  # the tie pattern on the slice, even and odd steps
    gathered: torch.Tensor  # (G·m/8,) uint8: every local rank's voted bits


class TwoLevel:
    """The intra-node side of the exchange over `group` (the data ranks of this node), counting
    what it sends as intra-node bytes in `stats`; the vote across nodes is a Collective on the
    rail (optim.collectives), run by LionCub between `quantize` and `share`."""

    def __init__(self, group: dist.ProcessGroup, stats: CommStats) -> None:
        self.group, self.stats = group, stats
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)

    def new_slice(
        self, sizes: list[int], ties: tuple[torch.Tensor, torch.Tensor], like: torch.Tensor
    ) -> NodeSlice:
        m = node_slice_elements(sum(sizes), self.size)
        lo = self.rank * m
        padded = like.new_zeros(self.size * m)
        part = like.new_zeros(m)
        my_ties = tuple(pad(t, 8 * self.size)[lo : lo + m].clone() for t in ties)
        return NodeSlice(
            sizes=list(sizes),
            lo=lo,
            m=m,
            segments=slice_segments(sizes, lo, lo + m),
            padded=padded,
            part=part,
            q=torch.zeros(m, dtype=torch.int8, device=like.device),
            work=torch.zeros_like(part),
            ties=(my_ties[0], my_ties[1]),
            gathered=torch.zeros(self.size * m // 8, dtype=torch.uint8, device=like.device),
        )

    def average(self, c: torch.Tensor, s: NodeSlice) -> torch.Tensor:
        """The node's mean of c on this rank's slice (fp32 reduce-scatter over the node)."""
        t = time.perf_counter()
        s.padded[: c.numel()].copy_(c)
        reduce_scatter_flat(s.part, s.padded, group=self.group)
        s.part.div_(self.size)
        # A reduce-scatter sends every slice but this rank's own.
        self.stats.add_bytes((self.size - 1) * s.part.numel() * s.part.element_size(), 0.0)
        self.stats.lap("node_average", t)
        return s.part

    def quantize(self, s: NodeSlice, quantizer: str, levels: int) -> torch.Tensor:
        """q of the slice, its tensors scaled as the whole of the node's mean c would be."""
        if quantizer == "sign":
            return s.q.copy_(s.part.sign())
        t = time.perf_counter()
        stats = partial_stats(torch.abs(s.part, out=s.work), s.segments, quantizer)
        dist.all_reduce(stats, op=STATS_OP[quantizer], group=self.group)
        nbytes = stats.numel() * stats.element_size()
        self.stats.add_bytes(ring_allreduce_bytes(nbytes, self.size), 0.0)
        t = self.stats.lap("node_average", t)
        scales = scales_from_stats(stats, s.sizes, quantizer).to(s.part.dtype)
        per_segment = torch.cat([scales, scales.new_zeros(1)])  # the padding: q = 0
        out = quantize(
            s.part,
            quantizer=quantizer,
            levels=levels,
            segments=s.segments,
            out=s.q,
            work=s.work,
            scales=per_segment,
        )
        self.stats.lap("quantize", t)
        return out

    def share(self, voted: torch.Tensor, s: NodeSlice) -> torch.Tensor:
        """Every local rank's voted slice (int8 ±1) → the bucket's update: 1-bit all-gather."""
        t = time.perf_counter()
        bits = pack_bits((voted > 0).to(torch.uint8))
        all_gather_flat(s.gathered, bits, group=self.group)
        self.stats.add_bytes((self.size - 1) * bits.numel(), 0.0)
        update = bits_to_signs(unpack_bits(s.gathered))[: sum(s.sizes)]
        self.stats.lap("node_share", t)
        return update

    def sum_over_nodes(self, x: torch.Tensor, rail: dist.ProcessGroup, nodes: int) -> None:
        """Sum the flat x in place over every data rank, by node: fp32 reduce-scatter in the
        node, all-reduce of the 1/G slice over the rail, all-gather in the node."""
        n = x.numel()
        m = node_sum_slice_elements(n, self.size)
        padded = pad(x, self.size).contiguous()
        part = x.new_empty(m)
        reduce_scatter_flat(part, padded, group=self.group)
        dist.all_reduce(part, group=rail)
        out = x.new_empty(self.size * m)
        all_gather_flat(out, part, group=self.group)
        x.copy_(out[:n])
        nbytes = m * x.element_size()
        self.stats.add_bytes(2.0 * (self.size - 1) * nbytes, 0.0)  # reduce-scatter, all-gather
        self.stats.add_bytes(ring_allreduce_bytes(nbytes, nodes), 1.0)
