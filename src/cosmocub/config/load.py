"""The whole typed config and how it is made: load a YAML file, derive a config from another
with overrides, build the dataclasses from resolved values, write resolved values back.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cosmocub.config.held import covers, guard, held_keys, held_values
from cosmocub.config.model_split import check_model_split
from cosmocub.config.schema import (
    ConfigError,
    config_hash,
    deep_merge,
    fill_lion_cub_defaults,
    flatten,
    resolve,
)
from cosmocub.config.sections import (
    ModelConfig,
    ParallelConfig,
    PreprocessConfig,
    SimulateConfig,
    SplitRatios,
    TaskConfig,
    UNetRunConfig,
    UniversesConfig,
)
from cosmocub.config.study_configs import (
    BenchConfig,
    CalibrationConfig,
    ExtrapolateConfig,
    KnownAnswerStudyConfig,
    NetworkStudyConfig,
    PerfModelConfig,
    SampleSizeStudyConfig,
    ScalingStudyConfig,
    StepTimeStudyConfig,
    StudiesConfig,
    UniversesStudyConfig,
)
from cosmocub.config.training import (
    CalibrateResources,
    ClusterConfig,
    EvaluateConfig,
    OptimizerConfig,
    PreprocessResources,
    SimulateResources,
    SmallResources,
    TrackingConfig,
    TrackingServerConfig,
    TrainConfig,
    TrainResources,
)


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
    universes_study: UniversesStudyConfig
    known_answer_study: KnownAnswerStudyConfig
    optimizer: OptimizerConfig
    train: TrainConfig
    evaluate: EvaluateConfig
    tracking: TrackingConfig
    cluster: ClusterConfig
    step_time_study: StepTimeStudyConfig
    network_study: NetworkStudyConfig
    scaling_study: ScalingStudyConfig
    studies: StudiesConfig
    perf_model: PerfModelConfig
    unet: UNetRunConfig
    # The resolved dict this was built from: for hashing, MLflow params and artifacts. A job's
    # config (config.held) holds only its rule's sections: these alone.
    values: dict[str, Any] = field(repr=False, compare=False)
    source: str = "<config>"
    # The keys a stage may read (config.held.held_keys); None: the whole config.
    held: frozenset[str] | None = field(default=None, repr=False, compare=False)

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if name in _SECTIONS:
            held = object.__getattribute__(self, "held")
            if held is not None:
                return guard(value, name, held, object.__getattribute__(self, "source"))
        return value

    def _has(self, *sections: str) -> bool:
        """Whether the sections are in the file (a job's config checks only what it holds;
        the workflow checked the whole config when it wrote the file)."""
        return all(s in self.values for s in sections)

    @property
    def hash(self) -> str:
        return config_hash(self.values)

    @property
    def training_seed(self) -> int:
        """The seed of the training's weights, data order and draws: train.seed, else seed."""
        return self.seed if self.train.seed is None else self.train.seed

    @property
    def world_size(self) -> int:
        """Ranks of the training run: cluster.train.nodes × train.ranks_per_node."""
        return self.cluster.train.nodes * self.train.ranks_per_node

    @property
    def data_ranks(self) -> int:
        """Ranks along the data axis, each with its own samples: world_size ÷ parallel.spatial
        (a ConfigError with the numbers where it does not divide)."""
        world, spatial = self.world_size, self.parallel.spatial
        if world % spatial:
            raise ConfigError(
                f"{self.source}: key 'train.ranks_per_node': {world} ranks "
                f"(cluster.train.nodes {self.cluster.train.nodes} × train.ranks_per_node "
                f"{self.train.ranks_per_node}) do not divide into groups of parallel.spatial "
                f"{spatial}"
            )
        return world // spatial

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step of the config's world (TrainConfig.global_batch)."""
        return self.train.global_batch(self.data_ranks)

    def __post_init__(self) -> None:
        # Checks across sections, on those in the file (a job's holds only its rule's; the
        # workflow checked the whole config when it wrote them), read past the guard.
        has, raw = self._has, functools.partial(object.__getattribute__, self)
        model, source = raw("model"), self.source
        redshifts = list(raw("task").input_redshifts)
        if has("model", "task") and model.name == "unet" and model.in_channels != len(redshifts):
            raise ConfigError(
                f"{source}: key 'model.in_channels': {model.in_channels}, but the U-Net "
                f"reads {len(redshifts)} channels (task.input_redshifts {redshifts})"
            )
        sample = raw("preprocess").sample_size
        if has("model", "preprocess") and model.input_size != sample:
            raise ConfigError(
                f"{source}: key 'model.input_size': {model.input_size} differs from "
                f"preprocess.sample_size {sample}"
            )
        # A split the model cannot run (at some level an extent that does not divide, a block
        # thinner than the halo or odd before a pooling) fails here, not at the first step of a
        # training that simulate and preprocess ran for.
        parallel = raw("parallel")
        try:
            if has("model", "parallel"):
                check_model_split(model, model.input_size, parallel.split_dhw)
        except ValueError as err:
            key = "parallel.spatial" if parallel.split is None else "parallel.split"
            raise ConfigError(
                f"{source}: key '{key}': model.name {model.name} cannot run on this split: {err}"
            ) from None
        universes = raw("universes")
        # Public universes are checked against the files themselves at preprocessing time.
        fits = sample <= universes.size and universes.size % sample == 0
        if has("universes", "preprocess") and universes.made_here and not fits:
            raise ConfigError(
                f"{source}: key 'preprocess.sample_size': {sample} does not divide "
                f"universes.size {universes.size}"
            )


