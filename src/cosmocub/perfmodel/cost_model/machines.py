"""The machine a prediction is for: what a rank computes on (an accelerator at peak × efficiency,
or this machine's CPU from its calibrated rates) and the links between ranks (assumed, or α–β
fitted here).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

from cosmocub.config import (
    AcceleratorConfig,
    ExtrapolateConfig,
    ModelConfig,
    OptimizerConfig,
    OptimizerKind,
)
from cosmocub.models.memory_layout import memory_format
from cosmocub.perfmodel.alpha_beta import AlphaBeta
from cosmocub.perfmodel.cost_model.hardware_specs import ACCELERATORS, AcceleratorSpec
from cosmocub.perfmodel.cost_model.step_model import parameter_sizes
from cosmocub.perfmodel.cost_model.topology import Network
from cosmocub.perfmodel.measure.compute import accelerator_seconds
from cosmocub.perfmodel.measure.cpu_model import Calibration
from cosmocub.perfmodel.measure.link_fits import LOOPBACK, LinkFits

# The optimizer's update reads and writes parameters, gradients and its state in fp32: about
# 16 bytes per parameter for Lion (p, g, m read; p, m written), 24 for AdamW; Lion Cub adds its
# quantize / pack / vote / unpack passes, about 8 more.
UPDATE_BYTES_PER_PARAM = {
    OptimizerKind.LION: 20,
    OptimizerKind.ADAMW: 28,
    OptimizerKind.SGD: 20,
    OptimizerKind.DISTRIBUTED_LION: 28,
    OptimizerKind.LION_CUB: 28,
}
THIS_CPU = "cpu"


def update_bytes_per_param(optimizer_cfg: OptimizerConfig) -> int:
    """UPDATE_BYTES_PER_PARAM of the config's optimizer, or a ValueError naming the key."""
    if optimizer_cfg.name not in UPDATE_BYTES_PER_PARAM:
        raise ValueError(
            f"key 'optimizer.name': {optimizer_cfg.name.value!r} has no update cost on an "
            f"accelerator (UPDATE_BYTES_PER_PARAM has {', '.join(UPDATE_BYTES_PER_PARAM)})"
        )
    return UPDATE_BYTES_PER_PARAM[optimizer_cfg.name]


log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    """A GPU class of perf_model.extrapolate.accelerators: layers at peak × efficiency, the
    update memory-bound at the HBM bandwidth, activations of `bytes_per_value` bytes."""

    name: str
    spec: AcceleratorConfig
    bytes_per_value: int
    # The vote's host passes are in the update's memory-bound cost (UPDATE_BYTES_PER_PARAM).
    vote_host = None
    # NCCL's waits spin on the device: no thread to wake.
    collective_wake_s = 0.0

    def __post_init__(self) -> None:
        named = self.spec.conv3d_share_of
        if named is None:
            return
        key = f"key 'perf_model.extrapolate.accelerators.{self.name}.conv3d_share_of'"
        if named not in ACCELERATORS:
            raise ValueError(f"{key}: {named!r} is not one of {', '.join(ACCELERATORS)}")
        # Where none was measured a GEMM's share stands in (optimistic): not taken unasked.
        if not ACCELERATORS[named].conv3d_share_measured:
            raise ValueError(f"{key}: {named} has no measured 3D-conv share; give efficiency")

    @property
    def efficiency(self) -> float:
        """The layers' share of peak: the measured 3D-conv share of the hardware_specs
        accelerator named (the roofline's number), else the config's assumed efficiency."""
        named = self.spec.conv3d_share_of
        return self.spec.efficiency if named is None else ACCELERATORS[named].conv3d_share

    @property
    def memory_bytes(self) -> float | None:
        return self.spec.memory_gb * 1e9

    def layer_seconds(
        self,
        model_cfg: ModelConfig,
        *,
        batch: int,
        split: tuple[int, int, int],
        synced_norm: bool = False,
    ) -> dict[str, float]:
        """Forward + backward per layer at peak × efficiency; a synced norm's arithmetic is
        left in the efficiency (its collectives are the network's)."""
        del synced_norm
        spatial = split[0] * split[1] * split[2]
        return accelerator_seconds(
            model_cfg,
            batch=batch,
            spatial=spatial,
            peak_flops=self.spec.peak_tflops * 1e12,
            efficiency=self.efficiency,
        )

    def norm_collectives_in_layers(self, split: tuple[int, int, int]) -> bool:
        """The synced norms' collectives are the network's (model.norm_sync), all of them."""
        del split
        return False

    def optimizer_seconds(self, model_cfg: ModelConfig, optimizer_cfg: OptimizerConfig) -> float:
        update = update_bytes_per_param(optimizer_cfg) * sum(parameter_sizes(model_cfg))
        return update / (self.spec.memory_gbyte_s * 1e9)

    def describe(self) -> str:
        s = self.spec
        share = f"{s.conv3d_share_of}'s measured 3D-conv share" if s.conv3d_share_of else "assumed"
        return (
            f"{self.name}: {s.peak_tflops:g} TFLOP/s peak x {self.efficiency:g} efficiency "
            f"({share}), "
            f"{s.memory_gb:g} GB at {s.memory_gbyte_s:g} GB/s, {s.intra_node_gbit:g} Gbit/s "
            f"within a node, {self.bytes_per_value} bytes per activation"
        )


