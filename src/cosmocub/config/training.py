"""Typed sections of the run's training: optimizer, train, evaluate, tracking and the cluster's
resources. Fields mirror the schema; checks it cannot express raise ConfigError with the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cosmocub.config.optimizer_kind import OptimizerKind
from cosmocub.config.schema import ConfigError


@dataclass(frozen=True, kw_only=True)
class MomentumSyncConfig:
    schedule: str
    every_steps: int
    k: float
    patterns: tuple[str, ...]


class WireChoice(Protocol):
    """Lion Cub's wire as a config section or optim.LionCubSettings holds it."""

    quantizer: str
    bits: int | None
    collective: str
    allreduce_dtype: str | None


def wire_refusal(wire: WireChoice) -> tuple[str, str] | None:
    """(the key, why) where Lion Cub's quantizer, bits, collective and all-reduce dtype cannot
    go together; None where they can. The config and optim.LionCubSettings both refuse by it."""
    quantizer, bits, collective = wire.quantizer, wire.bits, wire.collective
    allreduce_dtype = wire.allreduce_dtype
    if quantizer == "sign" and bits not in (None, 1):
        return "bits", (
            f"quantizer 'sign' sends 1 bit, got bits={bits} (pass bits=1, or quantizer 'l1', "
            "'linf' or 'l0' for 2..8 bits)"
        )
    if quantizer != "sign" and bits == 1:
        return "bits", (
            f"quantizer {quantizer!r} needs >= 2 bits (1 bit leaves no level besides the sign: "
            "use quantizer 'sign')"
        )
    if allreduce_dtype is not None and collective != "allreduce":
        return "allreduce_dtype", (
            f"only collective 'allreduce' sums on the wire; {collective!r} sums on the rank in "
            f"int16/int32 (drop allreduce_dtype {allreduce_dtype!r})"
        )
    return None


@dataclass(frozen=True, kw_only=True)
class LionCubConfig:
    quantizer: str
    bits: int | None
    collective: str
    allreduce_dtype: str | None
    hierarchy: str
    overlap: bool
    bucket_mb: float
    momentum_sync: MomentumSyncConfig

    def __post_init__(self) -> None:
        if isinstance(self.momentum_sync, dict):  # built from a resolved dict
            sync = dict(self.momentum_sync, patterns=tuple(self.momentum_sync["patterns"]))
            object.__setattr__(self, "momentum_sync", MomentumSyncConfig(**sync))
        if (refusal := wire_refusal(self)) is not None:
            raise ConfigError(f"key 'optimizer.lion_cub.{refusal[0]}': {refusal[1]}")

    @property
    def resolved_bits(self) -> int:
        return 1 if self.quantizer == "sign" else (self.bits or 8)

    @property
    def resolved_allreduce_dtype(self) -> str:
        return self.allreduce_dtype or "int8"


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    name: OptimizerKind  # given as its string (YAML, a resolved dict), parsed once here
    lr: float
    base_batch_size: int
    momentum: float
    betas: tuple[float, float] | None
    weight_decay: float
    warmup_epochs: int
    decay_epochs: tuple[int, ...]
    decay_factors: tuple[float, ...]
    lion_cub: LionCubConfig | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "name", OptimizerKind.parse(self.name))
        except ValueError as err:
            raise ConfigError(f"key 'optimizer.name': {err}") from None
        if isinstance(self.lion_cub, dict):  # built from a resolved dict
            object.__setattr__(self, "lion_cub", LionCubConfig(**self.lion_cub))
        if self.lion_cub is not None and not self.name.takes_lion_cub_options:
            raise ConfigError(
                f"key 'optimizer.lion_cub': options given for optimizer.name "
                f"{self.name.value!r} (only lion_cub takes them)"
            )
        if len(self.decay_epochs) != len(self.decay_factors):
            raise ConfigError(
                f"key 'optimizer.decay_epochs': {len(self.decay_epochs)} epochs but "
                f"{len(self.decay_factors)} decay_factors"
            )

    @property
    def resolved_betas(self) -> tuple[float, float]:
        if self.betas is not None:
            return self.betas
        return (0.9, 0.99) if self.name.is_lion else (0.9, 0.999)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    run_name: str
    epochs: int
    local_batch_size: int
    ranks_per_node: int  # ranks started on each node (torchrun's --nproc-per-node)
    augment: bool
    num_data_workers: int
    checkpoint_every_steps: int
    keep_old_checkpoint_folders: int | None
    max_restarts: int
    deterministic: bool
    log_every_steps: int
    backend: str
    amp: str
    threads_per_rank: int | None
    collective_timeout_s: float
    ddp_exchange_timing: str
    max_steps_per_epoch: int | None
    seed: int | None  # None: the config's seed (Config.training_seed)
    universes: int | None  # None: every training universe
    val_universes: int | None  # None: validate on every validation universe
    # How the step is fed and run; "auto" is made concrete on the device (train/step_settings.py).
    data_placement: str  # auto, loader, device, pinned
    channels_last: str | bool  # "auto", True, False
    compile: bool
    fused_optimizer: str | bool  # "auto", True, False

    def global_batch(self, data_ranks: int) -> int:
        """Samples per optimizer step: `data_ranks` ranks along the data axis, each with
        local_batch_size of its own (the one place it is computed)."""
        return data_ranks * self.local_batch_size


@dataclass(frozen=True, kw_only=True)
class EvaluateConfig:
    batch_size: int
    symmetries: int


@dataclass(frozen=True, kw_only=True)
class TrackingServerConfig:
    start: bool
    host: str
    port: int
    backend_store_uri: str | None


@dataclass(frozen=True, kw_only=True)
class TrackingConfig:
    uri: str | None
    experiment: str
    system_metrics: bool
    enabled: bool
    server: TrackingServerConfig

    def __post_init__(self) -> None:
        if self.server.start and self.uri:
            raise ConfigError(
                f"key 'tracking.server.start': true starts a server at "
                f"http://{self.server.host}:{self.server.port}, but tracking.uri is {self.uri!r}; "
                f"set one of them"
            )


@dataclass(frozen=True, kw_only=True)
class TrainResources:
    nodes: int
    gpus_per_rank: int
    cpus_per_rank: int
    mem_mb_per_rank: int
    runtime: int


@dataclass(frozen=True, kw_only=True)
class PreprocessResources:
    universes_per_job: int
    files_per_job: int
    threads: int
    mem_mb: int
    runtime: int


@dataclass(frozen=True, kw_only=True)
class SimulateResources:
    universes_per_job: int
    threads: int
    mem_mb: int
    minutes_per_universe: float


@dataclass(frozen=True, kw_only=True)
class SmallResources:
    threads: int
    mem_mb: int
    runtime: int


@dataclass(frozen=True, kw_only=True)
class CalibrateResources:
    threads: int | None


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """What jobs ask the executor for; read by the rule files (launch.resources through
    cosmocub.workflow_support), not by stages."""

    train: TrainResources
    preprocess: PreprocessResources
    simulate: SimulateResources
    small: SmallResources
    calibrate: CalibrateResources
