"""The swappable communication of Lion Cub: three ways to turn every data rank's quantized q into
the voted update, each counting the bytes this rank sends (ring algorithms, as NCCL and gloo run).

  allgather  every rank's packed q to every rank, each votes locally:  (P−1)·b·n/8 bytes
  alltoall   rank r receives everyone's chunk r, votes on it, then the 1-bit chunk results are
             all-gathered:                          (P−1)/P·(b + 1)·n/8 bytes (no growth with P)
  allreduce  a sum of q on the wire (packed bits cannot be summed by NCCL/gloo), in int8 (1 byte
             a value) or fp16 (2 bytes, exact for integers up to 2048):  2(P−1)/P·n·bytes

(b = bits per value on the wire, n = values.) allgather and alltoall sum what a rank receives on
the rank (wire.decode_sum), so their levels do not shrink with P; see quantize.quantizer_levels.
Each takes the process group it votes over, so a two-level exchange can run one on the group of
the ranks that share no node. `start` launches the first phase asynchronously and
`finish` completes it, so a bucket's exchange can run during the backward pass.

Each collective also adds its phases' host seconds to `CommStats.phase_s` (a few perf_counter
reads per bucket and step): `encode` (pack q for the wire), the wait for its collectives by name
(`alltoall`, `allgather`, `allreduce`: launch to completion as the host sees it, so a phase
launched early and overlapped with backward shows only its remaining wait), and `vote` (unpack,
sum, vote, and pack/unpack of the all-to-all's 1-bit result). Without overlap they add up to the
exchange less the optimizer's own quantization (see LionCub, `quantize`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from cosmocub.optim.packing import unpack_bits
from cosmocub.optim.vote import bits_to_signs, vote
from cosmocub.optim.wire import (
    WireSpec,
    allreduce_bytes_per_value,
    allreduce_payload,
    chunk_vote_bits,
    decode_sum,
    encode,
    pad,
    ranks_view,
)
from cosmocub.parallel.node_layout import pairwise_inter_fraction, ring_inter_fraction
from cosmocub.parallel.timing import Spans

COLLECTIVES = ("allgather", "alltoall", "allreduce")

# torch 2.13 renamed all_gather_into_tensor (deprecated) to all_gather_single; same signature.
all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class CommStats:
    """What this rank sent and waited for since the last reset (one epoch, in the training loop):
    the exchange and momentum syncs as spans on the device's clock (`parallel/timing.py`: read
    when asked, so a GPU is not made to wait at every step), the phases in host seconds."""

    bytes_sent: float = 0.0  # in all
    bytes_inter: float = 0.0  # of which to other nodes (see `add_bytes`)
    exchange: Spans = field(default_factory=Spans)
    momentum_sync: Spans = field(default_factory=Spans)
    phase_s: dict[str, float] = field(default_factory=dict)  # exchange phase -> host seconds

    @property
    def bytes_intra(self) -> float:
        """Bytes sent to ranks on this node."""
        return self.bytes_sent - self.bytes_inter

    def add_bytes(self, nbytes: float, inter_fraction: float) -> None:
        """Count `nbytes` sent, `inter_fraction` of them to other nodes."""
        self.bytes_sent += nbytes
        self.bytes_inter += nbytes * inter_fraction

    @property
    def exchange_s(self) -> float:
        return self.exchange.seconds

    @property
    def momentum_sync_s(self) -> float:
        return self.momentum_sync.seconds

    def reset(self) -> None:
        self.bytes_sent = self.bytes_inter = 0.0
        self.exchange.reset()
        self.momentum_sync.reset()
        self.phase_s.clear()

    def lap(self, phase: str, since: float) -> float:
        """Add the seconds since `since` (a perf_counter reading) to `phase`; returns now."""
        now = time.perf_counter()
        self.phase_s[phase] = self.phase_s.get(phase, 0.0) + now - since
        return now


def ring_allreduce_bytes(payload_bytes: float, group_size: int) -> float:
    """Bytes one rank sends in a ring all-reduce: reduce-scatter then all-gather, 2(P−1)/P."""
    return 2.0 * (group_size - 1) / group_size * payload_bytes


def allgather_bytes(payload_bytes: float, group_size: int) -> float:
    """Bytes one rank sends in a ring all-gather of its payload: to the P−1 others, (P−1)·b."""
    return (group_size - 1) * payload_bytes


def alltoall_bytes(send_bytes: float, group_size: int) -> float:
    """Bytes one rank sends in an all-to-all of a buffer of P chunks: all but its own, (P−1)/P."""
    return (group_size - 1) / group_size * send_bytes


def vote_phase_bytes(
    collective: str,
    num_values: int,
    bits: int,
    group_size: int,
    *,
    allreduce_dtype: str = "int8",
) -> dict[str, float]:
    """Bytes one rank sends to vote on `num_values` values (one bucket) with `collective`, at
    `bits` per value on the wire (the allreduce collective: one `allreduce_dtype` element per
    value instead), per phase, each named by the collective it runs (alltoall: the all-to-all
    of the codes, then the all-gather of the 1-bit result; none for a group of one): what the
    Collective classes below count, from the sizes alone (padding included), for the
    performance model."""
    if group_size == 1:
        return {}
    if collective == "allgather":
        return {"allgather": allgather_bytes(_padded(num_values, 8) * bits // 8, group_size)}
    if collective == "alltoall":
        padded = _padded(num_values, 8 * group_size)
        result_bytes = padded // group_size // 8  # one bit per voted value of this rank's chunk
        return {
            "alltoall": alltoall_bytes(padded * bits // 8, group_size),
            "allgather": allgather_bytes(result_bytes, group_size),
        }
    if collective == "allreduce":
        payload = num_values * allreduce_bytes_per_value(allreduce_dtype)
        return {"allreduce": ring_allreduce_bytes(payload, group_size)}
    raise ValueError(f"unknown collective {collective!r} ({', '.join(COLLECTIVES)})")


def _padded(n: int, multiple: int) -> int:
    return n + (-n % multiple)


@dataclass
class Pending:
    """A started exchange: the work handle and what `finish` needs."""

    q: torch.Tensor
    tie: torch.Tensor
    work: Any = None
    buffers: tuple[torch.Tensor, ...] = ()


class Collective:
    """Base: the group, its size and this rank's place in it; a group of one sends nothing.

    `data_ranks_per_node`: the group's ranks run node by node, that many on each (None: each rank on
    its own node, so every byte counts as inter-node); what crosses nodes is then counted as an
    all-to-all's chunks to the other nodes' ranks and a ring's one crossing a node (see
    `cosmocub.parallel.node_layout`)."""

    name = "base"

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        stats: CommStats,
        data_ranks_per_node: int | None = None,
    ) -> None:
        self.group = group
        self.size = 1 if group is None else dist.get_world_size(group)
        self.rank = 0 if group is None else dist.get_rank(group)
        self.stats = stats
        per_node = data_ranks_per_node or 1
        self.ring_inter = ring_inter_fraction(self.size, per_node)
        self.pairwise_inter = pairwise_inter_fraction(self.size, per_node)

    def start(self, q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> Pending:
        """q: this rank's (n,) int8; tie: the (n,) int8 tie pattern (see vote.py)."""
        if self.size == 1:
            return Pending(q, tie)
        return self._start(q, tie, spec)

    def finish(self, pending: Pending, spec: WireSpec) -> torch.Tensor:
        """The (n,) int8 update sign, identical on every rank of the group."""
        if self.size == 1:
            return pending.q.sign_()  # one rank: no vote, Lion's own sign(c); q is spent
        return self._finish(pending, spec)

    def _start(self, q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> Pending:
        raise NotImplementedError

    def _finish(self, pending: Pending, spec: WireSpec) -> torch.Tensor:
        raise NotImplementedError

    def host_work(self, q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> torch.Tensor:
        """start's and finish's work on this host for a group of `size`, the wire left out:
        what arrives stands in as copies of what this rank sends (each peer's is as large).
        What the exchange costs besides its collectives (perfmodel's calibration times it)."""
        raise NotImplementedError


class AllGatherVote(Collective):
    name = "allgather"

    def _start(self, q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> Pending:
        t = time.perf_counter()
        payload = self._encode(q, tie, spec)
        out = payload.new_empty(self.size * payload.numel())
        t = self.stats.lap("encode", t)
        work = all_gather_flat(out, payload, group=self.group, async_op=True)
        self.stats.lap("allgather", t)
        self.stats.add_bytes(allgather_bytes(payload.numel(), self.size), self.ring_inter)
        return Pending(q, tie, work, (out,))

    def _finish(self, pending: Pending, spec: WireSpec) -> torch.Tensor:
        t = time.perf_counter()
        pending.work.wait()
        t = self.stats.lap("allgather", t)
        (out,) = pending.buffers
        update = self._vote(out, pending.tie, pending.q.numel(), spec)
        self.stats.lap("vote", t)
        return update

    def _encode(self, q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> torch.Tensor:
        return encode(pad(q, 8), pad(tie, 8), spec).reshape(-1)

    def _vote(self, out: torch.Tensor, tie: torch.Tensor, n: int, spec: WireSpec) -> torch.Tensor:
        return vote(decode_sum(ranks_view(out, self.size, spec), spec)[:n], tie)

    def host_work(self, q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> torch.Tensor:
        payload = self._encode(q, tie, spec)
        return self._vote(payload.repeat(self.size), tie, q.numel(), spec)


class AllToAllVote(Collective):
    name = "alltoall"

    def _start(self, q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> Pending:
        t = time.perf_counter()
        send, tie_pad = self._encode(q, tie, spec)
        recv = torch.empty_like(send)
        t = self.stats.lap("encode", t)
        work = dist.all_to_all_single(recv, send, group=self.group, async_op=True)
        self.stats.lap("alltoall", t)
        self.stats.add_bytes(alltoall_bytes(send.numel(), self.size), self.pairwise_inter)
        return Pending(q, tie, work, (recv, tie_pad))

    def _finish(self, pending: Pending, spec: WireSpec) -> torch.Tensor:
        t = time.perf_counter()
        pending.work.wait()
        t = self.stats.lap("alltoall", t)
        recv, tie_pad = pending.buffers
        result = self._chunk_vote(recv, tie_pad, spec)
        gathered = result.new_empty(self.size * result.numel())
        t = self.stats.lap("vote", t)
        all_gather_flat(gathered, result, group=self.group)
        t = self.stats.lap("allgather", t)
        self.stats.add_bytes(allgather_bytes(result.numel(), self.size), self.ring_inter)
        update = self._signs(gathered, pending.q.numel())
        self.stats.lap("vote", t)
        return update

    def _encode(
        self, q: torch.Tensor, tie: torch.Tensor, spec: WireSpec
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q_pad, tie_pad = pad(q, 8 * self.size), pad(tie, 8 * self.size)
        # (P, chunk): row r is the chunk rank r votes on.
        send = encode(q_pad.view(self.size, -1), tie_pad.view(self.size, -1), spec).contiguous()
        return send, tie_pad

    def _chunk_vote(
        self, recv: torch.Tensor, tie_pad: torch.Tensor, spec: WireSpec
    ) -> torch.Tensor:
        chunk = tie_pad.numel() // self.size
        my_tie = tie_pad[self.rank * chunk : (self.rank + 1) * chunk]
        return chunk_vote_bits(recv, my_tie, spec)

    def _signs(self, gathered: torch.Tensor, n: int) -> torch.Tensor:
        return bits_to_signs(unpack_bits(gathered))[:n]

    def host_work(self, q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> torch.Tensor:
        """As the base's; every rank's chunk of this rank's is this rank's own, and every rank's
        voted chunk this rank's: the update holds this rank's chunk's vote in every chunk."""
        send, tie_pad = self._encode(q, tie, spec)
        recv = send[self.rank].expand(self.size, *send.shape[1:]).contiguous()
        result = self._chunk_vote(recv, tie_pad, spec)
        return self._signs(result.repeat(self.size), q.numel())


class AllReduceVote(Collective):
    name = "allreduce"

    def _start(self, q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> Pending:
        # Every partial sum stays exact: quantizer_levels keeps P·s within the dtype's exact
        # integers (int8 127, fp16 2048).
        t = time.perf_counter()
        values = allreduce_payload(q, tie, spec)
        t = self.stats.lap("encode", t)
        work = dist.all_reduce(values, group=self.group, async_op=True)
        self.stats.lap("allreduce", t)
        nbytes = values.numel() * values.element_size()
        self.stats.add_bytes(ring_allreduce_bytes(nbytes, self.size), self.ring_inter)
        return Pending(q, tie, work, (values,))

    def _finish(self, pending: Pending, spec: WireSpec) -> torch.Tensor:
        t = time.perf_counter()
        pending.work.wait()
        t = self.stats.lap("allreduce", t)
        (total,) = pending.buffers
        update = vote(total, pending.tie)
        self.stats.lap("vote", t)
        return update

    def host_work(self, q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> torch.Tensor:
        return vote(allreduce_payload(q, tie, spec) * self.size, tie)


def build_collective(
    name: str,
    group: dist.ProcessGroup | None,
    stats: CommStats,
    data_ranks_per_node: int | None = None,
) -> Collective:
    for cls in (AllGatherVote, AllToAllVote, AllReduceVote):
        if cls.name == name:
            return cls(group, stats, data_ranks_per_node)
    raise ValueError(f"unknown collective {name!r} ({', '.join(COLLECTIVES)})")


def host_collective(name: str, size: int) -> Collective:
    """Collective `name` of `size` ranks without a group, for its `host_work` alone."""
    collective = build_collective(name, None, CommStats())
    collective.size = size
    return collective