@dataclass(frozen=True, kw_only=True)
class ThisCpu:
    """This machine's cores as one node: layers and the update from its calibration (the grid's
    rate fits) at `threads` threads per rank, × `slowdown` where the node's ranks
    oversubscribe its cores (fp32 activations)."""

    threads: int
    slowdown: float
    calibration: Calibration
    name: str = THIS_CPU
    bytes_per_value: int = 4
    memory_bytes: float | None = None

    def layer_seconds(
        self,
        model_cfg: ModelConfig,
        *,
        batch: int,
        split: tuple[int, int, int],
        synced_norm: bool = False,
    ) -> dict[str, float]:
        """Per layer from the calibration; `synced_norm`: the mesh has more than one rank, so
        training's batch norms are the synced ones (models.parallelize)."""
        layers = self.calibration.layer_seconds(
            model_cfg,
            batch=batch,
            split=split,
            threads=self.threads,
            memory_format=training_memory_format(split),
            synced_norm=synced_norm,
        )
        return {k: v * self.slowdown for k, v in layers.items()}

    def norm_collectives_in_layers(self, split: tuple[int, int, int]) -> bool:
        """Whether layer_seconds' synced norms hold their collectives as they ran on loopback
        (the calibration's two-rank fit), so a link costs only its excess (model.predict_step)."""
        fmt = training_memory_format(split)
        return self.calibration.norms_hold_local_collectives(fmt, self.threads)

    @property
    def collective_wake_s(self) -> float:
        """What a blocking collective costs after compute beyond its α (the calibration's)."""
        return self.calibration.wake_s

    def vote_host(self, quantizer: str, collective: str, elements: int) -> float:
        """One bucket's compressed-exchange host work (model.VoteHost), from the calibration."""
        seconds = self.calibration.vote_seconds(quantizer, collective, elements, self.threads)
        return self.slowdown * seconds

    def optimizer_seconds(self, model_cfg: ModelConfig, optimizer_cfg: OptimizerConfig) -> float:
        sizes = parameter_sizes(model_cfg)
        update = self.calibration.optimizer_seconds(sizes, optimizer_cfg, threads=self.threads)
        return self.slowdown * update

    def describe(self) -> str:
        cal = self.calibration
        return (
            f"{self.name}: this machine's cores ({cal.machine['cpu_model']}), layers from its "
            f"calibration ({len(cal.timings)} timings, load {cal.load_1m[0]:.2f}) at "
            f"{self.threads} threads per rank, x {self.slowdown:g} for oversubscription"
        )


def training_memory_format(split: tuple[int, int, int]) -> str:
    """The activations' layout training uses on a CPU (models.memory_layout), by name."""
    import torch

    layout = memory_format(torch.device("cpu"), spatial=math.prod(split))
    return "channels_last_3d" if layout == torch.channels_last_3d else "contiguous"


