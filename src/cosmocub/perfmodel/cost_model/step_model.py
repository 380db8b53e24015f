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
                  Cub's spatial average + the exchange plan the optimizer runs (every bucket's
                  collectives, optim.exchange_plan), priced collective by collective; an
                  overlapped plan's first vote phases under backward as DDP's buckets are
  momentum_sync   Lion Cub's fp32 average of momenta, amortised over the steps it skips
  norm_sync       the synced batch norms' statistics over the mesh, two collectives a block
                  (perfmodel.cost_model.layer_collectives; their arithmetic beyond a plain norm is
                  compute)
  optimizer       the update arithmetic (measured on one rank)
Byte counts come from the optimizer's own functions (cosmocub.optim); every
collective is priced by the network (topology.Links: α–β rings, or NCCL's own choice and time,
perfmodel.cost_model.cluster_network).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cosmocub.config import ModelConfig, OptimizerConfig
from cosmocub.optim.collectives import ring_allreduce_bytes
from cosmocub.optim.exchange_plan import (
    ExchangePlan,
    Transfer,
    bucket_tensor_sizes,
    plan_exchange,
)
from cosmocub.optim.lion_cub_settings import LionCubSettings
from cosmocub.perfmodel.cost_model.layer_collectives import halo, norm_sync
from cosmocub.perfmodel.cost_model.overlap import ddp_buckets, exposed_allreduce, parameter_layers
from cosmocub.perfmodel.cost_model.topology import Links, Mesh

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
    the step) or overlapped with backward (`layer_seconds` sets when each bucket is ready); for
    the distributed Lions, the optimizer's plan (`lion_cub_plan`), its overlapped phases as
    DDP's overlapped buckets.
    wake_s: what each collective the step waits on costs after compute beyond its α (a CPU's,
    from its calibration; 0 elsewhere)."""
    sizes = parameter_sizes(model_cfg)
    payload = 4 * sum(sizes)  # fp32 gradients
    if optimizer_cfg.name.averages_gradients:
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
    # distributed_lion / lion_cub: the spatial average in fp32 (train.grad_sync), then the
    # optimizer's own exchange plan: every bucket each step, the momentum sync on its steps.
    seconds, sent, inter = 0.0, 0.0, 0.0
    if mesh.spatial > 1:
        seconds += wake_s + network.collective_s("allreduce", payload, mesh.spatial)
        averaged = ring_allreduce_bytes(payload, mesh.spatial)
        sent += averaged
        inter += averaged * network.inter_fraction("allreduce", mesh.spatial, 1)
    plan = lion_cub_plan(model_cfg, optimizer_cfg, mesh, network)
    under_backward: list[tuple[str, float]] = []  # (layer that completes the bucket, seconds)
    for bucket, layer in zip(plan.buckets, _bucket_layers(model_cfg, plan), strict=True):
        if vote_host is not None and bucket.transfers:  # encode, vote, unpack beside the wire
            seconds += vote_host(plan.wire.quantizer, plan.collective, bucket.voted_elements)
        for launched in (True, False):
            part = [t for t in bucket.transfers if t.overlaps_backward == launched]
            # The step waits on a launched phase only once it is exposed (below).
            part_s, part_sent, part_inter = price_transfers(
                part, mesh, network, wake_s=0.0 if launched else wake_s
            )
            if launched and part:
                under_backward.append((layer, part_s))
            else:
                seconds += part_s
            sent, inter = sent + part_sent, inter + part_inter
    total = sum(s for _, s in under_backward)
    layers = list(dict.fromkeys(layer for layer, _ in parameter_layers(model_cfg)))
    exposed = exposed_allreduce(under_backward, layer_seconds, layers) if under_backward else 0.0
    seconds += exposed + wake_s * float(exposed > 0)
    fraction = plan.sync_fraction(steps)
    sync_s, sync_bytes, sync_inter = (
        fraction * x for x in price_transfers(plan.momentum_sync, mesh, network, wake_s=wake_s)
    )
    return Exchange(
        seconds=seconds,
        hidden_s=total - exposed,
        sync_s=sync_s,
        sent=sent + sync_bytes,
        sync_bytes=sync_bytes,
        inter_node_bytes=inter + sync_inter,
    )


def _bucket_layers(model_cfg: ModelConfig, plan: ExchangePlan) -> list[str]:
    """The layer whose backward completes each bucket of the plan: the buckets hold the
    parameters in reverse registration order, so a bucket's last is its first registered."""
    backward_order = iter(reversed(parameter_layers(model_cfg)))
    out = []
    for bucket in plan.buckets:
        for _ in range(bucket.tensors):
            layer, _ = next(backward_order)
        out.append(layer)
    return out


def lion_cub_plan(
    model_cfg: ModelConfig, optimizer_cfg: OptimizerConfig, mesh: Mesh, network: Links
) -> ExchangePlan:
    """The exchange plan the optimizer builds for this model on this mesh (optim.exchange_plan:
    its settings, buckets and levels), the data axis laid over the network's nodes as
    ParallelDims lays it: the data ranks of one spatial index on a node, 1 where a spatial group
    spans nodes."""
    settings = LionCubSettings.from_config(optimizer_cfg, lr=optimizer_cfg.lr)
    sizes = parameter_sizes(model_cfg)
    per_node = max(1, network.ranks_per_node // mesh.spatial)
    return plan_exchange(
        settings,
        bucket_tensor_sizes(sizes, settings.bucket_mb),
        data_ranks=mesh.data,
        data_per_node=per_node if mesh.data % per_node == 0 else 1,
        synced_elements=_synced_elements(sizes, optimizer_cfg),
    )


def price_transfers(
    transfers: Sequence[Transfer], mesh: Mesh, network: Links, *, wake_s: float = 0.0
) -> tuple[float, float, float]:
    """(seconds, bytes sent, of which across nodes) of a plan's collectives on one rank, each
    priced by the network at its group's size and stride (a plan's data stride × spatial: the
    data axis is the outer mesh axis); wake_s: as `exchange`'s, once a collective."""
    seconds = sent = inter = 0.0
    for t in transfers:
        stride = t.data_stride * mesh.spatial
        seconds += wake_s + network.sent_s(t.collective, t.sent_bytes, t.group_size, stride)
        sent += t.sent_bytes
        inter += t.sent_bytes * network.inter_fraction(t.collective, t.group_size, stride)
    return seconds, sent, inter


def _synced_elements(sizes: tuple[int, ...], optimizer_cfg: OptimizerConfig) -> int:
    lc = optimizer_cfg.lion_cub
    if lc is not None and lc.momentum_sync.patterns:
        raise ValueError(
            "perf model: optimizer.lion_cub.momentum_sync.patterns selects parameters by name; "
            "the model assumes all momenta are synced (patterns [])"
        )
    return sum(sizes)


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
