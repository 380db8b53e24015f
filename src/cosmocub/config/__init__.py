"""Configuration: YAML → JSON schema (the one source of defaults) → typed dataclasses.

Snakemake validates its config against the same schema file; the CLI calls `load_config`, so a
stage run by hand sees exactly the values a workflow job sees.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

# The regression targets: the universes' four unitPar values.
NUM_TARGETS = 4

SCHEMA_PATH = Path(str(resources.files("cosmocub") / "schemas" / "config.schema.yaml"))


class ConfigError(ValueError):
    """A user's configuration is invalid; the message names the file, key and numbers."""


def _validator_filling_defaults():
    # jsonschema does not fill defaults by itself; extend the properties keyword so that a missing
    # key takes the schema's default before validation descends into it (as Snakemake does).
    base = jsonschema.Draft202012Validator
    validate_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = json.loads(json.dumps(sub["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(base, {"properties": set_defaults})


def load_schema() -> dict[str, Any]:
    with open(SCHEMA_PATH) as f:
        return yaml.safe_load(f)


def resolve(raw: dict[str, Any] | None, *, source: str = "<config>") -> dict[str, Any]:
    """Validate `raw` against the schema and return a copy with every default filled in."""
    values = json.loads(json.dumps(raw or {}))
    validator = _validator_filling_defaults()(load_schema())
    errors = sorted(validator.iter_errors(values), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        while err.context:  # an anyOf: name the option that is wrong, not just its section
            err = max(err.context, key=_relevance)
        key = ".".join(str(p) for p in err.absolute_path) or "<top level>"
        raise ConfigError(f"{source}: key '{key}': {err.message}")
    return values


def _fill_lion_cub_defaults(values: dict[str, Any]) -> None:
    """optimizer.lion_cub defaults to null, so that options given to another optimizer can be
    refused; lion_cub itself then takes the schema's defaults, filled here in place."""
    optimizer = values.get("optimizer", {})
    if optimizer.get("name") == "lion_cub" and optimizer.get("lion_cub") is None:
        optimizer["lion_cub"] = {}
        validator = _validator_filling_defaults()(load_schema())
        assert not list(validator.iter_errors(values)), "schema defaults of lion_cub are valid"


def _relevance(err: jsonschema.ValidationError) -> tuple[int, bool, bool]:
    # Deepest first, then an error other than a type mismatch, then one from a branch other
    # than the first (the first anyOf branch of a nullable section is the null).
    branch = err.relative_schema_path[0] if err.relative_schema_path else 0
    return (len(err.absolute_path), err.validator != "type", branch != 0)


def coerce_cli_strings(values: dict[str, Any]) -> dict[str, Any]:
    """Turn strings into the numbers/booleans/nulls the schema expects, in place; returns values.

    Snakemake parses nested `--config key='{a: 1}'` with YAML's BaseLoader, which leaves every
    scalar a string; the schema says which of them are meant as numbers, booleans or null.
    """
    _coerce(values, load_schema())
    return values


def _coerce(value: Any, schema: dict[str, Any]) -> Any:
    if isinstance(value, dict) and "anyOf" in schema:  # e.g. optimizer.lion_cub: null or options
        schema = next((s for s in schema["anyOf"] if "properties" in s), schema)
    if isinstance(value, dict):
        for key, sub in value.items():
            if key in schema.get("properties", {}):
                value[key] = _coerce(sub, schema["properties"][key])
        return value
    if isinstance(value, list) and "items" in schema:
        return [_coerce(v, schema["items"]) for v in value]
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    if isinstance(value, str) and value in ("null", "~") and "null" in types:
        return None
    if isinstance(value, str) and "string" not in types:
        parsed = yaml.safe_load(value) if value.strip() else None
        if isinstance(parsed, bool | int | float | list) or parsed is None:
            return _coerce(parsed, schema) if isinstance(parsed, list) else parsed
    return value


def config_hash(values: dict[str, Any]) -> str:
    """A short, stable hash of a resolved config (key order does not matter)."""
    blob = json.dumps(values, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` → `{"a.b": 1}`, for MLflow params."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


# ---------------------------------------------------------------------------------------------
# Typed sections. Fields mirror the schema; defaults live in the schema, not here, so every field
# is required when built from a resolved dict. Checks that JSON schema cannot express live in
# __post_init__ and raise ConfigError with the numbers.


@dataclass(frozen=True, kw_only=True)
class UniversesConfig:
    source: str
    count: int
    size: int
    cosmoflow_dir: str | None
    max_files: int | None

    def __post_init__(self) -> None:
        if self.source == "cosmoflow" and not self.cosmoflow_dir:
            raise ConfigError(
                "key 'universes.cosmoflow_dir': required when universes.source is 'cosmoflow'"
            )


@dataclass(frozen=True, kw_only=True)
class SimulateConfig:
    pm_steps: int
    initial_redshift: float
    lpt_order: int
    force_mesh_factor: int

    def __post_init__(self) -> None:
        # Every snapshot (z = 3, 1.5, 0.5, 0: cosmocub.data.simulate.SNAPSHOT_REDSHIFTS,
        # tests/test_simulate.py keeps the two in step) must end a PM step.
        if self.pm_steps == 0:
            return
        if self.initial_redshift <= 3.0:
            raise ConfigError(
                f"key 'simulate.initial_redshift': {self.initial_redshift} must exceed the "
                f"earliest snapshot z = 3.0 when simulate.pm_steps is {self.pm_steps} > 0"
            )
        if self.pm_steps < 4:
            raise ConfigError(
                f"key 'simulate.pm_steps': {self.pm_steps} steps cannot end on the 4 snapshots "
                f"z = 3.0, 1.5, 0.5, 0.0; use 0 (2LPT only) or at least 4"
            )


@dataclass(frozen=True, kw_only=True)
class SplitRatios:
    train: float
    val: float
    test: float

    def __post_init__(self) -> None:
        total = self.train + self.val + self.test
        if total <= 0:
            raise ConfigError(f"key 'preprocess.splits': ratios sum to {total}, must be > 0")

    def as_dict(self) -> dict[str, float]:
        return {"train": self.train, "val": self.val, "test": self.test}


@dataclass(frozen=True, kw_only=True)
class PreprocessConfig:
    sample_size: int
    log1p: bool
    standardize: bool
    dtype: str
    splits: SplitRatios
    slab_depth: int
    dask_scheduler: str | None
    num_workers: int | None

    def __post_init__(self) -> None:
        if self.sample_size % self.slab_depth != 0:
            raise ConfigError(
                f"key 'preprocess.slab_depth': {self.slab_depth} does not divide "
                f"preprocess.sample_size {self.sample_size}"
            )


@dataclass(frozen=True, kw_only=True)
class UNetShape:
    """Levels and convs per level of the 3D U-Net (model.unet)."""

    depth: int
    convs_per_level: int


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    input_size: int
    in_channels: int
    base_filters: int
    num_conv_blocks: int
    kernel_size: int
    dense_sizes: tuple[int, ...]
    num_outputs: int
    dropout: float
    batch_norm: bool
    leaky_relu_slope: float
    output_scale: float
    # Given defaults here only so that code building a config by hand need not name them (the
    # schema's defaults are the same).
    head: str = "point"  # "point": one value per parameter; "gaussian": a mean and a log-variance
    nll_beta: float = 0.5  # β of the gaussian head's β-NLL loss (0: plain Gaussian NLL)
    name: str = "cosmoflow"
    unet: UNetShape | None = None

    @property
    def gaussian(self) -> bool:
        return self.head == "gaussian"

    def __post_init__(self) -> None:
        if self.head not in ("point", "gaussian"):
            raise ConfigError(f"key 'model.head': {self.head!r} is not 'point' or 'gaussian'")
        if isinstance(self.unet, dict):  # built from a resolved dict
            object.__setattr__(self, "unet", UNetShape(**self.unet))
        if self.name == "unet":
            self._check_unet()
            return
        if self.input_size % (2**self.num_conv_blocks) != 0:
            raise ConfigError(
                f"key 'model.input_size': {self.input_size} is not divisible by "
                f"2**num_conv_blocks = {2**self.num_conv_blocks} (each block halves the size)"
            )
        if self.kernel_size % 2 != 1:
            raise ConfigError(f"key 'model.kernel_size': {self.kernel_size} must be odd")
        if self.num_outputs != NUM_TARGETS:
            raise ConfigError(
                f"key 'model.num_outputs': {self.num_outputs}, but the targets are the "
                f"{NUM_TARGETS} unitPar values (Omega_m, sigma_8, N_spec, H_0)"
            )

    def _check_unet(self) -> None:
        if self.unet is None:
            raise ConfigError("key 'model.unet': required when model.name is 'unet'")
        levels = 2 ** (self.unet.depth - 1)
        if self.input_size % levels:
            raise ConfigError(
                f"key 'model.input_size': {self.input_size} is not divisible by "
                f"2**(model.unet.depth - 1) = {levels} (each level below the first halves it)"
            )
        if self.kernel_size % 2 != 1:
            raise ConfigError(f"key 'model.kernel_size': {self.kernel_size} must be odd")


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """Which redshift channels the U-Net reads and which it predicts."""

    input_redshifts: tuple[float, ...]
    target_redshift: float

    def channel_indices(self) -> tuple[list[int], int]:
        """(input channels, target channel) in the shards' channel order (data.universe)."""
        from cosmocub.cosmology.parameters import REDSHIFTS

        return [REDSHIFTS.index(z) for z in self.input_redshifts], REDSHIFTS.index(
            self.target_redshift
        )


@dataclass(frozen=True, kw_only=True)
class MomentumSyncConfig:
    schedule: str
    every_steps: int
    k: float
    patterns: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class LionCubConfig:
    quantizer: str
    bits: int | None
    collective: str
    overlap: bool
    bucket_mb: float
    momentum_sync: MomentumSyncConfig

    def __post_init__(self) -> None:
        if isinstance(self.momentum_sync, dict):  # built from a resolved dict
            sync = dict(self.momentum_sync, patterns=tuple(self.momentum_sync["patterns"]))
            object.__setattr__(self, "momentum_sync", MomentumSyncConfig(**sync))
        if self.quantizer == "sign" and self.bits not in (None, 1):
            raise ConfigError(
                f"key 'optimizer.lion_cub.bits': quantizer 'sign' sends 1 bit, got bits={self.bits}"
            )
        if self.quantizer != "sign" and self.bits == 1:
            raise ConfigError(
                f"key 'optimizer.lion_cub.bits': quantizer {self.quantizer!r} needs >= 2 bits "
                "(1 bit leaves no level besides the sign: use quantizer 'sign')"
            )

    @property
    def resolved_bits(self) -> int:
        return 1 if self.quantizer == "sign" else (self.bits or 8)


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """How one sample is split across ranks; the data axis is whatever the world size leaves."""

    spatial: int
    split: tuple[int, int, int] | None
    periodic: bool

    def __post_init__(self) -> None:
        if self.split is not None and math.prod(self.split) != self.spatial:
            raise ConfigError(
                f"key 'parallel.split': {list(self.split)} multiplies to "
                f"{math.prod(self.split)}, not parallel.spatial {self.spatial}"
            )

    @property
    def split_dhw(self) -> tuple[int, int, int]:
        """Ranks along (D, H, W); the default splits depth only (the shards' chunk axis)."""
        return self.split if self.split is not None else (self.spatial, 1, 1)


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
class StepTimePoint:
    name: str
    nproc_per_node: int
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
            if p.nproc_per_node % p.spatial:
                raise ConfigError(
                    f"key 'step_time_study.points': point {p.name!r} has spatial {p.spatial}, "
                    f"which does not divide its nproc_per_node {p.nproc_per_node}"
                )


@dataclass(frozen=True, kw_only=True)
class NetworkStudyConfig:
    nodes: int
    nproc_per_node: int
    bandwidths_mbit: tuple[float, ...]
    epochs: int
    max_steps_per_epoch: int
    local_batch_size: int
    target_smoothing: int
    model: dict[str, Any]
    lr: float | None
    reference: str
    variants: dict[str, dict[str, Any]]

    def __post_init__(self) -> None:
        if self.reference not in self.variants:
            raise ConfigError(
                f"key 'network_study.reference': {self.reference!r} is not one of the variants "
                f"{sorted(self.variants)}"
            )
        if len(set(self.bandwidths_mbit)) != len(self.bandwidths_mbit):
            raise ConfigError(
                f"key 'network_study.bandwidths_mbit': {list(self.bandwidths_mbit)} repeats a rate"
            )


@dataclass(frozen=True, kw_only=True)
class ScalingStudyConfig:
    bandwidth_mbit: float
    nproc_per_node: int
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
            if (data * spatial) % self.nproc_per_node:
                raise ConfigError(
                    f"key 'scaling_study.meshes': mesh {data}x{spatial} has {data * spatial} "
                    f"ranks, not a multiple of nproc_per_node {self.nproc_per_node}"
                )
            if "strong" in self.modes and self.global_batch_size % data:
                raise ConfigError(
                    f"key 'scaling_study.global_batch_size': {self.global_batch_size} does not "
                    f"divide over mesh {data}x{spatial}'s {data} data ranks"
                )


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    ranks: int
    sizes_bytes: tuple[int, ...]
    repeats: int


@dataclass(frozen=True, kw_only=True)
class AcceleratorConfig:
    peak_tflops: float
    efficiency: float
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


@dataclass(frozen=True, kw_only=True)
class PerfModelConfig:
    bench: BenchConfig
    cores: int | None
    calibrate_on: str | None
    extrapolate: ExtrapolateConfig


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    name: str
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
        if isinstance(self.lion_cub, dict):  # built from a resolved dict
            object.__setattr__(self, "lion_cub", LionCubConfig(**self.lion_cub))
        if self.lion_cub is not None and self.name != "lion_cub":
            raise ConfigError(
                f"key 'optimizer.lion_cub': options given for optimizer.name {self.name!r} "
                "(only lion_cub takes them)"
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
        lions = ("lion", "distributed_lion", "lion_cub")
        return (0.9, 0.99) if self.name in lions else (0.9, 0.999)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    run_name: str
    epochs: int
    local_batch_size: int
    nproc_per_node: int
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
    threads: int
    mem_mb: int
    runtime: int


@dataclass(frozen=True, kw_only=True)
class SmallResources:
    threads: int
    mem_mb: int
    runtime: int


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """What jobs ask the executor for; read by the rule files (launch.resources), not by stages."""

    train: TrainResources
    preprocess: PreprocessResources
    small: SmallResources


@dataclass(frozen=True, kw_only=True)
class Config:
    results: Path
    seed: int
    universes: UniversesConfig
    simulate: SimulateConfig
    preprocess: PreprocessConfig
    model: ModelConfig
    parallel: ParallelConfig
    task: TaskConfig
    sample_size_study: SampleSizeStudyConfig
    optimizer: OptimizerConfig
    train: TrainConfig
    evaluate: EvaluateConfig
    tracking: TrackingConfig
    cluster: ClusterConfig
    step_time_study: StepTimeStudyConfig
    network_study: NetworkStudyConfig
    scaling_study: ScalingStudyConfig
    perf_model: PerfModelConfig
    # The resolved dict this was built from: for hashing, MLflow params and artifacts.
    values: dict[str, Any] = field(repr=False, compare=False)
    source: str = "<config>"

    @property
    def hash(self) -> str:
        return config_hash(self.values)

    def __post_init__(self) -> None:
        inputs = len(self.task.input_redshifts)
        if self.model.name == "unet" and self.model.in_channels != inputs:
            raise ConfigError(
                f"{self.source}: key 'model.in_channels': {self.model.in_channels}, but the U-Net "
                f"reads {inputs} channels (task.input_redshifts {list(self.task.input_redshifts)})"
            )
        if self.model.input_size != self.preprocess.sample_size:
            raise ConfigError(
                f"{self.source}: key 'model.input_size': {self.model.input_size} differs from "
                f"preprocess.sample_size {self.preprocess.sample_size}"
            )
        for axis, ranks in zip("DHW", self.parallel.split_dhw, strict=True):
            if self.model.input_size % ranks:
                raise ConfigError(
                    f"{self.source}: key 'parallel.split': {ranks} ranks along {axis} do not "
                    f"divide model.input_size {self.model.input_size}"
                )
        sample, universe = self.preprocess.sample_size, self.universes.size
        # Public universes are checked against the files themselves at preprocessing time.
        if self.universes.source == "synthetic" and (sample > universe or universe % sample):
            raise ConfigError(
                f"{self.source}: key 'preprocess.sample_size': {sample} does not divide "
                f"universes.size {universe}"
            )


def _tuple_fields(cls, section: dict[str, Any]) -> dict[str, Any]:
    out = dict(section)
    for f in dataclasses.fields(cls):
        if f.name in out and isinstance(out[f.name], list):
            out[f.name] = tuple(out[f.name])
    return out


def from_values(values: dict[str, Any], *, source: str = "<config>") -> Config:
    """Build the typed config from a resolved dict (see `resolve`)."""
    _fill_lion_cub_defaults(values)
    try:
        pre = dict(values["preprocess"])
        pre["splits"] = SplitRatios(**pre["splits"])
        return Config(
            results=Path(values["results"]),
            seed=values["seed"],
            universes=UniversesConfig(**values["universes"]),
            simulate=SimulateConfig(**values["simulate"]),
            preprocess=PreprocessConfig(**pre),
            model=ModelConfig(**_tuple_fields(ModelConfig, values["model"])),
            parallel=ParallelConfig(**_tuple_fields(ParallelConfig, values["parallel"])),
            task=TaskConfig(**_tuple_fields(TaskConfig, values["task"])),
            sample_size_study=SampleSizeStudyConfig(
                **_tuple_fields(SampleSizeStudyConfig, values["sample_size_study"])
            ),
            optimizer=OptimizerConfig(**_tuple_fields(OptimizerConfig, values["optimizer"])),
            train=TrainConfig(**values["train"]),
            evaluate=EvaluateConfig(**values["evaluate"]),
            tracking=TrackingConfig(
                **{
                    **values["tracking"],
                    "server": TrackingServerConfig(**values["tracking"]["server"]),
                }
            ),
            cluster=ClusterConfig(
                train=TrainResources(**values["cluster"]["train"]),
                preprocess=PreprocessResources(**values["cluster"]["preprocess"]),
                small=SmallResources(**values["cluster"]["small"]),
            ),
            step_time_study=StepTimeStudyConfig(
                epochs=values["step_time_study"]["epochs"],
                points=tuple(values["step_time_study"]["points"]),
            ),
            network_study=NetworkStudyConfig(
                **_tuple_fields(NetworkStudyConfig, values["network_study"])
            ),
            scaling_study=ScalingStudyConfig(
                **_tuple_fields(ScalingStudyConfig, values["scaling_study"])
            ),
            perf_model=_perf_model(values["perf_model"]),
            values=values,
            source=source,
        )
    except ConfigError as err:
        msg = str(err)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None


def _perf_model(section: dict[str, Any]) -> PerfModelConfig:
    bench = BenchConfig(**_tuple_fields(BenchConfig, section["bench"]))
    extrapolate = ExtrapolateConfig(**_tuple_fields(ExtrapolateConfig, section["extrapolate"]))
    return PerfModelConfig(
        bench=bench,
        cores=section["cores"],
        calibrate_on=section["calibrate_on"],
        extrapolate=extrapolate,
    )


def load_config(path: str | os.PathLike | None, overrides: dict[str, Any] | None = None) -> Config:
    """Read a YAML file (or nothing: all defaults), validate, fill defaults, and type it."""
    raw: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        try:
            with open(path) as f:
                raw = yaml.safe_load(f) or {}
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}".replace("\n", " ")) from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: top level must be a mapping, got {type(raw).__name__}")
    if overrides:
        raw = deep_merge(raw, overrides)
    return from_values(resolve(raw, source=source), source=source)


def deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `update` merged in, section by section (nested mappings merge, anything else
    replaces); neither argument is changed."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def write_config(values: dict[str, Any], path: str | os.PathLike) -> None:
    """Write a resolved config atomically (temporary name, then rename)."""
    from cosmocub.io import atomic_path

    with atomic_path(path) as tmp, open(tmp, "w") as f:
        yaml.safe_dump(values, f, sort_keys=False)