def this_cpu(
    *, threads_per_rank: int | None, ranks_per_node: int, cores: int, calibration: Calibration
) -> ThisCpu:
    """A node of this machine's `cores`: threads as training sets them (train.threads_per_rank,
    else the cores shared evenly by the node's ranks), slowed where ranks × threads > cores."""
    threads = threads_per_rank or max(1, cores // ranks_per_node)
    return ThisCpu(
        threads=threads,
        slowdown=max(1.0, ranks_per_node * threads / cores),
        calibration=calibration,
    )


def assumed_network(
    settings: ExtrapolateConfig, spec: AcceleratorConfig, *, rate_mbit: float, ranks_per_node: int
) -> Network:
    """Between nodes `rate_mbit` per node at settings.latency_us a message round; within a node
    the accelerator's intra_node_gbit at settings.intra_latency_us."""
    if rate_mbit <= 0:
        raise ValueError(f"link rate {rate_mbit:g} Mbit/s: an assumed link needs a rate > 0")
    inter = AlphaBeta(alpha_s=settings.latency_us * 1e-6, beta_s_per_byte=8 / (rate_mbit * 1e6))
    intra = AlphaBeta(
        alpha_s=settings.intra_latency_us * 1e-6,
        beta_s_per_byte=8 / (spec.intra_node_gbit * 1e9),
    )
    return Network.uniform(inter, intra, ranks_per_node=ranks_per_node)


def fitted_network(fits: LinkFits, *, rate_mbit: float | None, ranks_per_node: int) -> Network:
    """The fits of `perf-model fit`, as perf-model validate predicts a measured point: within a
    node the loopback fit; between nodes the emulated link's at `rate_mbit` (0: unshaped), or
    the nearest measured rate's with a warning naming both. `rate_mbit` None: every group stays
    on its node, and a collective that leaves it is an error, not a guess."""
    inter: dict[str, AlphaBeta] = {}
    if rate_mbit is not None:
        _, inter, note = fits.inter_node(rate_mbit)
        if note:
            log.warning("%s", note)
    return Network(inter_node=inter, intra_node=fits.costs(LOOPBACK), ranks_per_node=ranks_per_node)


def accelerator_spec(name: str, acc: AcceleratorConfig) -> AcceleratorSpec:
    """An accelerator of perf_model.extrapolate.accelerators as the roofline prices a preset's:
    the hardware_specs entry it names (conv3d_share_of) or whose key its name begins (its NCCL
    generation, NVLinks, fp32 peak, kernel floor), with the config's own peak, memory, HBM and
    intra-node rate, and its measured share (conv3d_share_of) or its efficiency as the 3D
    convolutions' share; a ValueError naming the key where neither finds an entry."""
    key = f"perf_model.extrapolate.accelerators.{name}"
    named = acc.conv3d_share_of
    matches = [named] if named else [k for k in ACCELERATORS if k.startswith(name)]
    if len(matches) != 1 or matches[0] not in ACCELERATORS:
        raise ValueError(
            f"key '{key}': no single accelerator of hardware_specs to take its generation and "
            f"links from (give conv3d_share_of: one of {', '.join(ACCELERATORS)})"
        )
    base = ACCELERATORS[matches[0]]
    share = base.conv3d_share if named else acc.efficiency
    if share is None:
        raise ValueError(f"key '{key}': give conv3d_share_of or efficiency")
    return dataclasses.replace(
        base,
        name=f"{name} ({base.name}'s generation, the config's rates)",
        peak_tflops={**base.peak_tflops, "fp16": acc.peak_tflops, "bf16": acc.peak_tflops},
        memory_gb=acc.memory_gb,
        hbm_gbyte_s=acc.memory_gbyte_s,
        intra_node_gbyte_s=acc.intra_node_gbit / 8,
        intra_rate_stated=True,
        conv3d_share=share,
        sources={**base.sources, "config": key},
    )
