"""Torch datasets over the HDF5 shards of docs/reference/formats.md: standardised (C, S, S, S)
samples.

HDF5 files are opened lazily in the process that reads (fork-safe for DataLoader workers). Under a
spatial split a dataset reads only its rank's `block` of each sample (spatially parallel I/O), and
an index (i, symmetry) yields that block of sample i under that cube symmetry (data/augment.py).
A shard of whole universes (preprocess.train_crops random) gives crops at any periodic origin.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from cosmocub.config import ModelConfig
from cosmocub.data.augment import cube_symmetry, source_region
from cosmocub.data.periodic import read_periodic
from cosmocub.data.shard_file import first_universe_rows

SPLITS = ("train", "val", "test")


def shard_path(shards_dir: str | os.PathLike, split: str) -> Path:
    """`<shards_dir>/<split>.h5`, or FileNotFoundError naming what is missing."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: must be one of {', '.join(SPLITS)}")
    path = Path(shards_dir) / f"{split}.h5"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: shard not found (run `cosmocub preprocess` first)")
    return path


def read_stats(shards_dir: str | os.PathLike) -> tuple[list[float], list[float]]:
    """Per-channel (mean, std) from `<shards_dir>/stats.json`."""
    path = Path(shards_dir) / "stats.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: shard statistics not found (run `cosmocub preprocess`)")
    with open(path) as f:
        stats = json.load(f)
    try:
        mean, std = [float(v) for v in stats["mean"]], [float(v) for v in stats["std"]]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: expected lists 'mean' and 'std' of floats ({err})") from None
    if len(mean) != len(std):
        raise ValueError(f"{path}: 'mean' has {len(mean)} channels but 'std' has {len(std)}")
    if any(s <= 0 for s in std):
        raise ValueError(f"{path}: 'std' must be > 0, got {std}")
    return mean, std


def stats_say_standardize(shards_dir: str | os.PathLike) -> bool:
    """preprocess.standardize of the run that wrote the shards (recorded in stats.json), so that
    training and evaluation read the samples the same way whatever config they are given."""
    path = Path(shards_dir) / "stats.json"
    value = json.loads(path.read_text()).get("standardize", True)  # absent: shards before the key
    if not isinstance(value, bool):
        raise ValueError(f"{path}: 'standardize' must be true or false, got {value!r}")
    return value


def read_input_transform(shards_dir: str | os.PathLike) -> tuple[list[float], list[float], bool]:
    """(mean, std, log1p): what a stored value v went through before the network reads
    x = (v − mean)/std (mean 0 and std 1 where the shards are not standardised), and whether v
    is log1p of the counts (the training shard's `log1p` attribute). model.pooled.counts_spectrum
    undoes both."""
    mean, std = read_stats(shards_dir)
    if not stats_say_standardize(shards_dir):
        mean, std = [0.0] * len(mean), [1.0] * len(std)
    path = shard_path(shards_dir, "train")
    with h5py.File(path, "r") as f:
        log1p = f.attrs.get("log1p")
    if not isinstance(log1p, bool | np.bool_):
        raise ValueError(f"{path}: attribute 'log1p' must be true or false, got {log1p!r}")
    return mean, std, bool(log1p)


