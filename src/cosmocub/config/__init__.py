"""Configuration: YAML → JSON schema (the one source of defaults) → typed dataclasses.

Snakemake validates its config against the same schema file; the CLI calls `load_config`, so a
stage run by hand sees exactly the values a workflow job sees. This module is the package's
public face: schema machinery (schema), the run's sections (sections, training), the studies'
and perf model's (studies), and the whole config with its loading and deriving (load).
"""

from cosmocub.config.load import (
    Config,
    derive,
    from_values,
    load_config,
    optimizer_variant,
    write_config,
)
from cosmocub.config.schema import (
    SCHEMA_PATH,
    ConfigError,
    coerce_cli_strings,
    config_hash,
    deep_merge,
    flatten,
    load_schema,
    resolve,
)
from cosmocub.config.sections import (
    NUM_TARGETS,
    ModelConfig,
    ParallelConfig,
    PreprocessConfig,
    SimulateConfig,
    SplitRatios,
    TaskConfig,
    UNetRunConfig,
    UNetShape,
    UniversesConfig,
)
from cosmocub.config.studies import (
    AcceleratorConfig,
    BenchConfig,
    ExtrapolateConfig,
    NetworkStudyConfig,
    PerfModelConfig,
    SampleSizeStudyConfig,
    ScalingStudyConfig,
    StepTimePoint,
    StepTimeStudyConfig,
)
from cosmocub.config.training import (
    ClusterConfig,
    EvaluateConfig,
    LionCubConfig,
    MomentumSyncConfig,
    OptimizerConfig,
    PreprocessResources,
    SmallResources,
    TrackingConfig,
    TrackingServerConfig,
    TrainConfig,
    TrainResources,
)

__all__ = [
    "NUM_TARGETS",
    "SCHEMA_PATH",
    "AcceleratorConfig",
    "BenchConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "EvaluateConfig",
    "ExtrapolateConfig",
    "LionCubConfig",
    "ModelConfig",
    "MomentumSyncConfig",
    "NetworkStudyConfig",
    "OptimizerConfig",
    "ParallelConfig",
    "PerfModelConfig",
    "PreprocessConfig",
    "PreprocessResources",
    "SampleSizeStudyConfig",
    "ScalingStudyConfig",
    "SimulateConfig",
    "SmallResources",
    "SplitRatios",
    "StepTimePoint",
    "StepTimeStudyConfig",
    "TaskConfig",
    "TrackingConfig",
    "TrackingServerConfig",
    "TrainConfig",
    "TrainResources",
    "UNetRunConfig",
    "UNetShape",
    "UniversesConfig",
    "coerce_cli_strings",
    "config_hash",
    "deep_merge",
    "derive",
    "flatten",
    "from_values",
    "load_config",
    "load_schema",
    "optimizer_variant",
    "resolve",
    "write_config",
]
