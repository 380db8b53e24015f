"""The shard files: allocated in full before any sample is cropped, written by chunk offset at
each universe's place, and read back through HDF5 once written (docs/reference/formats.md,
"Shards").

A shard holds crops, or (the training split under preprocess.train_crops random) whole universes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from cosmocub.config import PreprocessConfig
from cosmocub.data.crop import counts_source, value_table
from cosmocub.data.h5chunks import ChunkWriter, create_preallocated
from cosmocub.data.splits import PreprocessError
from cosmocub.data.universe import UniverseMeta


def cube_origins(universe_size: int, sample_size: int) -> np.ndarray:
    """(n, 3) int64 (d, h, w) origins of a universe's non-overlapping cubes of side
    `sample_size`, depth slowest: the fixed crops of validation and test, in shard order."""
    blocks = np.arange(universe_size // sample_size) * sample_size
    bd, bh, bw = np.meshgrid(blocks, blocks, blocks, indexing="ij")
    return np.stack([bd.ravel(), bh.ravel(), bw.ravel()], axis=1)


def keeps_universes(split: str, settings: PreprocessConfig) -> bool:
    """Whether `split`'s shard keeps its universes whole (the training split under
    preprocess.train_crops random) rather than cut into crops."""
    return split == "train" and settings.train_crops == "random"


def create_shard(
    path: Path, split: str, metas: list[UniverseMeta], settings: PreprocessConfig
) -> None:
    """Write the shard's small datasets and attributes and allocate `x` for every sample (or,
    for a shard that `keeps_universes`, every universe)."""
    s, slab = settings.sample_size, settings.slab_depth
    c = metas[0].num_channels if metas else 4
    per_universe = (metas[0].size // s) ** 3 if metas else 0
    n = per_universe * len(metas)
    whole = keeps_universes(split, settings) and n > 0
    with h5py.File(path, "w") as f:
        if whole:
            # The universes whole, one row each; the rows below stay those of the fixed crops
            # (an epoch's samples: one random crop of universe_index[i] per row i).
            size = metas[0].size
            create_preallocated(
                f,
                "x",
                shape=(len(metas), c, size, size, size),
                dtype=settings.dtype,
                chunks=(1, c, slab, size, size),
            )
            f.attrs["crops"] = "random"
            f.attrs["universe_size"] = size
        elif n:
            create_preallocated(
                f, "x", shape=(n, c, s, s, s), dtype=settings.dtype, chunks=(1, c, slab, s, s)
            )
        if n:
            origins = cube_origins(metas[0].size, s)
            f["crop_origin"] = np.tile(origins, (len(metas), 1)).astype(np.int32)
            f["universe_index"] = np.repeat(np.arange(len(metas)), per_universe).astype(np.int32)
            f["y"] = np.repeat(np.stack([m.unit_par for m in metas]), per_universe, axis=0)
        else:
            # A split with ratio 0: same layout, zero samples (maxshape allows the chunking).
            f.create_dataset(
                "x",
                shape=(0, c, s, s, s),
                maxshape=(None, c, s, s, s),
                dtype=settings.dtype,
                chunks=(1, c, slab, s, s),
            )
            f["crop_origin"] = np.zeros((0, 3), np.int32)
            f["universe_index"] = np.zeros((0,), np.int32)
            f["y"] = np.zeros((0, 4), np.float32)
        f.attrs["source_files"] = json.dumps([str(m.path) for m in metas])
        f.attrs["split"] = split
        f.attrs["log1p"] = settings.log1p
        f.attrs["sample_size"] = s
        f.attrs["slab_depth"] = slab


class RowOffset:
    """Store target that writes one universe's rows at their place in the whole split's shard."""

    def __init__(self, writer: ChunkWriter, start: int) -> None:
        self.writer, self.start = writer, start

    def __setitem__(self, key: Any, block: np.ndarray) -> None:
        rows = key[0]
        shifted = slice(rows.start + self.start, rows.stop + self.start)
        self.writer[(shifted, *key[1:])] = block


def shard_writer(
    shard: Path, meta: UniverseMeta, settings: PreprocessConfig, *, whole: bool
) -> ChunkWriter:
    """The chunk writer of `shard`, whose samples are crops of `meta`'s universes (`whole`: the
    universes themselves, one a row, in a shard that `keeps_universes`). One per shard and
    process: it checks the layout and reads the chunk table (one entry per chunk of the whole
    shard) when made, so every universe written into the shard shares it through `RowOffset`."""
    s = meta.size if whole else settings.sample_size
    chunk_bytes = (
        meta.num_channels * settings.slab_depth * s * s * np.dtype(settings.dtype).itemsize
    )
    return ChunkWriter(shard, chunk_bytes=chunk_bytes)


def verify_written(
    path: Path,
    sources: Mapping[int, UniverseMeta],
    settings: PreprocessConfig,
    *,
    rows: tuple[int, int],
) -> None:
    """Read the first and last of a shard's samples rows[0]..rows[1]-1 back through HDF5 and
    recompute them from their universes (`sources`: the universe of each index the rows name):
    the raw chunk writer bypasses HDF5, so the standard reader must agree with it."""
    table = value_table(settings.log1p, settings.dtype)
    s = settings.sample_size
    with h5py.File(path, "r") as f:
        whole = f.attrs.get("crops") == "random"
        for i in sorted({rows[0], rows[1] - 1}):
            u = int(f["universe_index"][i])
            d, h, w = (int(v) for v in f["crop_origin"][i])
            # (C, S, S, S): the sample, or the same crop of its whole universe
            stored = f["x"][u, :, d : d + s, h : h + s, w : w + s] if whole else f["x"][i]
            box = (slice(d, d + s), slice(h, h + s), slice(w, w + s), slice(None))
            counts = np.asarray(counts_source(sources[u])[box], np.int16)
            expected = table[counts.view(np.uint16)].transpose(3, 0, 1, 2)
            if not np.array_equal(stored, expected, equal_nan=True):
                raise PreprocessError(
                    f"{path}: sample {i} read back through HDF5 differs from {sources[u].path} "
                    f"at origin ({d}, {h}, {w}): the shard writer wrote a corrupt shard"
                )


def first_universe_rows(
    path: str | os.PathLike, count: int | None, *, key: str = "train.universes"
) -> np.ndarray | None:
    """The rows of shard `path` cut from the first `count` of its universes (`source_files`
    order; `count` is the config's `key`), or None for `count` None (every row). A shard
    holding fewer universes is an error naming both numbers."""
    if count is None:
        return None
    with h5py.File(path, "r") as f:
        universes = len(json.loads(f.attrs["source_files"]))
        universe_of = f["universe_index"][:]
    if count > universes:
        raise ValueError(
            f"{path}: key '{key}' is {count} but the shard holds {universes} universes"
        )
    return np.flatnonzero(universe_of < count)
