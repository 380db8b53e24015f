"""Predict one training step's time and its breakdown for a model, mesh, optimizer and network.

Placement (as ParallelDims lays out ranks: spatial is the inner mesh axis): a sample's spatial
ranks are consecutive, so they share a node when spatial ≤ ranks per node; the data group spans
nodes. Parts of a step, added (what overlaps is left out of the sum):
  compute         forward + backward of every layer on one rank's block (measured, peak × eff.,
                  or the roofline of its kernels: perfmodel.cost_model.spec_accelerator)
  halo            each conv's halo swap forward and its gradient's return backward, two faces per
                  split dim, plus the all-gather of the features before the head (fwd and bwd)
  exchange        gradients/updates: DDP's fp32 all-reduce per bucket (over the data group,
                  or the whole mesh when spatial > 1), blocking, or overlapped with backward (then
                  only its exposed part is in the step: perfmodel.cost_model.overlap); or Lion
                  Cub's spatial average + voted exchange
  momentum_sync   Lion Cub's fp32 average of momenta, amortised over the steps it skips
  norm_sync       the synced batch norms' statistics over the mesh, two collectives a block
                  (perfmodel.cost_model.layer_collectives; their arithmetic beyond a plain norm is
                  compute)
  optimizer       the update arithmetic (measured on one rank)
Byte counts come from the optimizer's own functions (cosmocub.optim.collectives); every
collective is priced by the network (topology.Links: α–β rings, or NCCL's own choice and time,
perfmodel.cost_model.cluster_network).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cosmocub.config import ModelConfig, OptimizerConfig
from cosmocub.optim.collectives import ring_allreduce_bytes, vote_phase_bytes
from cosmocub.optim.exchange_plan import (
    FP32_BYTES,
    bucket_elements,
    node_exchange_bytes,
    node_slice_elements,
    node_sum_intra_bytes,
    node_sum_slice_elements,
    wire_settings,
)
from cosmocub.optim.lion_cub import split_into_buckets
from cosmocub.optim.momentum_sync import is_sync_step
from cosmocub.optim.quantize import quantizer_levels, wire_bits
from cosmocub.perfmodel.cost_model.layer_collectives import halo, norm_sync
from cosmocub.perfmodel.cost_model.overlap import ddp_buckets, exposed_allreduce, parameter_layers
from cosmocub.perfmodel.cost_model.topology import Links, Mesh

DDP_OPTIMIZERS = ("sgd", "adamw", "lion")
# The compressed exchange's host work of one bucket (encode, vote, unpack; the wire apart):
# seconds for (quantizer, collective, elements). A CPU's from its calibration; None where the
# update's cost holds it (an accelerator's, memory-bound).
VoteHost = Callable[[str, str, int], float]


@dataclass(frozen=True, kw_only=True)
class StepPrediction:
    compute_s: float
    halo_s: float
    exchange_s: float
    momentum_sync_s: float
    optimizer_s: float
    comm_bytes_per_step: float  # as CommMeter counts: gradients/updates and momentum syncs
    halo_bytes_per_step: float
    # DDP's all-reduce that runs under backward (overlapped): not in exchange_s nor the step.
    exchange_hidden_s: float = 0.0
    # Of comm and halo bytes, those one rank sends in groups that span nodes (the node's link).
    inter_node_bytes_per_step: float = 0.0
    # The synced batch norms' collectives (not counted in comm or halo bytes, as CommMeter).
    norm_sync_s: float = 0.0

    @property
    def step_s(self) -> float:
        return (
            self.compute_s
            + self.halo_s
            + self.norm_sync_s
            + self.exchange_s
            + self.momentum_sync_s
            + self.optimizer_s
        )


@functools.cache
def parameter_sizes(model_cfg: ModelConfig) -> tuple[int, ...]:
    """Elements of every trainable parameter, in registration order (meta device: no memory)."""
    return tuple(n for _, n in parameter_layers(model_cfg))


@dataclass(frozen=True, kw_only=True)
class Exchange:
    """One step's gradient/update exchange on one rank: seconds in the step, seconds hidden
    under backward, momentum-sync seconds, and bytes sent (all, momentum sync's, across nodes)."""

    seconds: float = 0.0
    hidden_s: float = 0.0
    sync_s: float = 0.0
    sent: float = 0.0
    sync_bytes: float = 0.0
    inter_node_bytes: float = 0.0


def _sync_fraction(optimizer_cfg: OptimizerConfig, steps: int) -> float:
    lc = optimizer_cfg.lion_cub
    if optimizer_cfg.name != "lion_cub" or lc is None:
        return 0.0
    sync = lc.momentum_sync
    hits = sum(
        is_sync_step(s, schedule=sync.schedule, every=sync.every_steps, k=sync.k)
        for s in range(1, steps + 1)
    )
    return hits / steps


def exchange(
    model_cfg: ModelConfig,
    optimizer_cfg: OptimizerConfig,
    mesh: Mesh,
    network: Links,
    *,
    steps: int,
    layer_seconds: Mapping[str, float],
    ddp_overlap: bool = False,
    vote_host: VoteHost | None = None,
    wake_s: float = 0.0,
) -> Exchange:
    """The step's exchange; for DDP, per bucket as torch fills them, blocking (every bucket in
    the step) or overlapped with backward (`layer_seconds` sets when each bucket is ready).
    wake_s: what each collective the step waits on costs after compute beyond its α (a CPU's,
    from its calibration; 0 elsewhere)."""
    sizes = parameter_sizes(model_cfg)
    payload = 4 * sum(sizes)  # fp32 gradients
    if optimizer_cfg.name in DDP_OPTIMIZERS:
        group = mesh.data if mesh.spatial == 1 else mesh.world
        if group == 1:
            return Exchange()
        buckets = [
            (layer, network.collective_s("allreduce", n, group))
            for layer, n in ddp_buckets(model_cfg)
        ]
        total = sum(seconds for _, seconds in buckets)
        layers = list(dict.fromkeys(layer for layer, _ in parameter_layers(model_cfg)))
        exposed = exposed_allreduce(buckets, layer_seconds, layers) if ddp_overlap else total
        # Blocking, the step waits on every bucket; overlapped, on the last once it is exposed.
        exposed += wake_s * (len(buckets) if not ddp_overlap else float(exposed > 0))
        sent = ring_allreduce_bytes(payload, group)
        return Exchange(
            seconds=exposed,
            hidden_s=total - exposed,
            sent=sent,
            inter_node_bytes=sent * network.inter_fraction("allreduce", group, 1),
        )
    # distributed_lion / lion_cub: spatial average in fp32, then the vote over the data group.
    seconds, sent, inter = 0.0, 0.0, 0.0
    if mesh.spatial > 1:
        seconds += wake_s + network.collective_s("allreduce", payload, mesh.spatial)
        averaged = ring_allreduce_bytes(payload, mesh.spatial)
        sent += averaged
        inter += averaged * network.inter_fraction("allreduce", mesh.spatial, 1)
    wire = wire_settings(optimizer_cfg)
    p = mesh.data
    # Data ranks (of one spatial index) on a node; 1 where a spatial group spans nodes.
    per_node = max(1, network.ranks_per_node // mesh.spatial)
    lc = optimizer_cfg.lion_cub if optimizer_cfg.name == "lion_cub" else None
    if lc is not None and lc.hierarchy == "node" and 1 < per_node < p:
        two = two_level_exchange(
            sizes,
            optimizer_cfg,
            mesh,
            network,
            per_node=per_node,
            steps=steps,
            host=vote_host,
            wake_s=wake_s,
        )
        return Exchange(
            seconds=seconds + two.seconds,
            sync_s=two.sync_s,
            sent=sent + two.sent,
            sync_bytes=two.sync_bytes,
            inter_node_bytes=inter + two.inter_node_bytes,
        )
    if p > 1:
        kind = {"collective": wire.collective, "allreduce_dtype": wire.allreduce_dtype}
        levels = quantizer_levels(wire.quantizer, wire.bits, p, **kind)
        bits = wire_bits(wire.quantizer, levels)
        # The optimizer's buckets, from its own function (sizes stand in for the tensors); each
        # phase (alltoall: the vote, then the all-gather of its 1-bit result) at its own fit.
        for n in bucket_sizes(sizes, wire.bucket_mb):
            if vote_host is not None:  # encode, vote, unpack on the host, beside the wire
                seconds += vote_host(wire.quantizer, wire.collective, n)
            phases = vote_phase_bytes(num_values=n, bits=bits, group_size=p, **kind)
            for phase, nbytes in phases.items():
                seconds += wake_s + network.sent_s(phase, nbytes, p, mesh.spatial)
                sent += nbytes
                inter += nbytes * network.inter_fraction(phase, p, mesh.spatial)
    fraction = _sync_fraction(optimizer_cfg, steps)
    sync_s = sync_bytes = 0.0
    if fraction > 0 and p > 1:
        synced = 4 * _synced_elements(sizes, optimizer_cfg)
        sync_s = fraction * (wake_s + network.collective_s("allreduce", synced, p, mesh.spatial))
        sync_bytes = fraction * ring_allreduce_bytes(synced, p)
        inter += sync_bytes * network.inter_fraction("allreduce", p, mesh.spatial)
    return Exchange(
        seconds=seconds,
        sync_s=sync_s,
        sent=sent + sync_bytes,
        sync_bytes=sync_bytes,
        inter_node_bytes=inter,
    )


def two_level_exchange(
    sizes: tuple[int, ...],
    optimizer_cfg: OptimizerConfig,
    mesh: Mesh,
    network: Links,
    *,
    per_node: int,
    steps: int,
    host: VoteHost | None = None,
    wake_s: float = 0.0,
) -> Exchange:
    """Lion Cub's hierarchy node (optim.hierarchy), per bucket: the fp32 reduce-scatter of c over
    the g data ranks of a node and the 1-bit all-gather of the voted slices, on the intra-node
    link; the vote on 1/g of the bucket over the rail of P/g nodes (levels from the nodes), the
    g rails of a node sharing its link. Momentum syncs: reduce-scatter, the slice's all-reduce
    over the rail, all-gather. Inter-node bytes: the rail's. per_node: g; steps: the horizon of
    the momentum syncs; host: the vote's host work on the slice; wake_s: as `exchange`'s."""
    wire = wire_settings(optimizer_cfg)
    g, nodes = per_node, mesh.data // per_node
    intra_stride, rail_stride = mesh.spatial, mesh.spatial * g
    kind_args = {"collective": wire.collective, "allreduce_dtype": wire.allreduce_dtype}
    bits = wire_bits(
        wire.quantizer, quantizer_levels(wire.quantizer, wire.bits, nodes, **kind_args)
    )
    seconds = sent = inter = 0.0
    for n in bucket_sizes(sizes, wire.bucket_mb):
        m = node_slice_elements(n, g)
        if host is not None:
            seconds += host(wire.quantizer, wire.collective, m)
        for kind, nbytes in node_exchange_bytes(m, g).items():
            seconds += wake_s + network.sent_s(kind, nbytes, g, intra_stride)
            sent += nbytes
        for phase, nbytes in vote_phase_bytes(
            num_values=m, bits=bits, group_size=nodes, **kind_args
        ).items():
            seconds += wake_s + network.sent_s(phase, nbytes, nodes, rail_stride)
            sent += nbytes
            inter += nbytes
    fraction = _sync_fraction(optimizer_cfg, steps)
    sync_s = sync_bytes = 0.0
    if fraction > 0:
        slice_bytes = FP32_BYTES * node_sum_slice_elements(
            _synced_elements(sizes, optimizer_cfg), g
        )
        intra_bytes = node_sum_intra_bytes(slice_bytes, g)  # reduce-scatter and all-gather
        sync_s = network.sent_s("allreduce", intra_bytes, g, intra_stride)
        rail_s = network.collective_s("allreduce", slice_bytes, nodes, rail_stride)
        sync_s = fraction * (3 * wake_s + sync_s + rail_s)
        rail_bytes = ring_allreduce_bytes(slice_bytes, nodes)
        sync_bytes = fraction * (intra_bytes + rail_bytes)
        inter += fraction * rail_bytes
    return Exchange(
        seconds=seconds,
        sync_s=sync_s,
        sent=sent + sync_bytes,
        sync_bytes=sync_bytes,
        inter_node_bytes=inter,
    )


def _synced_elements(sizes: tuple[int, ...], optimizer_cfg: OptimizerConfig) -> int:
    lc = optimizer_cfg.lion_cub
    if lc is not None and lc.momentum_sync.patterns:
        raise ValueError(
            "perf model: optimizer.lion_cub.momentum_sync.patterns selects parameters by name; "
            "the model assumes all momenta are synced (patterns [])"
        )
    return sum(sizes)


class _Sized:
    """A stand-in for a parameter in lion_cub.buckets: its size, dtype and device."""

    dtype, device = "float32", "cpu"

    def __init__(self, n: int) -> None:
        self.n = n

    def numel(self) -> int:
        return self.n


def bucket_sizes(sizes: tuple[int, ...], bucket_mb: float) -> list[int]:
    """Values in each of the optimizer's exchange buckets, from its own function."""
    buckets = split_into_buckets([_Sized(n) for n in sizes], bucket_elements(bucket_mb))
    return [sum(t.numel() for t in bucket) for bucket in buckets]


def predict_step(
    *,
    model_cfg: ModelConfig,
    optimizer_cfg: OptimizerConfig,
    local_batch: int,
    mesh: Mesh,
    network: Links,
    layer_seconds: dict[str, float],
    optimizer_s: float,
    bytes_per_value: int = 4,
    steps: int = 1000,
    ddp_overlap: bool = False,
    vote_host: VoteHost | None = None,
    norm_sync_local_in_layers: bool = False,
    collective_wake_s: float = 0.0,
) -> StepPrediction:
    """The step on one rank. layer_seconds: forward + backward per layer on this rank's block at
    `local_batch` (compute.measure_layers or compute.accelerator_seconds); steps: the horizon over
    which momentum syncs are amortised; ddp_overlap: DDP's all-reduce overlaps backward (as
    train.ddp_exchange_timing overlapped runs it) instead of blocking in it; vote_host: the
    compressed exchange's host work per bucket (a CPU's; in the exchange, as the optimizer
    times it); norm_sync_local_in_layers: layer_seconds hold the synced norms' collectives as
    they ran within a node (a CPU's two-rank calibration), so norm_sync is only what the
    network costs beyond that; collective_wake_s: `exchange`'s wake_s."""
    ex = exchange(
        model_cfg,
        optimizer_cfg,
        mesh,
        network,
        steps=steps,
        layer_seconds=layer_seconds,
        ddp_overlap=ddp_overlap,
        vote_host=vote_host,
        wake_s=collective_wake_s,
    )
    halo_s, halo_bytes = halo(
        model_cfg, batch=local_batch, mesh=mesh, network=network, bytes_per_value=bytes_per_value
    )
    halo_inter = halo_bytes * network.inter_fraction("halo", mesh.spatial, 1)
    norm_sync_s, _ = norm_sync(model_cfg, mesh=mesh, network=network)
    if norm_sync_local_in_layers:
        one_node = dataclasses.replace(network, ranks_per_node=max(mesh.world, 1))
        norm_sync_s = max(0.0, norm_sync_s - norm_sync(model_cfg, mesh=mesh, network=one_node)[0])
    return StepPrediction(
        compute_s=sum(layer_seconds.values()),
        halo_s=halo_s,
        exchange_s=ex.seconds,
        momentum_sync_s=ex.sync_s,
        optimizer_s=optimizer_s,
        comm_bytes_per_step=ex.sent,
        halo_bytes_per_step=halo_bytes,
        exchange_hidden_s=ex.hidden_s,
        inter_node_bytes_per_step=ex.inter_node_bytes + halo_inter,
        norm_sync_s=norm_sync_s,
    )
