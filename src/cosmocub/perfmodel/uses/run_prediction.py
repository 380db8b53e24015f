"""`perf-model predict`: a config's step on a mesh of nodes × ranks per node, one network and one
device: the step's parts, bytes per rank per link, memory, epoch time, Lion Cub against Lion.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cosmocub.config import (
    Config,
    ModelConfig,
    OptimizerConfig,
    OptimizerKind,
    derive,
    optimizer_variant,
)
from cosmocub.data.naming import universe_ids
from cosmocub.data.splits import split_counts
from cosmocub.models.parallelize import check_spatial_split
from cosmocub.models.summary import activation_bytes
from cosmocub.perfmodel.cost_model.machines import Accelerator, ThisCpu
from cosmocub.perfmodel.cost_model.step_model import StepPrediction, parameter_sizes, predict_step
from cosmocub.perfmodel.cost_model.topology import Mesh, Network

# Memory per rank besides activations: parameters, gradients and two optimizer states, fp32.
STATE_BYTES_PER_PARAM = 16
# Steps over which momentum syncs are amortised when the run's length is not known.
DEFAULT_HORIZON_STEPS = 1000
PARTS = ("compute", "halo", "exchange", "momentum_sync", "optimizer")


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What a step runs, from a config: its model, optimizer, local batch, whether DDP overlaps
    its all-reduce with backward (train.ddp_exchange_timing), and the epochs it trains for."""

    model: ModelConfig
    optimizer: OptimizerConfig
    local_batch: int
    ddp_overlap: bool
    epochs: int
    max_steps_per_epoch: int | None

    @classmethod
    def of(cls, cfg: Config) -> Workload:
        return cls(
            model=cfg.model,
            optimizer=cfg.optimizer,
            local_batch=cfg.train.local_batch_size,
            ddp_overlap=cfg.train.ddp_exchange_timing == "overlapped",
            epochs=cfg.train.epochs,
            max_steps_per_epoch=cfg.train.max_steps_per_epoch,
        )

    def at_sample_size(self, size: int) -> Workload:
        """The same layers on `size`³ samples (the first dense layer grows with the sample)."""
        return dataclasses.replace(self, model=dataclasses.replace(self.model, input_size=size))


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """One config's step on one rank of `mesh` (nodes × ranks_per_node) and what follows from it;
    `lion`: Lion's step on the same mesh (DDP overlapped) where the config runs Lion Cub."""

    optimizer: str
    device: str
    mesh: Mesh
    nodes: int
    ranks_per_node: int
    local_batch: int
    step: StepPrediction
    ddp_overlap: bool
    memory_bytes: float
    memory_capacity_bytes: float | None
    steps_per_epoch: int | None
    epochs: int
    lion: StepPrediction | None = None

    @property
    def fits_memory(self) -> bool | None:
        if self.memory_capacity_bytes is None:
            return None
        return self.memory_bytes <= self.memory_capacity_bytes

    @property
    def samples_per_s(self) -> float:
        return self.local_batch * self.mesh.data / self.step.step_s

    @property
    def inter_node_bytes_per_step(self) -> float:
        return self.step.inter_node_bytes_per_step

    @property
    def intra_node_bytes_per_step(self) -> float:
        s = self.step
        return s.comm_bytes_per_step + s.halo_bytes_per_step - s.inter_node_bytes_per_step

    @property
    def epochs_s(self) -> float | None:
        """Training steps of `epochs` epochs (no validation, no data wait)."""
        if self.steps_per_epoch is None:
            return None
        return self.epochs * self.steps_per_epoch * self.step.step_s

    @property
    def speedup(self) -> float | None:
        return None if self.lion is None else self.lion.step_s / self.step.step_s

    def as_dict(self) -> dict[str, Any]:
        s = self.step
        return {
            "optimizer": self.optimizer,
            "device": self.device,
            "data": self.mesh.data,
            "spatial": self.mesh.spatial,
            "split": "x".join(map(str, self.mesh.split)),
            "nodes": self.nodes,
            "ranks_per_node": self.ranks_per_node,
            "ddp_overlap": self.ddp_overlap,
            "step_s": s.step_s,
            **{f"{part}_s": getattr(s, f"{part}_s") for part in PARTS},
            "exchange_hidden_s": s.exchange_hidden_s,
            "comm_bytes_per_step": s.comm_bytes_per_step,
            "halo_bytes_per_step": s.halo_bytes_per_step,
            "intra_node_bytes_per_step": self.intra_node_bytes_per_step,
            "inter_node_bytes_per_step": self.inter_node_bytes_per_step,
            "memory_bytes": self.memory_bytes,
            "fits_memory": self.fits_memory,
            "samples_per_s": self.samples_per_s,
            "steps_per_epoch": self.steps_per_epoch,
            "epochs": self.epochs,
            "epochs_s": self.epochs_s,
            "lion_step_s": None if self.lion is None else self.lion.step_s,
            "speedup_over_lion": self.speedup,
        }


