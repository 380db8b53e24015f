"""Typed sections of the run's data and model: universes, simulate, preprocess, model, task and
parallel. Fields mirror the schema; checks it cannot express raise ConfigError with the numbers.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from cosmocub.config.schema import ConfigError

# The regression targets: the universes' four unitPar values.
NUM_TARGETS = 4
# preprocess.train_crops: the training split's non-overlapping crops, or whole universes that
# training crops at random (data/universe_crops.py).
TRAIN_CROPS: tuple[str, ...] = ("fixed", "random")

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
    mlperf_dir: str | None

    @property
    def made_here(self) -> bool:
        """Universes the simulate jobs make (synthetic or known_answer), not linked ones."""
        return self.source in ("synthetic", "known_answer")

    def __post_init__(self) -> None:
        for source, key in (("cosmoflow", "cosmoflow_dir"), ("mlperf", "mlperf_dir")):
            if self.source == source and not getattr(self, key):
                raise ConfigError(
                    f"key 'universes.{key}': required when universes.source is '{source}'"
                )


@dataclass(frozen=True, kw_only=True)
class SimulateConfig:
    pm_steps: int
    initial_redshift: float
    lpt_order: int
    force_mesh_factor: int
    # "finite_difference" (the 4-point stencil on the mesh, one inverse FFT a step) or
    # "spectral" (i·k in Fourier space, three): config.schema.yaml says what each costs.
    force_gradient: str = "finite_difference"

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
    # A default here only so that code building the settings by hand need not name it (the
    # schema's default is the same): "fixed" crops for training, or whole universes ("random").
    train_crops: str = "fixed"
    # The bispectrum statistics in features.h5 (the schema's default, off, as above).
    bispectrum: bool = False
    # Dask workers as Slurm jobs that the preprocessing command starts and cancels
    # (data/dask_slurm.py); the schema's defaults, as above.
    dask_slurm_workers: int | None = None
    dask_slurm_wait_s: float = 600.0

    def __post_init__(self) -> None:
        if self.dask_slurm_workers is not None and self.dask_scheduler is not None:
            raise ConfigError(
                f"keys 'preprocess.dask_slurm_workers' ({self.dask_slurm_workers}) and "
                f"'preprocess.dask_scheduler' ({self.dask_scheduler!r}) are both set: workers "
                f"started on Slurm, or a cluster you run; set one to null"
            )
        if self.train_crops not in TRAIN_CROPS:
            raise ConfigError(
                f"key 'preprocess.train_crops': {self.train_crops!r} is not one of "
                f"{', '.join(TRAIN_CROPS)}"
            )
        if self.sample_size % self.slab_depth != 0:
            raise ConfigError(
                f"key 'preprocess.slab_depth': {self.slab_depth} does not divide "
                f"preprocess.sample_size {self.sample_size}"
            )

    def with_granted_threads(self, threads: int | None) -> PreprocessConfig:
        """These settings with Dask's threads set to what the executor granted (if the config
        leaves num_workers to the machine); the config itself, and so its hash, stays as it is."""
        if threads is None or self.num_workers is not None:
            return self
        return dataclasses.replace(self, num_workers=threads)


@dataclass(frozen=True, kw_only=True)
class UNetShape:
    """Levels and convs per level of the 3D U-Net (model.unet)."""

    depth: int
    convs_per_level: int


POOLED_STATS = ("none", "mean", "mean_std", "moments")
POOLED_NORMS = ("batch", "whiten")
# Moments past the 8th are dominated by a box's few extreme voxels; the 3rd is the least that is
# a shape.
MIN_MOMENT_ORDER, MAX_MOMENT_ORDER = 3, 8
# "input" the input; "convs" every block's convolution output, before its norm, activation and
# max-pool (a learned filter of the map below, whose skewness is a weighted bispectrum);
# "blocks" every block's output. The default leaves "convs" out: the branch as first built.
POOLED_TAP_NAMES = ("input", "convs", "blocks")
POOLED_TAPS = ("input", "blocks")
POOLED_JOINS = ("head_input", "last_hidden")
# Log-spaced |k| bins of the input's power spectrum (model.pooled.spectrum_bins); more than the
# modes of a small cube can fill leaves bins empty.
MAX_SPECTRUM_BINS = 32


@dataclass(frozen=True, kw_only=True)
class PooledConfig:
    """CosmoFlow's pooled branch (model.pooled): which whole-sample statistics of which feature
    maps the dense head reads, and where they join it."""

    stats: str = "none"
    taps: tuple[str, ...] = POOLED_TAPS
    join: str = "head_input"
    # "batch": BatchNorm1d when model.batch_norm is on; "whiten": the input tap's statistics
    # decorrelated channel by channel (models.statistics_branch.GroupWhitening), the blocks' as
    # "batch".
    norm: str = "batch"
    # With stats "moments": the standardised central moments from the third up to this order.
    order: int = 4
    # > 0: the input tap also takes each channel's log power spectrum in this many log-spaced
    # |k| bins (models.statistics_branch.LogPowerSpectrum); 0: none, the branch as first built.
    spectrum_bins: int = 0
    # True (with spectrum_bins): the input tap also takes each channel's log P(k) of the count
    # overdensity n/n̄ − 1 (the classical `pk` feature), the counts recovered from the input
    # with the shards' standardisation, which the model holds
    # (models.statistics_branch.CountsSpectrum).
    counts_spectrum: bool = False
    # False: the dense head reads the pooled statistics alone, not the flattened last feature
    # map (a head that does not see where in the box a feature is).
    flatten: bool = True
    # True: the means start from a ridge regression on the input tap's statistics, fitted on
    # the training universes before the first step and then held fixed (train/ridge_start.py);
    # the rest of the network learns what the ridge leaves.
    tap_ridge: bool = False

    def identity(self) -> dict[str, object]:
        """What of the branch a run's identity holds: the keys that were there before `norm` and
        `order`, and those two only where they change the model (whiten; stats moments), so
        that checkpoints from before them still resume."""
        values: dict[str, object] = {
            "stats": self.stats,
            "taps": list(self.taps),
            "join": self.join,
        }
        if self.norm != "batch":
            values["norm"] = self.norm
        if self.stats == "moments":
            values["order"] = self.order
        if self.spectrum_bins:
            values["spectrum_bins"] = self.spectrum_bins
        if self.counts_spectrum:
            values["counts_spectrum"] = True
        if not self.flatten:
            values["flatten"] = False
        if self.tap_ridge:
            values["tap_ridge"] = True
        return values

    @property
    def per_channel(self) -> int:
        """Statistics a channel gives: 1 (mean), 2 (and the deviation), or `order` (moments)."""
        return {"mean": 1, "mean_std": 2}.get(self.stats, self.order)

    @property
    def enabled(self) -> bool:
        return self.stats != "none"

    def __post_init__(self) -> None:
        object.__setattr__(self, "taps", tuple(self.taps))
        for key, value, allowed in (
            ("stats", self.stats, POOLED_STATS),
            ("join", self.join, POOLED_JOINS),
            ("norm", self.norm, POOLED_NORMS),
        ):
            if value not in allowed:
                raise ConfigError(f"key 'model.pooled.{key}': {value!r} is not one of {allowed}")
        if not MIN_MOMENT_ORDER <= self.order <= MAX_MOMENT_ORDER:
            raise ConfigError(
                f"key 'model.pooled.order': {self.order} is outside "
                f"[{MIN_MOMENT_ORDER}, {MAX_MOMENT_ORDER}]"
            )
        if self.norm == "whiten" and "input" not in self.taps:
            raise ConfigError(
                f"key 'model.pooled.norm': 'whiten' whitens the input tap's statistics, and "
                f"model.pooled.taps {list(self.taps)} has no 'input'"
            )
        if not 0 <= self.spectrum_bins <= MAX_SPECTRUM_BINS:
            raise ConfigError(
                f"key 'model.pooled.spectrum_bins': {self.spectrum_bins} is outside "
                f"[0, {MAX_SPECTRUM_BINS}]"
            )
        if self.spectrum_bins and "input" not in self.taps:
            raise ConfigError(
                f"key 'model.pooled.spectrum_bins': {self.spectrum_bins} is the input tap's "
                f"spectrum, and model.pooled.taps {list(self.taps)} has no 'input'"
            )
        if self.counts_spectrum and not self.spectrum_bins:
            raise ConfigError(
                "key 'model.pooled.counts_spectrum': true takes the counts' P(k) in the bins of "
                "the input tap's spectrum, and model.pooled.spectrum_bins is 0"
            )
        if self.tap_ridge and (not self.enabled or "input" not in self.taps):
            raise ConfigError(
                f"key 'model.pooled.tap_ridge': true fits a ridge on the input tap's statistics, "
                f"and the branch has none (stats {self.stats!r}, taps {list(self.taps)})"
            )
        if (
            not self.flatten
            and self.enabled
            and (self.join != "head_input" or "blocks" not in self.taps)
        ):
            raise ConfigError(
                f"key 'model.pooled.flatten': false leaves the head the pooled statistics alone, "
                f"which needs join 'head_input' (got {self.join!r}) and the 'blocks' tap (taps "
                f"{list(self.taps)}), or the last block's output would reach nothing"
            )
        unknown = [t for t in self.taps if t not in POOLED_TAP_NAMES]
        if unknown or not self.taps or len(set(self.taps)) != len(self.taps):
            raise ConfigError(
                f"key 'model.pooled.taps': {list(self.taps)} must be distinct names out of "
                f"{list(POOLED_TAP_NAMES)}, at least one"
            )


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
    pooled: PooledConfig = PooledConfig()  # off: the plain CosmoFlow

    @property
    def gaussian(self) -> bool:
        return self.head == "gaussian"

    def __post_init__(self) -> None:
        if self.head not in ("point", "gaussian"):
            raise ConfigError(f"key 'model.head': {self.head!r} is not 'point' or 'gaussian'")
        if isinstance(self.unet, dict):  # built from a resolved dict
            object.__setattr__(self, "unet", UNetShape(**self.unet))
        if isinstance(self.pooled, dict):
            object.__setattr__(self, "pooled", PooledConfig(**self.pooled))
        if self.name == "unet":
            if self.pooled.enabled:
                raise ConfigError(
                    f"key 'model.pooled.stats': {self.pooled.stats!r} is a CosmoFlow branch; "
                    "the U-Net (model.name unet) takes none"
                )
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
class ParallelConfig:
    """How one sample is split across ranks; the data axis is whatever the world size leaves."""

    spatial: int
    split: tuple[int, int, int] | None
    periodic: bool
    # The node size Lion Cub's hierarchy and the intra/inter-node byte split assume; None: the
    # launcher's local world size (train.ranks_per_node).
    assumed_ranks_per_node: int | None

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
class UNetRunConfig:
    """The `unet` section: what the `snakemake unet` run merges over the config's model,
    parallel, optimizer and train sections (partial sections; the merged config is validated)."""

    model: dict[str, Any]
    parallel: dict[str, Any]
    optimizer: dict[str, Any]
    train: dict[str, Any]
