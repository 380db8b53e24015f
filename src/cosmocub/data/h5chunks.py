"""Read and write uncompressed HDF5 chunks by file offset, so Dask threads run in parallel.

h5py holds the GIL through every read and write; os.pread/os.pwrite and memory maps release it.
Used by preprocessing; anything filtered or unusual falls back to plain h5py reads.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import uuid
from pathlib import Path
from typing import Any

import h5py
import numpy as np


class ChunkFormatError(ValueError):
    """A raw chunk cannot be read or written by offset (cut short, filtered, another byte order
    or layout); the message names the file and what is wrong."""


class H5Source:
    """Array-like view of one HDF5 dataset that opens the file per read (the general path).

    Unlike an open h5py.Dataset it pickles, so the same graph runs on a Dask cluster, and each
    read is a whole block (megabytes), so the open costs nothing that matters.
    """

    def __init__(self, path: Path, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        # Absolute, so a Dask cluster worker with another working directory finds the file.
        self.path, self.name = os.path.abspath(path), name
        self.shape, self.dtype, self.ndim = shape, np.dtype(dtype), len(shape)

    def __getitem__(self, key: Any) -> np.ndarray:
        with h5py.File(self.path, "r") as f:
            return f[self.name][key]


class RawChunkSource(H5Source):
    """Reads an uncompressed chunked int16 dataset straight from its chunks' file offsets.

    h5py holds the GIL through every read, so Dask threads would queue behind it; os.pread
    releases it, and the universes' raw chunks are plain little-endian int16 bytes.
    """

    def __init__(self, path: Path, dset: h5py.Dataset) -> None:
        super().__init__(path, dset.name, dset.shape, dset.dtype)
        self.chunk = dset.chunks
        grid = [math.ceil(n / c) for n, c in zip(dset.shape, self.chunk, strict=True)]
        self.offsets = np.full(grid, -1, dtype=np.int64)  # -1: never written (fill value)
        self.fill = dset.fillvalue

        def record(info: Any) -> None:
            index = tuple(o // c for o, c in zip(info.chunk_offset, self.chunk, strict=True))
            self.offsets[index] = info.byte_offset

        dset.id.chunk_iter(record)

    def __getitem__(self, key: Any) -> np.ndarray:
        box = [k.indices(n)[:2] for k, n in zip(key, self.shape, strict=True)]
        out = np.empty([b - a for a, b in box], dtype=np.int16)
        ranges = [
            range(a // c, (b - 1) // c + 1) for (a, b), c in zip(box, self.chunk, strict=True)
        ]
        nbytes = math.prod(self.chunk) * 2
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for index in itertools.product(*ranges):
                origin = [i * c for i, c in zip(index, self.chunk, strict=True)]
                src = tuple(
                    slice(max(a, o) - o, min(b, o + c) - o)
                    for (a, b), o, c in zip(box, origin, self.chunk, strict=True)
                )
                dst = tuple(
                    slice(max(a, o) - a, min(b, o + c) - a)
                    for (a, b), o, c in zip(box, origin, self.chunk, strict=True)
                )
                offset = self.offsets[index]
                if offset < 0:
                    out[dst] = self.fill
                    continue
                raw = os.pread(fd, nbytes, int(offset))
                if len(raw) != nbytes:
                    raise ChunkFormatError(
                        f"{self.path}: chunk {index} of '{self.name}' is cut short "
                        f"({len(raw)} of {nbytes} bytes)"
                    )
                out[dst] = np.frombuffer(raw, dtype="<i2").reshape(self.chunk)[src]
        finally:
            os.close(fd)
        return out


class ContiguousSource(H5Source):
    """Reads an uncompressed contiguous int16 dataset through a memory map (no GIL held)."""

    def __init__(self, path: Path, dset: h5py.Dataset) -> None:
        super().__init__(path, dset.name, dset.shape, dset.dtype)
        self.offset = int(dset.id.get_offset())

    def __getitem__(self, key: Any) -> np.ndarray:
        mapped = np.memmap(self.path, dtype="<i2", mode="r", offset=self.offset, shape=self.shape)
        return np.array(mapped[key], dtype=np.int16)


def open_source(path: Path, name: str = "full") -> H5Source:
    """The fastest reader that is exact for dataset `name` of `path` (int16 little-endian)."""
    with h5py.File(path, "r") as f:
        dset = f[name]
        plain = (
            dset.dtype == np.dtype("<i2")
            and dset.id.get_create_plist().get_nfilters() == 0
            and dset.external is None
        )
        if plain and dset.chunks is not None and hasattr(dset.id, "chunk_iter"):
            return RawChunkSource(path, dset)
        if plain and dset.chunks is None and dset.id.get_offset() is not None:
            return ContiguousSource(path, dset)
        return H5Source(path, name, dset.shape, dset.dtype)


def create_preallocated(
    group: h5py.Group, name: str, *, shape: tuple[int, ...], dtype: str, chunks: tuple[int, ...]
) -> h5py.Dataset:
    """An uncompressed chunked dataset whose chunks all get their file place now, unfilled.

    Fixed offsets are what lets `ChunkWriter` write the data later without HDF5.
    """
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    return group.create_dataset(
        name, shape=shape, dtype=dtype, chunks=chunks, fill_time="never", dcpl=dcpl
    )


@functools.lru_cache(maxsize=6)
def chunk_offsets(path: str, token: str) -> np.ndarray:
    """File offset of every chunk of a shard's `x`, as (sample, slab_index) → byte offset.

    `x` is (N, C, S, S, S) chunked (1, C, slab, S, S), created by `create_preallocated`.

    Cached per process (`token` is unique per shard file, so a rewritten path never hits a stale
    table): Dask threads share one table, and each cluster worker builds its own once.
    """
    with h5py.File(path, "r") as f:
        x = f["x"]
        slab = x.chunks[2]
        offsets = np.full((x.shape[0], x.shape[2] // slab), -1, dtype=np.int64)

        def record(info: Any) -> None:
            offsets[info.chunk_offset[0], info.chunk_offset[2] // slab] = info.byte_offset

        if hasattr(x.id, "chunk_iter"):
            x.id.chunk_iter(record)
        else:
            offsets_by_coord(x, record)
    if np.any(offsets < 0):
        raise ChunkFormatError(f"{path}: 'x' has unallocated chunks (not created early)")
    return offsets


def offsets_by_coord(x: h5py.Dataset, record: Any) -> None:
    """`record` every chunk of `x` (N, C, S, S, S) chunked (1, C, slab, S, S), one lookup by
    coordinate each: the table's path where HDF5 has no chunk iterator (before 1.12.3).

    Not `get_chunk_info(i)`: HDF5 finds the i-th chunk by walking the index from its start, so
    a table of n chunks costs n²/2 steps (measured: 0.29 s for the first 2,000 of a
    1,000-universe training shard's 8,000 chunks, ~5 s for all of them, built once per writer);
    a lookup by coordinate is one index search (0.55 s for the 8,000).
    """
    slab = x.chunks[2]
    for sample in range(x.shape[0]):
        for depth in range(0, x.shape[2], slab):
            record(x.id.get_chunk_info_by_coord((sample, 0, depth, 0, 0)))


def check_raw_writable(path: str, chunk_bytes: int) -> np.dtype:
    """Refuse any layout of a shard's `x` that writing raw bytes at chunk offsets would corrupt:
    contiguous or external storage, filters (compression, shuffle, checksums), a big-endian or
    non-numeric type, another chunk shape, or chunks that overlap. Returns x's dtype."""
    with h5py.File(path, "r") as f:
        x = f["x"]
        reasons = []
        if x.chunks is None:
            reasons.append("it is contiguous, not chunked")
        elif (
            x.ndim != 5
            or x.chunks[0] != 1
            or x.chunks[1] != x.shape[1]
            or x.chunks[3:] != x.shape[3:]
        ):
            reasons.append(f"chunks {x.chunks} are not (1, C, slab, S, S) of shape {x.shape}")
        if x.id.get_create_plist().get_nfilters():
            reasons.append("it has filters (compression, shuffle or checksums)")
        if x.external:
            reasons.append("it is stored in external files")
        if (
            x.dtype.kind not in "fiu"
            or x.dtype.byteorder not in "<|="
            or (x.dtype.byteorder == "=" and np.little_endian is False)
        ):
            reasons.append(f"its type {x.dtype.str} is not a little-endian number")
        elif x.chunks is not None and math.prod(x.chunks) * x.dtype.itemsize != chunk_bytes:
            reasons.append(
                f"a chunk holds {math.prod(x.chunks) * x.dtype.itemsize} bytes, not {chunk_bytes}"
            )
        dtype = x.dtype
    if reasons:
        raise ChunkFormatError(f"{path}: cannot write 'x' by chunk offsets: {'; '.join(reasons)}")
    starts = np.sort(chunk_offsets.__wrapped__(path, "").ravel())  # uncached: a fresh file
    if np.any(np.diff(starts) < chunk_bytes):
        raise ChunkFormatError(f"{path}: chunks of 'x' overlap in the file")
    return dtype


class ChunkWriter:
    """Store target writing chunk-ordered blocks (sample, slab_index, C, slab, S, S) straight to
    the shard's chunk offsets.

    The shard's `x` is created with every chunk allocated up front (and no fill), so each chunk
    has a fixed file offset; writing there with os.pwrite releases the GIL (h5py would hold it
    and serialise the Dask threads) and needs no lock, since blocks never share a chunk. It
    pickles small (path and token), so Dask cluster workers on a shared filesystem can write too.
    """

    def __init__(self, path: Path, chunk_bytes: int) -> None:
        self.path, self.chunk_bytes = os.path.abspath(path), chunk_bytes
        self.dtype = check_raw_writable(self.path, chunk_bytes)
        self.token = uuid.uuid4().hex
        chunk_offsets(self.path, self.token)  # build the table once, before the threads start

    def __setitem__(self, key: Any, block: np.ndarray) -> None:
        table = chunk_offsets(self.path, self.token)
        first, last, step = key[0].indices(len(table))
        # A block of whole samples (the crops), or of some depth slabs of them (the whole
        # universes of preprocess.train_crops random): key[1] picks the slabs.
        slabs = key[1] if len(key) > 1 else slice(None)
        slab_lo, slab_hi, slab_step = slabs.indices(table.shape[1])
        if block.dtype != self.dtype or step != 1 or slab_step != 1:
            raise ChunkFormatError(
                f"{self.path}: block of {block.dtype.str} (step {step}) for 'x' of "
                f"{self.dtype.str}{'' if slab_step == 1 else f', slab step {slab_step}'}: raw "
                f"bytes would be misread"
            )
        offsets = table[first:last, slab_lo:slab_hi].ravel()
        data = memoryview(np.ascontiguousarray(block)).cast("B")
        if len(data) != len(offsets) * self.chunk_bytes:
            raise ChunkFormatError(
                f"{self.path}: block of {len(data)} bytes for {len(offsets)} chunks of "
                f"{self.chunk_bytes} bytes"
            )
        # Runs of chunks that lie back to back in the file go out in one call.
        breaks = np.flatnonzero(np.diff(offsets) != self.chunk_bytes) + 1
        fd = os.open(self.path, os.O_WRONLY)
        try:
            for run in np.split(np.arange(len(offsets)), breaks):
                lo, hi = run[0] * self.chunk_bytes, (run[-1] + 1) * self.chunk_bytes
                position = int(offsets[run[0]])
                while lo < hi:
                    written = os.pwrite(fd, data[lo:hi], position)
                    lo, position = lo + written, position + written
        finally:
            os.close(fd)