class ShardDataset(Dataset):
    """Samples of one shard file: (x float32 (C, S, S, S) or its block, y float32 (4,)).

    `mean`/`std` (per channel, from stats.json) standardise x; None leaves it as stored.
    `sample_size`/`in_channels`, when given, are checked against the shard's sample shape.
    `block` (D, H, W slices) or `depth_slab` (d0, d1) restricts every read to that part.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        mean: Sequence[float] | None,
        std: Sequence[float] | None,
        depth_slab: tuple[int, int] | None = None,
        block: tuple[slice, slice, slice] | None = None,
        sample_size: int | None = None,
        in_channels: int | None = None,
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: shard not found")
        with h5py.File(self.path, "r") as f:
            for name in ("x", "y"):
                if name not in f:
                    raise ValueError(
                        f"{self.path}: dataset '{name}' missing (not a cosmocub shard)"
                    )
            self.num_samples, self.channels, self.size = self._layout(f)
        if sample_size is not None and sample_size != self.size:
            raise ValueError(
                f"{self.path}: dataset 'x' holds {self.size}³ samples but model.input_size is "
                f"{sample_size}"
            )
        if in_channels is not None and in_channels != self.channels:
            raise ValueError(
                f"{self.path}: dataset 'x' has {self.channels} channels but model.in_channels is "
                f"{in_channels}"
            )
        if depth_slab is not None:
            d0, d1 = depth_slab
            if not 0 <= d0 < d1 <= self.size:
                raise ValueError(f"{self.path}: depth_slab ({d0}, {d1}) outside [0, {self.size}]")
        if depth_slab is not None and block is not None:
            raise ValueError(f"{self.path}: give depth_slab or block, not both")
        if depth_slab is not None:
            block = (slice(*depth_slab), slice(None), slice(None))
        if block is not None:
            bounds = [b.indices(self.size) for b in block]
            if len(block) != 3 or any(step != 1 or lo >= hi for lo, hi, step in bounds):
                raise ValueError(f"{self.path}: block {block} is not 3 non-empty slices of step 1")
        self.block = block
        self._scale: tuple[np.ndarray, np.ndarray] | None = None
        if (mean is None) != (std is None):
            raise ValueError(f"{self.path}: give both mean and std, or neither")
        if mean is not None and std is not None:
            if len(mean) != self.channels or len(std) != self.channels:
                raise ValueError(
                    f"{self.path}: stats have {len(mean)} means and {len(std)} stds for "
                    f"{self.channels} channels"
                )
            # (C, 1, 1, 1) so they broadcast over one sample's (C, D, H, W).
            m = np.asarray(mean, dtype=np.float32).reshape(-1, 1, 1, 1)
            inv = 1.0 / np.asarray(std, dtype=np.float32).reshape(-1, 1, 1, 1)
            self._scale = (m, inv)
        self._file: h5py.File | None = None
        self._pid: int | None = None

    # The side of the universes a random crop origin is drawn in, per axis (UniverseCropDataset);
    # None: the shard's samples are fixed.
    random_origins: int | None = None

    def _layout(self, f: h5py.File) -> tuple[int, int, int]:
        """(samples, channels, sample side) of the open shard, once its layout is checked."""
        if holds_universes(f):
            raise ValueError(
                f"{self.path}: holds whole universes (preprocess.train_crops random), not "
                f"samples: read it with UniverseCropDataset (open_split does)"
            )
        x_shape, y_shape = f["x"].shape, f["y"].shape
        if len(x_shape) != 5 or x_shape[2] != x_shape[3] or x_shape[3] != x_shape[4]:
            raise ValueError(
                f"{self.path}: dataset 'x' has shape {x_shape}, expected (N, C, S, S, S)"
            )
        if y_shape[0] != x_shape[0]:
            raise ValueError(f"{self.path}: 'x' has {x_shape[0]} samples but 'y' has {y_shape[0]}")
        return x_shape[0], x_shape[1], x_shape[2]

    def __len__(self) -> int:
        return self.num_samples

    def _open(self) -> h5py.File:
        # An HDF5 handle must not cross a fork: reopen in every process that reads.
        if self._file is None or self._pid != os.getpid():
            self._file = h5py.File(self.path, "r")
            self._pid = os.getpid()
        return self._file

    def __getitem__(self, index: int | tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample `index`, or (index, symmetry): that cube symmetry of it (block: its block)."""
        sample, symmetry = (index, 0) if isinstance(index, int) else index
        f = self._open()
        if self.block is None:
            x = f["x"][sample]  # (C, S, S, S)
        else:
            # The stored region whose image under the symmetry is this block: only the depth
            # chunks it spans are read (for the symmetries a split keeps, one rank's share).
            d, h, w = source_region(symmetry, self.block, self.size)
            x = f["x"][sample, :, d, h, w]  # (C, D/sd, H/sh, W/sw) for a split's block
        return self._finish(x, symmetry, f["y"][sample])

    def _finish(
        self, x: np.ndarray, symmetry: int, y: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored region `x` (C, d, h, w) standardised and turned, and its target."""
        x = x.astype(np.float32, copy=False)
        if self._scale is not None:
            mean, inv_std = self._scale
            x = (x - mean) * inv_std
        x_cdhw = torch.from_numpy(np.ascontiguousarray(x))
        if symmetry:
            x_cdhw = cube_symmetry(x_cdhw, symmetry).contiguous()
        return x_cdhw, torch.from_numpy(y.astype(np.float32, copy=False))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_file"], state["_pid"] = None, None
        return state

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class UniverseCropDataset(ShardDataset):
    """Crops of the whole universes of a shard written with preprocess.train_crops random.

    Its rows are the fixed crops that preprocessing would otherwise have cut (y, universe_index,
    crop_origin): one epoch is one crop per row. Index i gives row i's fixed crop, (i, symmetry)
    that crop turned, and (i, symmetry, origin_dhw) the crop of side S at `origin_dhw` of row
    i's universe, wrapped periodically, turned: the sampler draws the origins (train/loaders.py).
    Under a spatial split only this rank's `block` of the turned crop is read.
    """

    def _layout(self, f: h5py.File) -> tuple[int, int, int]:
        if not holds_universes(f):
            raise ValueError(
                f"{self.path}: holds crops, not whole universes (preprocess.train_crops fixed): "
                f"read it with ShardDataset"
            )
        x_shape, rows = f["x"].shape, f["y"].shape[0]
        size, crop = x_shape[2], int(f.attrs["sample_size"])
        if len(x_shape) != 5 or x_shape[2:] != (size,) * 3 or not 0 < crop <= size:
            raise ValueError(
                f"{self.path}: dataset 'x' has shape {x_shape}, expected (U, C, N, N, N) "
                f"universes of side N ≥ the crops' {crop}"
            )
        self._universe_of = f["universe_index"][:]
        self._fixed_origin = f["crop_origin"][:]
        if len(self._universe_of) != rows or len(self._fixed_origin) != rows:
            raise ValueError(
                f"{self.path}: 'y' has {rows} rows but 'universe_index' "
                f"{len(self._universe_of)} and 'crop_origin' {len(self._fixed_origin)}"
            )
        if rows and not 0 <= self._universe_of.min() <= self._universe_of.max() < x_shape[0]:
            raise ValueError(f"{self.path}: 'universe_index' outside the {x_shape[0]} universes")
        self.random_origins = size
        return rows, x_shape[1], crop

    def __getitem__(
        self, index: int | tuple[int, int] | tuple[int, int, tuple[int, int, int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(index, int | np.integer):
            sample, symmetry, origin = int(index), 0, None
        elif len(index) == 2:
            (sample, symmetry), origin = index, None
        else:
            sample, symmetry, origin = index
        if origin is None:
            origin = self._fixed_origin[sample]
        # The part of the crop whose image under the symmetry is this rank's block (the whole
        # crop without a split), read from the universe with the crop's origin added, wrapped.
        block = self.block or (slice(None),) * 3
        region = source_region(symmetry, block, self.size)
        x = read_periodic(
            self._open()["x"], int(self._universe_of[sample]), origin, region, self.size
        )
        return self._finish(x, symmetry, self._open()["y"][sample])


class FirstUniverses(Dataset):
    """The samples of `dataset` (a shard's) cut from its first `count` universes
    (first_universe_rows), in the shard's order: index k is the dataset's row rows[k], and an
    index tuple (k, symmetry[, origin]) keeps its symmetry and origin."""

    def __init__(self, dataset: ShardDataset, count: int, *, key: str = "train.universes") -> None:
        self.dataset = dataset
        self.path = dataset.path
        self.random_origins = dataset.random_origins
        self.rows = first_universe_rows(dataset.path, count, key=key)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(index, tuple):
            return self.dataset[(int(self.rows[index[0]]), *index[1:])]
        return self.dataset[int(self.rows[index])]


def holds_universes(f: h5py.File) -> bool:
    """Whether an open shard keeps whole universes (preprocess.train_crops random)."""
    return f.attrs.get("crops") == "random"


def open_shard(path: Path, **kwargs: Any) -> ShardDataset:
    """`path` as a ShardDataset, or a UniverseCropDataset where it holds whole universes."""
    with h5py.File(path, "r") as f:
        universes = holds_universes(f)
    return (UniverseCropDataset if universes else ShardDataset)(path, **kwargs)


def open_split(
    shards_dir: str | os.PathLike,
    split: str,
    model_cfg: ModelConfig,
    *,
    depth_slab: tuple[int, int] | None = None,
    block: tuple[slice, slice, slice] | None = None,
) -> ShardDataset:
    """The `split` shard, standardised with the training stats unless the shards were made with
    preprocess.standardize false, checked against the model."""
    mean, std = read_stats(shards_dir)
    standardize = stats_say_standardize(shards_dir)
    return open_shard(
        shard_path(shards_dir, split),
        mean=mean if standardize else None,
        std=std if standardize else None,
        depth_slab=depth_slab,
        block=block,
        sample_size=model_cfg.input_size,
        in_channels=model_cfg.in_channels,
    )
