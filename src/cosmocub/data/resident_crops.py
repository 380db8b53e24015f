"""Crops and cube symmetries cut where the step runs: a shard's universes (or fixed samples) held
whole in one tensor on the device, and each batch gathered from it by index arithmetic.

What a batch is never changes: row i of a batch under symmetry s and origin o holds exactly what
`ShardDataset[(i, s, o)]` reads from the file (the same values, bit for bit), so the sampler's
draws (train/loaders.py) decide both paths alike.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import h5py
import numpy as np
import torch

from cosmocub.data.augment import CUBE_SYMMETRIES
from cosmocub.data.dataset import FirstUniverses, ShardDataset, UniverseCropDataset

# Universes read from the file and copied over per piece: bounds the host memory a load needs.
LOAD_BYTES = 256 << 20


def _symmetry_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """(48, 3) int64 axis orders and (48, 3) bool flips, CUBE_SYMMETRIES as tensors."""
    perms = torch.tensor([perm for perm, _ in CUBE_SYMMETRIES], dtype=torch.int64)
    flips = torch.tensor([flips for _, flips in CUBE_SYMMETRIES], dtype=torch.bool)
    return perms, flips


@dataclass(kw_only=True)
class ResidentShard:
    """A training shard held whole in one device's memory: as stored, or standardised float32.

    values_undhwc: (U, N, N, N, C) the universes (fixed crops: U = samples, N = S), channels
    last so that one voxel's channels are one row of a gather; rows (sample i of the dataset)
    point into it by `universe_of` and `fixed_origin`.
    """

    values_undhwc: torch.Tensor
    targets: torch.Tensor  # (rows, P) float32, or the dataset's (rows, …) targets
    universe_of: torch.Tensor  # (rows,) int64: the universe of `values_undhwc` row i crops
    fixed_origin: torch.Tensor  # (rows, 3) int64: row i's crop origin when none is drawn
    mean: torch.Tensor | None  # (C,) float32, the dataset's own; None: values as they are given
    inv_std: torch.Tensor | None  # (C,) float32
    crop_size: int
    block: tuple[slice, slice, slice] | None  # this rank's block of every turned crop
    perms: torch.Tensor  # (48, 3) int64 on the device
    flips: torch.Tensor  # (48, 3) bool on the device
    strides: torch.Tensor  # (3,) int64 on the device: N², N, 1, a voxel row's steps along D, H, W

    @property
    def device(self) -> torch.device:
        return self.values_undhwc.device

    @property
    def universe_size(self) -> int:
        return self.values_undhwc.shape[1]

    @property
    def nbytes(self) -> int:
        return self.values_undhwc.numel() * self.values_undhwc.element_size()


def resident_bytes(dataset: ShardDataset | FirstUniverses, *, standardized: bool = False) -> int:
    """Bytes `load_resident` would hold for `dataset`, without reading it."""
    shard, rows = _unwrap(dataset)
    with h5py.File(shard.path, "r") as f:
        x = f["x"]
        if isinstance(shard, UniverseCropDataset):
            count = len(np.unique(shard._universe_of[rows]))
        else:
            count = len(rows)
        itemsize = 4 if standardized else x.dtype.itemsize
        return count * int(np.prod(x.shape[1:])) * itemsize


def load_resident(
    dataset: ShardDataset | FirstUniverses,
    device: torch.device,
    *,
    pin: bool = False,
    standardized: bool = False,
) -> ResidentShard:
    """Read every universe `dataset`'s rows crop (fixed samples: every sample) onto `device`
    (on the host, in pinned memory with `pin`), a few hundred MB at a time: as stored, or with
    `standardized` as the float32 values the dataset gives (twice the memory of float16, and
    no arithmetic left per batch: what a CPU, where that arithmetic is most of a batch's cost,
    chooses)."""
    shard, rows = _unwrap(dataset)
    if not holdable(dataset):
        raise TypeError(f"{shard.path}: {type(shard).__name__} cannot be held resident")
    with h5py.File(shard.path, "r") as f:
        x = f["x"]
        if isinstance(shard, UniverseCropDataset):
            crops = shard._universe_of[rows].astype(np.int64)
            fixed_origin = shard._fixed_origin[rows].astype(np.int64)
        else:  # every sample is a universe of side S, cropped at 0
            crops = rows
            fixed_origin = np.zeros((len(rows), 3), np.int64)
        stored, universe_of = np.unique(crops, return_inverse=True)  # sorted: h5py reads so
        channels, size = x.shape[1], x.shape[2]
        dtype = torch.float32 if standardized else torch.from_numpy(np.empty(0, x.dtype)).dtype
        scale = _scale(shard, device)
        values = torch.empty(
            (len(stored), size, size, size, channels),
            dtype=dtype,
            device=device,
            pin_memory=pin and device.type == "cpu",
        )
        per_piece = max(1, LOAD_BYTES // (channels * size**3 * x.dtype.itemsize))
        for start in range(0, len(stored), per_piece):
            piece = torch.from_numpy(x[stored[start : start + per_piece]]).to(device)
            if standardized:  # the dataset's float32 operations, in its order
                piece = piece.float()  # (k, C, N, N, N)
                if scale is not None:
                    piece = (piece - scale[0].view(1, -1, 1, 1, 1)) * scale[1].view(1, -1, 1, 1, 1)
            values[start : start + len(piece)] = piece.permute(0, 2, 3, 4, 1)
        # As the dataset reads them: the stored targets cast to float32.
        targets = f["y"][:][rows].astype(np.float32, copy=False)
    mean, inv_std = (None, None) if scale is None or standardized else scale
    perms, flips = _symmetry_tables()
    return ResidentShard(
        values_undhwc=values,
        targets=torch.from_numpy(np.ascontiguousarray(targets)).to(device),
        universe_of=torch.from_numpy(universe_of.astype(np.int64)).to(device),
        fixed_origin=torch.from_numpy(fixed_origin).to(device),
        mean=mean,
        inv_std=inv_std,
        crop_size=shard.size,
        block=shard.block,
        perms=perms.to(device),
        flips=flips.to(device),
        strides=torch.tensor([size * size, size, 1], device=device),
    )


def holdable(dataset: object) -> bool:
    """Whether `load_resident` can hold `dataset`: a shard's samples or universes (these very
    classes: a subclass may read otherwise), or FirstUniverses of them."""
    inner = dataset.dataset if isinstance(dataset, FirstUniverses) else dataset
    return type(inner) in (ShardDataset, UniverseCropDataset)


def _scale(shard: ShardDataset, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(mean, 1/std) (C,) float32 on `device`: the very values the dataset standardises with."""
    if shard._scale is None:
        return None
    mean, inv_std = (torch.from_numpy(v.reshape(-1)).to(device) for v in shard._scale)
    return mean, inv_std


