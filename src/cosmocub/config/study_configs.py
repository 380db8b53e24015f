"""Typed sections of the studies (sample size, universes, step time, network, scaling) and of the
performance model (bench, extrapolate, accelerators).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cosmocub.config.schema import ConfigError


@dataclass(frozen=True, kw_only=True)
class SampleSizeStudyConfig:
    sizes: tuple[int, ...]
    spatial: tuple[int, ...]
    lrs: tuple[float, ...]
    lr_scales: tuple[float, ...]
    epochs: int
    max_steps_per_epoch: int

    def __post_init__(self) -> None:
        for key in ("spatial", "lr_scales"):
            if len(getattr(self, key)) != len(self.sizes):
                raise ConfigError(
                    f"key 'sample_size_study.{key}': {len(getattr(self, key))} values for "
                    f"{len(self.sizes)} sizes {list(self.sizes)}"
                )
        if len(set(self.sizes)) != len(self.sizes):
            raise ConfigError(f"key 'sample_size_study.sizes': {list(self.sizes)} repeats a size")
        if len(set(self.lrs)) != len(self.lrs):
            raise ConfigError(f"key 'sample_size_study.lrs': {list(self.lrs)} repeats a value")

    def lr_grid(self, size: int) -> tuple[float, ...]:
        """The learning rates the study tries at crop side `size`: lrs × that size's lr_scale
        (to 3 significant digits, so that point names stay short)."""
        scale = self.lr_scales[self.sizes.index(size)]
        return tuple(float(f"{lr * scale:.3g}") for lr in self.lrs)


@dataclass(frozen=True, kw_only=True)
class UniversesStudyConfig:
    train_universes: tuple[int, ...]
    lrs: tuple[float, ...]
    epochs: int
    max_steps_per_epoch: int

    def __post_init__(self) -> None:
        for key in ("train_universes", "lrs"):
            values = list(getattr(self, key))
            if len(set(values)) != len(values):
                raise ConfigError(f"key 'universes_study.{key}': {values} repeats a value")


@dataclass(frozen=True, kw_only=True)
class KnownAnswerStudyConfig:
    lrs: tuple[float, ...]
    # None: the config's top-level seed alone.
    seeds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if len(set(self.lrs)) != len(self.lrs):
            raise ConfigError(f"key 'known_answer_study.lrs': {list(self.lrs)} repeats a value")
        if self.seeds is not None and len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(
                f"key 'known_answer_study.seeds': {list(self.seeds)} repeats a seed (each seed "
                "is one set of universes; a repeat would count it twice in the pooled range)"
            )


@dataclass(frozen=True, kw_only=True)
class StepTimePoint:
    name: str
    ranks_per_node: int
    spatial: int
    optimizer: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class StepTimeStudyConfig:
    epochs: int
    points: tuple[StepTimePoint, ...]

    def __post_init__(self) -> None:
        points = tuple(StepTimePoint(**p) if isinstance(p, dict) else p for p in self.points)
        object.__setattr__(self, "points", points)
        names = [p.name for p in points]
        if len(set(names)) != len(names):
            raise ConfigError(f"key 'step_time_study.points': names repeat: {names}")
        for p in points:
            if p.ranks_per_node % p.spatial:
                raise ConfigError(
                    f"key 'step_time_study.points': point {p.name!r} has spatial {p.spatial}, "
                    f"which does not divide its ranks_per_node {p.ranks_per_node}"
                )


@dataclass(frozen=True, kw_only=True)
class OptimizerVariant:
    """An optimizer section that replaces the base's (config.optimizer_variant): the optimizer's
    name and the whole section as given (name included)."""

    name: str
    section: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class NetworkStudyConfig:
    runner: str  # "emulated" (cosmocub.netemu) or "local" (the scheduler's nodes)
    nodes: int
    ranks_per_node: int
    rates_mbit: tuple[float, ...]
    seeds: tuple[int, ...]
    epochs: int
    max_steps_per_epoch: int
    local_batch_size: int
    target_smoothing: int
    model: dict[str, Any]
    lr: float | None
    reference: str
    variants: dict[str, OptimizerVariant]

    def __post_init__(self) -> None:
        variants = {
            k: OptimizerVariant(name=v["name"], section=v) if isinstance(v, dict) else v
            for k, v in self.variants.items()
        }
        object.__setattr__(self, "variants", variants)
        if self.reference not in self.variants:
            raise ConfigError(
                f"key 'network_study.reference': {self.reference!r} is not one of the variants "
                f"{sorted(self.variants)}"
            )
        if len(set(self.rates_mbit)) != len(self.rates_mbit):
            raise ConfigError(
                f"key 'network_study.rates_mbit': {list(self.rates_mbit)} repeats a rate"
            )
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"key 'network_study.seeds': {list(self.seeds)} repeats a seed")
        if self.runner == "local" and len(self.rates_mbit) != 1:
            # On the scheduler's nodes the links run at the cluster's one rate, which cosmocub
            # does not set: several rates would be the same runs under different labels.
            raise ConfigError(
                f"key 'network_study.rates_mbit': {list(self.rates_mbit)} with runner "
                "local: the cluster's links have one rate, which cosmocub does not shape; give "
                "that one rate (a label), or runner emulated to shape each"
            )


@dataclass(frozen=True, kw_only=True)
class StudiesConfig:
    """What every study does with its points' machine conditions (cosmocub.contention.marks)."""

    contended_ready_share: float
    contended_steal_share: float


