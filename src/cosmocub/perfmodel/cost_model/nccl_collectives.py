"""Collectives as NCCL prices and picks them: ring and tree all-reduce, ring all-gather and
reduce-scatter, each per protocol (LL, LL128, Simple) with NCCL's own latency and bandwidth
terms, the cheapest chosen per message size as NCCL chooses; all-to-all and halo swaps as
grouped send/recv, for which NCCL has no time model (ours, said so below).

Source of every constant and formula, unless a line says otherwise: NVIDIA/nccl at tag
v2.18.5-1, commit 559b70f86c190a0d8f67f0d7a0f2c9810dd1e8c7 (the NCCL of the NGC 23.09
containers of the MLPerf HPC v3.0 runs): src/graph/tuning.cc (ncclTopoTuneModel,
ncclTopoGetAlgoTime), src/graph/search.cc (speed arrays, channel duplication), src/init.cc
(ring channels ≤ MAXCHANNELS/2), src/include/info.h (nBytes), src/graph/paths.cc (p2p
channels). Left out: CollNet, NVLS and NVLS-tree (they need the collnet plugin or NVLink
SHARP), the tree pattern's 0.85 (balanced trees assumed), and the channel-count reductions for
small messages that NCCL makes after choosing (they are not in its time model either).
Units as NCCL's: latencies in µs, bandwidths in GB/s, time = lat + nBytes / (1000 · bw) µs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NCCL_SOURCE = "NVIDIA/nccl v2.18.5-1 (559b70f86c190a0d8f67f0d7a0f2c9810dd1e8c7)"
PROTOCOLS = ("LL", "LL128", "Simple")
ALGORITHMS = ("tree", "ring")
ARCHES = ("volta", "ampere", "hopper")  # tuning.cc's compCapIndex: <80, 80-89, ≥90

# tuning.cc baseLat[algo][proto] (µs).
BASE_LAT_US = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}
# tuning.cc hwLat[hw][algo][proto] (µs), hw = NVLink, PCI, network.
HW_LAT_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
    "pci": {"tree": (1.0, 1.9, 6.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)},
}
# tuning.cc llMaxBws[row][N1|N2|N4+]: one node by GPU generation (volta, ampere, hopper rows),
# several nodes by CPU vendor (row 0 Intel, row 1 AMD).
LL_MAX_BWS = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (87.7, 22.5, 19.0))
# tuning.cc per-channel caps [arch][N1|N2|N4+] (GB/s).
PER_CH_MAX_RING_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7))
PER_CH_MAX_TREE_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0))
PER_CH_MAX_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0))
# tuning.cc treeCorrectionFactor[proto][log2(nBytes/64)], 64 B to 256 MB; fmt: off keeps its
# rows as tuning.cc lays them out, to be read against it.
# fmt: off
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5,
     .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6,
     .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5,
     .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)
# fmt: on
# tuning.cc getNetOverhead (µs per inter-node ring step, ×3 for Simple): Intel 1.0, AMD 2.0.
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0, "other": 1.0}
# tuning.cc ncclTopoGetAlgoTime: ring Simple all-reduce latency ×1.4 (Ampere+) or ×1.9 across
# nodes once each rank's share of a channel is ≥ 64 bytes ("plateau effect of ring").
RING_PLATEAU = {"volta": 1.9, "ampere": 1.4, "hopper": 1.4}
# search.cc speedArrayIntra/Inter (pre-Hopper) and sm90SpeedArrayIntra/Inter (GB/s a channel);
# fmt: off keeps each array on its lines, to be read against search.cc.
# fmt: off
SPEEDS = {
    ("intra", False): (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    ("inter", False): (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0,
                       5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12),
    ("intra", True): (60.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 6.0, 3.0),
    ("inter", True): (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0,
                      2.4, 1.2, 0.24, 0.12),
}
# fmt: on
# topo.h SM70/SM80/SM90_NVLINK_BW: GB/s a link for the topology search (20.0 in v2.18.5).
NVLINK_GBYTE_S = 20.0
# init.cc: ringGraph.maxChannels = MAXCHANNELS/2 (devcomm.h MAXCHANNELS 32).
MAX_RING_CHANNELS = 16
# paths.cc: NCCL_NCHANNELS_PER_NET_PEER default 2; p2p channels = min(nChannels, MAXCHANNELS).
CHANNELS_PER_NET_PEER = 2
COLLECTIVES = ("allreduce", "allgather", "reducescatter")


@dataclass(frozen=True, kw_only=True)
class NcclNode:
    """What NCCL's topology search finds on one node: the GPU generation, the CPU vendor (the
    network overhead and the LL cap across nodes), how GPUs reach each other (NVLink, or PCI),
    one GPU's bandwidth to the others, the NICs and their rate, and whether LL128 is on (NCCL
    enables it only where the GPU-NIC path is close enough: tuning.cc, typeInter ≤ PXB, or
    ≤ PXN on Hopper)."""

    arch: str
    cpu_vendor: str
    intra_link: str
    intra_gbyte_s: float
    nics: int
    nic_gbyte_s: float
    ranks_per_node: int
    ll128: bool
    latency_inter_us: float = 0.0  # the net plugin's latency property (0 for IB)
    protocols: tuple[str, ...] = PROTOCOLS  # NCCL_PROTO: the protocols NCCL may pick among

    def __post_init__(self) -> None:
        if self.arch not in ARCHES:
            raise ValueError(f"NCCL node: arch {self.arch!r} is not one of {', '.join(ARCHES)}")
        if self.intra_link not in ("nvlink", "pci"):
            raise ValueError(f"NCCL node: intra_link {self.intra_link!r} is not nvlink or pci")
        if self.cpu_vendor not in NET_OVERHEAD_US:
            raise ValueError(f"NCCL node: cpu_vendor {self.cpu_vendor!r} not in {NET_OVERHEAD_US}")
        if not self.protocols or set(self.protocols) - set(PROTOCOLS):
            raise ValueError(f"NCCL node: protocols {self.protocols} not among {PROTOCOLS}")

    @property
    def arch_index(self) -> int:
        return ARCHES.index(self.arch)

    @property
    def nic_share_gbyte_s(self) -> float:
        """One rank's share of the node's NICs (GB/s)."""
        return self.nics * self.nic_gbyte_s / self.ranks_per_node


@dataclass(frozen=True)
class Choice:
    """One collective as NCCL would run it: algorithm, protocol, and its time in seconds."""

    algorithm: str
    protocol: str
    seconds: float


def channels(node: NcclNode, nodes: int, ppn: int) -> tuple[int, float]:
    """(channels, GB/s a channel) that search.cc ends with for a ring of `ppn` ranks a node on
    `nodes` nodes: the fastest speed of its array that one path carries (a NIC across nodes,
    the GPU's NVLinks within one), as many channels as the paths' total bandwidth holds (the
    group's share of the node's NICs: rails, GPU i to NIC i), then duplicated at half the
    speed where ncclTopoCompute duplicates them (not below 25 GB/s; on Hopper not below 50 with
    more than 4). A simplification of the search: no PCI or CPU bottleneck on the NIC path."""
    hopper = node.arch == "hopper"
    if nodes == 1:
        speeds, per_path, total = SPEEDS["intra", hopper], node.intra_gbyte_s, node.intra_gbyte_s
    else:
        speeds = SPEEDS["inter", hopper]
        total = node.nics * node.nic_gbyte_s * ppn / node.ranks_per_node
        per_path = min(node.nic_gbyte_s, total)
    speed = next((s for s in speeds if s <= per_path), speeds[-1])
    n = min(MAX_RING_CHANNELS, max(1, int(total // speed + 1e-9)))
    if speed < 25.0 or (node.arch == "hopper" and speed < 50.0 and n > 4):
        return n, speed
    dup = min(2 * n, MAX_RING_CHANNELS)
    return dup, speed / math.ceil(dup / n)


def _log2i(n: float) -> int:
    """NCCL's log2i: floor(log2 n), 0 for n ≤ 1."""
    return max(0, int(n).bit_length() - 1)


def tuned(
    node: NcclNode,
    coll: str,
    algorithm: str,
    protocol: str,
    ranks: int,
    nodes: int,
    ring_channels: tuple[int, float],
) -> tuple[float, float] | None:
    """(latency µs, algorithm bandwidth GB/s) of ncclTopoTuneModel for one collective,
    algorithm and protocol on `ranks` ranks over `nodes` nodes, given `channels()` of that
    layout; None where NCCL does not run it (tree for anything but all-reduce, LL128 where it
    is off)."""
    if coll not in COLLECTIVES:
        raise ValueError(f"NCCL model: collective {coll!r} is not one of {', '.join(COLLECTIVES)}")
    if algorithm == "tree" and coll != "allreduce":
        return None
    p = PROTOCOLS.index(protocol)
    if protocol == "LL128" and not node.ll128:
        return None
    ppn = ranks // nodes
    n_ch, bw = ring_channels
    arch = node.arch_index
    index2 = nodes - 1 if nodes <= 2 else 2
    ll_row = arch if nodes == 1 else (1 if node.cpu_vendor == "amd" else 0)
    ll_max = LL_MAX_BWS[ll_row][index2]
    bus = n_ch * bw
    if algorithm == "ring":
        if protocol == "LL":
            bus = min(ll_max, bus * (0.25 if nodes > 1 or coll == "allreduce" else 1 / 3))
        elif protocol == "LL128":
            bus = min(bus * (0.7 if ppn < 2 else 0.92), n_ch * PER_CH_MAX_RING_LL128[arch][index2])
    else:
        bus = min(bus * 0.92, n_ch * PER_CH_MAX_TREE[arch][index2])
        if protocol == "LL":
            bus = min(bus / 3.8, ll_max)
        elif protocol == "LL128":
            bus = min(
                bus * (7 / 9 if nodes == 1 else 120 / 128),
                n_ch * PER_CH_MAX_TREE_LL128[arch][index2],
            )
    steps = 2 * (ranks - 1) if coll == "allreduce" else ranks - 1
    inter_steps = (2 * nodes if nodes > 1 else 0) if coll == "allreduce" else nodes - 1
    alg_bw = bus * (ranks / steps if algorithm == "ring" else 0.5)
    intra = HW_LAT_US[node.intra_link][algorithm][p]
    inter = HW_LAT_US["net"][algorithm][p] + node.latency_inter_us
    if protocol == "Simple":
        inter += node.latency_inter_us  # the flush
    lat = BASE_LAT_US[algorithm][p]
    if algorithm == "ring":
        hw = node.intra_link if nodes == 1 else "net"
        if nodes == 1:
            lat += steps * HW_LAT_US[hw]["ring"][p]
        else:
            overhead = NET_OVERHEAD_US[node.cpu_vendor] * (3 if protocol == "Simple" else 1)
            lat += (steps - inter_steps) * max(intra, overhead) + inter_steps * inter
    else:
        lat += 2 * ((ranks // nodes - 1) * intra + _log2i(nodes) * inter)
    return lat, alg_bw


def algorithm_time_us(
    node: NcclNode,
    coll: str,
    algorithm: str,
    protocol: str,
    nbytes: float,
    ranks: int,
    nodes: int,
    *,
    ring_channels: tuple[int, float] | None = None,
) -> float | None:
    """ncclTopoGetAlgoTime of one operation (numPipeOps 1): µs, None where NCCL cannot run it.
    nbytes as NCCL counts it (info.h): the all-reduced buffer, or the all-gathered /
    reduce-scattered total (count per rank × ranks). `ring_channels`: channels() of this
    layout where the caller has it (choose prices six algorithm-protocol pairs on one)."""
    if ring_channels is None:
        ring_channels = channels(node, nodes, ranks // nodes)
    got = tuned(node, coll, algorithm, protocol, ranks, nodes, ring_channels)
    if got is None:
        return None
    lat, bw = got
    log_size = _log2i(int(nbytes) >> 6)
    if algorithm == "tree" and log_size < len(TREE_CORRECTION[0]):
        bw *= TREE_CORRECTION[PROTOCOLS.index(protocol)][log_size]
    if (
        algorithm == "ring"
        and protocol == "Simple"
        and nodes > 1
        and coll == "allreduce"
        and nbytes / (ring_channels[0] * ranks) >= 64
    ):
        lat *= RING_PLATEAU[node.arch]
    return lat + nbytes / (1000.0 * bw)


def choose(node: NcclNode, coll: str, nbytes: float, ranks: int, nodes: int) -> Choice:
    """The algorithm and protocol NCCL picks for `coll` of `nbytes` (enqueue.cc getAlgoInfo: the
    least time, tree before ring and LL, LL128, Simple in turn winning ties) and its time."""
    if ranks == 1:
        return Choice("ring", "Simple", 0.0)
    ring_channels = channels(node, nodes, ranks // nodes)
    best: Choice | None = None
    for algorithm in ALGORITHMS:
        for protocol in (p for p in PROTOCOLS if p in node.protocols):
            us = algorithm_time_us(
                node, coll, algorithm, protocol, nbytes, ranks, nodes, ring_channels=ring_channels
            )
            if us is not None and (best is None or us * 1e-6 < best.seconds):
                best = Choice(algorithm, protocol, us * 1e-6)
    if best is None:
        raise ValueError(f"NCCL: no algorithm runs {coll} under protocols {node.protocols}")
    return best


def alltoall_time_us(node: NcclNode, nbytes: float, ranks: int, nodes: int) -> float:
    """An all-to-all of an `nbytes` buffer as grouped send/recv (NCCL has no time model for
    them; ours): the (ppn−1)/P within the node over the GPU's intra-node bandwidth and the
    rest through the rank's share of the node's NICs, at once; latency one ring Simple base
    and one step per round of peers, CHANNELS_PER_NET_PEER channels each among the p2p
    channels (the ring's), at the network's step latency across nodes, NVLink's within."""
    if ranks == 1:
        return 0.0
    ppn = ranks // nodes
    intra_bytes = nbytes * (ppn - 1) / ranks
    inter_bytes = nbytes * (ranks - ppn) / ranks
    nic_share = node.nic_share_gbyte_s
    wire = max(intra_bytes / node.intra_gbyte_s, inter_bytes / nic_share if inter_bytes else 0.0)
    p2p_channels = channels(node, nodes, ppn)[0]
    concurrent = max(1, p2p_channels // CHANNELS_PER_NET_PEER)
    step = HW_LAT_US["net" if nodes > 1 else node.intra_link]["ring"][2]
    return BASE_LAT_US["ring"][2] + math.ceil((ranks - 1) / concurrent) * step + wire / 1000.0


def sendrecv_time_us(node: NcclNode, nbytes: float, *, across_nodes: bool) -> float:
    """One send/recv of `nbytes` to a neighbour (a halo face; ours, as alltoall_time_us): the
    ring Simple base and step latency, the bytes at NVLink or at the rank's NIC share."""
    if across_nodes:
        rate = node.nic_share_gbyte_s
        step = HW_LAT_US["net"]["ring"][2] + node.latency_inter_us
    else:
        rate, step = node.intra_gbyte_s, HW_LAT_US[node.intra_link]["ring"][2]
    return BASE_LAT_US["ring"][2] + step + nbytes / (1000.0 * rate)