def _unwrap(dataset: ShardDataset | FirstUniverses) -> tuple[ShardDataset, np.ndarray]:
    """(the shard, its rows that the dataset's indices 0 … len − 1 stand for)."""
    if isinstance(dataset, FirstUniverses):
        return dataset.dataset, np.asarray(dataset.rows, np.int64)
    if isinstance(dataset, ShardDataset):
        return dataset, np.arange(len(dataset))
    raise TypeError(
        f"{getattr(dataset, 'path', dataset)}: {type(dataset).__name__} cannot be held resident "
        "(only a shard's samples or universes, or FirstUniverses of them)"
    )


def crop_source_rows(
    shard: ResidentShard,
    rows: torch.Tensor,
    symmetries: torch.Tensor,
    origins_dhw: torch.Tensor | None,
) -> torch.Tensor:
    """Rows of the flattened (U·N³, C) universes that make up each turned crop's block:
    (B, d, h, w) int64, all in tensor arithmetic on the shard's device.

    Output axis j of a turned crop is stored axis perm[j], read backwards where it is flipped;
    with the crop's origin added and wrapped, each output axis is one vector per sample, and the
    three add up to the row index by broadcasting (no voxel is visited in Python).
    """
    size, crop = shard.universe_size, shard.crop_size
    universe = shard.universe_of[rows]  # (B,)
    origin = shard.fixed_origin[rows] if origins_dhw is None else origins_dhw  # (B, 3)
    perm, flip = shard.perms[symmetries], shard.flips[symmetries]  # (B, 3) each
    block = shard.block or (slice(None),) * 3
    index = (universe * size**3).view(-1, 1, 1, 1)
    for j, axis_block in enumerate(block):
        lo, hi, _ = axis_block.indices(crop)
        k = torch.arange(lo, hi, device=shard.device)  # (L,) output positions along axis j
        k = torch.where(flip[:, j : j + 1], crop - 1 - k, k)  # (B, L) positions in the crop
        along = origin.gather(1, perm[:, j : j + 1])  # (B, 1) the origin on stored axis perm[j]
        term = ((along + k) % size) * shard.strides[perm[:, j : j + 1]]  # (B, L)
        shape = [-1, 1, 1, 1]
        shape[j + 1] = term.shape[1]
        index = index + term.view(shape)
    return index  # (B, d, h, w)


def gather_crops(
    shard: ResidentShard,
    rows: torch.Tensor,
    symmetries: torch.Tensor,
    origins_dhw: torch.Tensor | None = None,
    *,
    memory_format: torch.memory_format = torch.contiguous_format,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x (B, C, d, h, w) float32 standardised, targets (B, …)) of dataset rows `rows` (B,)
    under `symmetries` (B,) at `origins_dhw` (B, 3) (None: the rows' fixed origins)."""
    index = crop_source_rows(shard, rows, symmetries, origins_dhw)  # (B, d, h, w)
    values = shard.values_undhwc
    channels = values.shape[-1]
    wide = _WIDE.get(channels * values.element_size())
    if wide is not None:  # a voxel's channels as one wider element: a plain element gather
        flat = values.view(wide).view(-1)  # (U·N³,)
        picked = flat.index_select(0, index.reshape(-1)).view(values.dtype)  # (B·d·h·w·C,)
    else:
        picked = values.view(-1, channels).index_select(0, index.reshape(-1))  # (B·d·h·w, C)
    stored = picked.view(*index.shape, channels)  # (B, d, h, w, C)
    if shard.mean is None or shard.inv_std is None:
        x = stored.float()
    else:
        # The dataset's own float32 operations in its order ((float32(x) − mean) · 1/std),
        # equal to the voxel: the subtraction promotes the stored values to float32 as it reads
        # them, and the product is taken in place (fewer passes over a batch-sized tensor).
        x = torch.empty(stored.shape, dtype=torch.float32, device=stored.device)
        torch.sub(stored, shard.mean, out=x).mul_(shard.inv_std)
    x = x.permute(0, 4, 1, 2, 3)  # (B, C, d, h, w), channels-last strides
    return x.contiguous(memory_format=memory_format), shard.targets[rows]


# Integer types as wide as one voxel's channels, for gathering a voxel as one element.
_WIDE = {2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.complex128}


def host_memory_available() -> int:
    """Bytes of memory this host can still give (MemAvailable), for deciding what fits."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