# The sections a job's config guards (Config.__getattribute__).
_SECTIONS = frozenset(f.name for f in dataclasses.fields(Config)) - {"values", "source", "held"}


def _tuple_fields(cls, section: dict[str, Any]) -> dict[str, Any]:
    out = dict(section)
    for f in dataclasses.fields(cls):
        if f.name in out and isinstance(out[f.name], list):
            out[f.name] = tuple(out[f.name])
    return out


def from_values(values: dict[str, Any], *, source: str = "<config>") -> Config:
    """Build the typed config from a resolved dict (see `resolve`). A job's config (a `held`
    key) keeps only the sections it holds in `values`; the rest, the schema's defaults, only
    let the dataclasses be built: the guard refuses every read of them."""
    fill_lion_cub_defaults(values)
    held = held_keys(values)
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
            universes_study=UniversesStudyConfig(
                **_tuple_fields(UniversesStudyConfig, values["universes_study"])
            ),
            known_answer_study=KnownAnswerStudyConfig(
                **_tuple_fields(KnownAnswerStudyConfig, values["known_answer_study"])
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
                simulate=SimulateResources(**values["cluster"]["simulate"]),
                small=SmallResources(**values["cluster"]["small"]),
                calibrate=CalibrateResources(**values["cluster"]["calibrate"]),
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
            studies=StudiesConfig(**values["studies"]),
            perf_model=_perf_model(values["perf_model"]),
            unet=UNetRunConfig(**values["unet"]),
            values=values if held is None else held_values(values, values["held"]),
            source=source,
            held=held,
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
        fit_set=tuple(section["fit_set"]),
        calibration=CalibrationConfig(**_tuple_fields(CalibrationConfig, section["calibration"])),
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


def derive(
    cfg: Config,
    overrides: Mapping[str, Any],
    *,
    source: str,
    replace: Mapping[str, Any] | None = None,
) -> Config:
    """A config made from `cfg`: `replace`'s sections instead of cfg's (given whole, e.g. a
    variant's optimizer section), then `overrides` merged in (`deep_merge`), validated against
    the schema, defaults filled, and typed; errors name `source`. From a job's config (config.held)
    it holds what that one holds and the keys `replace` and `overrides` give."""
    values = {**copy.deepcopy(cfg.values), **copy.deepcopy(dict(replace or {}))}
    if "held" in values:
        given = [*(replace or {}), *flatten(dict(overrides))]
        values["held"] += [key for key in given if not covers(values["held"], key)]
    values = resolve(deep_merge(values, overrides), source=source)
    return from_values(values, source=source)


def optimizer_variant(base: Mapping[str, Any], variant: Mapping[str, Any]) -> dict[str, Any]:
    """The optimizer section of a variant: `variant`'s keys over `base`'s, without the base's
    options for its own optimizer (optimizer.lion_cub), which belong to another optimizer; the
    schema fills the variant's. `base` {} takes everything the variant leaves from the schema."""
    section = {**base, **copy.deepcopy(dict(variant))}
    if "lion_cub" in base and "lion_cub" not in variant:
        section["lion_cub"] = None
    return section


def write_config(values: dict[str, Any], path: str | os.PathLike) -> None:
    """Write a resolved config atomically (temporary name, then rename)."""
    from cosmocub.io import atomic_path

    with atomic_path(path) as tmp, open(tmp, "w") as f:
        yaml.safe_dump(values, f, sort_keys=False)