def predict_run(
    work: Workload,
    mesh: Mesh,
    network: Network,
    device: Accelerator | ThisCpu,
    *,
    lion: OptimizerConfig | None = None,
    train_samples: int | None = None,
) -> Prediction:
    """The step of `work` on one rank of `mesh`; with `lion` (lion_reference), Lion's step on
    the same mesh beside it; with `train_samples`, the steps of an epoch and of work.epochs."""

    model_cfg, batch, epochs = work.model, work.local_batch, work.epochs
    check_spatial_split(model_cfg, model_cfg.input_size, mesh.split)
    per_epoch = None
    if train_samples is not None:
        per_epoch = steps_per_epoch(
            train_samples, data=mesh.data, batch=batch, cap=work.max_steps_per_epoch
        )
    horizon = per_epoch * epochs if per_epoch and epochs else DEFAULT_HORIZON_STEPS
    layers = device.layer_seconds(
        model_cfg, batch=batch, split=mesh.split, synced_norm=mesh.world > 1
    )

    def step(optimizer_cfg: OptimizerConfig, overlap: bool) -> StepPrediction:
        return predict_step(
            model_cfg=model_cfg,
            optimizer_cfg=optimizer_cfg,
            local_batch=batch,
            mesh=mesh,
            network=network,
            layer_seconds=layers,
            optimizer_s=device.optimizer_seconds(model_cfg, optimizer_cfg),
            bytes_per_value=device.bytes_per_value,
            steps=horizon,
            ddp_overlap=overlap,
            vote_host=device.vote_host,
            norm_sync_local_in_layers=device.norm_collectives_in_layers(mesh.split),
            collective_wake_s=device.collective_wake_s,
        )

    return Prediction(
        optimizer=work.optimizer.name,
        device=device.name,
        mesh=mesh,
        nodes=math.ceil(mesh.world / network.ranks_per_node),
        ranks_per_node=network.ranks_per_node,
        local_batch=batch,
        step=step(work.optimizer, work.ddp_overlap),
        ddp_overlap=work.ddp_overlap,
        memory_bytes=memory_bytes(model_cfg, mesh.split, batch, device.bytes_per_value),
        memory_capacity_bytes=device.memory_bytes,
        steps_per_epoch=per_epoch,
        epochs=epochs,
        # The baseline a user would run: DDP's all-reduce overlapped with backward.
        lion=None if lion is None else step(lion, True),
    )


def lion_reference(cfg: Config) -> OptimizerConfig | None:
    """For a Lion Cub config, Lion with its other optimizer settings (the baseline of Lion Cub's
    speedup); None for any other optimizer."""
    if cfg.optimizer.name is not OptimizerKind.LION_CUB:
        return None
    lion = {"name": OptimizerKind.LION.value}
    replace = {"optimizer": optimizer_variant(cfg.values["optimizer"], lion)}
    return derive(cfg, {}, replace=replace, source=f"{cfg.source} (Lion baseline)").optimizer