@dataclass(frozen=True, kw_only=True)
class ScalingStudyConfig:
    rate_mbit: float
    ranks_per_node: int
    meshes: tuple[tuple[int, int], ...]
    modes: tuple[str, ...]
    global_batch_size: int
    local_batch_size: int
    epochs: int
    max_steps_per_epoch: int

    def __post_init__(self) -> None:
        meshes = tuple(tuple(m) for m in self.meshes)
        object.__setattr__(self, "meshes", meshes)
        if len(set(meshes)) != len(meshes):
            raise ConfigError(f"key 'scaling_study.meshes': {[list(m) for m in meshes]} repeats")
        for data, spatial in meshes:
            if (data * spatial) % self.ranks_per_node:
                raise ConfigError(
                    f"key 'scaling_study.meshes': mesh {data}x{spatial} has {data * spatial} "
                    f"ranks, not a multiple of ranks_per_node {self.ranks_per_node}"
                )
            if "strong" in self.modes and self.global_batch_size % data:
                raise ConfigError(
                    f"key 'scaling_study.global_batch_size': {self.global_batch_size} does not "
                    f"divide over mesh {data}x{spatial}'s {data} data ranks"
                )


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    ranks: int
    nodes: int
    sizes_bytes: tuple[int, ...]
    repeats: int
    max_call_s: float


@dataclass(frozen=True, kw_only=True)
class AcceleratorConfig:
    peak_tflops: float
    conv3d_share_of: str | None  # a hardware_specs accelerator; its measured share is efficiency
    efficiency: float | None
    memory_gb: float
    memory_gbyte_s: float
    intra_node_gbit: float


@dataclass(frozen=True, kw_only=True)
class ExtrapolateConfig:
    config: str
    sample_sizes: tuple[int, ...]
    gpus: tuple[int, ...]
    gpus_per_node: int
    link_gbit: tuple[float, ...]
    latency_us: float
    intra_latency_us: float
    activation_bytes: int
    halo_share_limit: float
    optimizers: dict[str, dict[str, Any]]
    accelerators: dict[str, AcceleratorConfig]

    def __post_init__(self) -> None:
        accelerators = {
            k: AcceleratorConfig(**v) if isinstance(v, dict) else v
            for k, v in self.accelerators.items()
        }
        object.__setattr__(self, "accelerators", accelerators)
        if not accelerators:
            raise ConfigError("key 'perf_model.extrapolate.accelerators': none given")
        for name, acc in accelerators.items():
            if (acc.conv3d_share_of is None) == (acc.efficiency is None):
                given = "neither" if acc.efficiency is None else "both"
                raise ConfigError(
                    f"key 'perf_model.extrapolate.accelerators.{name}': {given} of "
                    "conv3d_share_of and efficiency given; give one"
                )


@dataclass(frozen=True, kw_only=True)
class CalibrationConfig:
    path: str | None
    repeats: int
    threads: tuple[int, ...] | None
    batches: tuple[int, ...]
    sizes: tuple[int, ...]
    channels: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "channels", tuple(tuple(c) for c in self.channels))


@dataclass(frozen=True, kw_only=True)
class PerfModelConfig:
    bench: BenchConfig
    cores: int | None
    fit_set: tuple[str, ...]
    calibration: CalibrationConfig
    extrapolate: ExtrapolateConfig