def split_samples(cfg: Config, split: str) -> int:
    """Samples of `split` as preprocessing cuts them: the split's share of the universes (whole
    universes, data.splits) × (universes.size / preprocess.sample_size)³ crops each."""

    universes = len(universe_ids(cfg))
    crops = (cfg.universes.size // cfg.preprocess.sample_size) ** 3
    return split_counts(universes, cfg.preprocess.splits.as_dict())[split] * crops


def train_samples(cfg: Config) -> int:
    return split_samples(cfg, "train")


def steps_per_epoch(samples: int, *, data: int, batch: int, cap: int | None) -> int:
    """Steps of one epoch as the sampler runs it: each data rank's equal share (drop_last) in
    whole batches, at most `cap` (train.max_steps_per_epoch)."""
    steps = samples // data // batch
    if steps == 0:
        raise ValueError(
            f"{samples} train samples over {data} data ranks give no full batch of {batch} "
            "(train.local_batch_size) per rank"
        )
    return steps if cap is None else min(steps, cap)


@functools.cache
def _activation_bytes(model_cfg: ModelConfig, split: tuple[int, int, int], batch: int) -> int:

    return activation_bytes(model_cfg, split, batch=batch)["total"]


def memory_bytes(
    model_cfg: ModelConfig, split: tuple[int, int, int], batch: int, bytes_per_value: int
) -> float:
    """Activations saved for backward (at bytes_per_value; models.summary counts fp32) plus
    STATE_BYTES_PER_PARAM per parameter."""
    act = _activation_bytes(model_cfg, split, batch) * bytes_per_value / 4
    return act + STATE_BYTES_PER_PARAM * sum(parameter_sizes(model_cfg))


def rate_label(rate_mbit: float) -> str:
    if rate_mbit == 0:
        return "fitted link"
    if rate_mbit >= 1000:
        return f"{rate_mbit / 1000:g} Gbit/s"
    return f"{rate_mbit:g} Mbit/s"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def format_table(labels: Sequence[str], predictions: Sequence[Prediction]) -> str:
    """One column per label (a link rate, a cluster): the step and its parts (ms), bytes per
    rank per step by link, memory, throughput, epoch time and, for Lion Cub, Lion's step and
    the speedup."""
    first = predictions[0]
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, value: Callable[[Prediction], str]) -> None:
        rows.append((label, [value(p) for p in predictions]))

    row("step (ms)", lambda p: f"{1e3 * p.step.step_s:.4g}")
    for part in PARTS:
        label = "exchange (exposed)" if part == "exchange" and first.ddp_overlap else part
        row(
            f"  {label.replace('_', ' ')}",
            lambda p, part=part: f"{1e3 * getattr(p.step, f'{part}_s'):.4g}",
        )
    if any(p.step.exchange_hidden_s for p in predictions):
        row("DDP all-reduce under backward (ms)", lambda p: f"{1e3 * p.step.exchange_hidden_s:.4g}")
    row("MB/rank/step within a node", lambda p: f"{p.intra_node_bytes_per_step / 1e6:.4g}")
    row("MB/rank/step across nodes", lambda p: f"{p.inter_node_bytes_per_step / 1e6:.4g}")
    capacity = first.memory_capacity_bytes
    of = "" if capacity is None else f" of {capacity / 1e9:g}"
    row(f"memory/rank (GB{of})", lambda p: f"{p.memory_bytes / 1e9:.3g}")
    row("samples/s", lambda p: f"{p.samples_per_s:.4g}")
    if first.steps_per_epoch is not None:
        row(
            f"{first.epochs} epochs of {first.steps_per_epoch} steps",
            lambda p: _duration(p.epochs_s or 0.0),
        )
    if first.lion is not None:
        row("Lion, DDP overlapped (ms)", lambda p: f"{1e3 * p.lion.step_s:.4g}" if p.lion else "")
        row("Lion Cub speedup over Lion", lambda p: f"{p.speedup:.3g}x")
    width = max(len(label) for label, _ in rows) + 2
    cols = [max(12, len(label) + 2) for label in labels]
    head = " " * width + "".join(lab.rjust(c) for lab, c in zip(labels, cols, strict=True))
    body = [
        label.ljust(width) + "".join(v.rjust(c) for v, c in zip(values, cols, strict=True))
        for label, values in rows
    ]
    return "\n".join([head, *body])
