"""Crop universes into train/val/test shards with Dask and xarray (docs/formats.md, "Shards").

Universes open lazily as h5py-backed Dask arrays in an xarray DataArray (universe, d, h, w,
channel); each is split by universe, cut into non-overlapping cubes, transformed and stored.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dask.array as da
import h5py
import numpy as np
import xarray as xr
from dask.base import tokenize
from dask.callbacks import Callback

from cosmocub.config import PreprocessConfig
from cosmocub.data.features import FEATURES_FILE, write_features
from cosmocub.data.h5chunks import ChunkWriter, create_preallocated, open_source
from cosmocub.data.universe import (
    COUNT_VALUES,
    UniverseMeta,
    channel_histogram,
    histogram_moments,
    read_universe_meta,
)
from cosmocub.io import atomic_path, sha256_file

SPLITS: tuple[str, ...] = ("train", "val", "test")
# One Dask block is one sample-thick depth slab of a universe (S × k·S × N × C), k chosen so a
# block is about this many bytes: large enough that per-task overhead vanishes (16 tasks for a
# 512³ universe at S = 32), small enough that num_workers blocks fit in memory many times over.
BLOCK_BYTES = 64 << 20
PROGRESS_EVERY_S = 30.0
DASK_CONNECT_TIMEOUT_S = 5


class PreprocessError(ValueError):
    """Inputs or settings that preprocessing cannot use; one line naming files and numbers."""


# --- splitting by universe -------------------------------------------------------------------


def split_counts(num_universes: int, ratios: dict[str, float]) -> dict[str, int]:
    """Universes per split: normalised ratios, largest-remainder rounding (ties: train, val, test).

    A split with ratio 0 gets none (it is written empty); a split with ratio > 0 that would get
    none, or an empty train split, is an error.
    """
    total = sum(ratios[s] for s in SPLITS)
    described = " ".join(f"{s}={ratios[s]:g}" for s in SPLITS)
    if total <= 0:
        raise PreprocessError(f"preprocess.splits {described}: ratios must sum to > 0")
    # Rounding the quotas first keeps 0.7 * 10 = 6.999… from losing a universe to float error.
    quotas = {s: round(num_universes * ratios[s] / total, 9) for s in SPLITS}
    counts = {s: math.floor(quotas[s]) for s in SPLITS}
    left = num_universes - sum(counts.values())
    by_remainder = sorted(SPLITS, key=lambda s: -(quotas[s] - counts[s]))
    for s in by_remainder[:left]:
        counts[s] += 1
    for s in SPLITS:
        if (ratios[s] > 0 or s == "train") and counts[s] == 0:
            raise PreprocessError(
                f"{num_universes} universes cannot fill splits {described}: {s} would get 0"
            )
    return counts


def assign_splits(paths: list[Path], ratios: dict[str, float], seed: int) -> dict[str, list[Path]]:
    """Deterministic split: a seeded permutation of the sorted paths, cut by `split_counts`.

    Within a split, universes are listed in sorted order (so shard order does not depend on the
    permutation, only membership does).
    """
    ordered = sorted(paths, key=str)
    counts = split_counts(len(ordered), ratios)
    perm = np.random.default_rng(seed).permutation(len(ordered))
    out: dict[str, list[Path]] = {}
    start = 0
    for s in SPLITS:
        chosen = perm[start : start + counts[s]]
        out[s] = [ordered[i] for i in sorted(chosen)]
        start += counts[s]
    return out


# --- lazy inputs ----------------------------------------------------------------------------


def open_universes(metas: list[UniverseMeta], *, sample_size: int) -> xr.DataArray:
    """Lazy int16 counts (universe, d, h, w, channel), chunked in sample-thick depth slabs."""
    size, channels = metas[0].size, metas[0].num_channels
    s = sample_size
    slab_row = s * s * size * channels * 2  # bytes of one S × S × N × C row of samples
    rows = max(1, min(size // s, BLOCK_BYTES // slab_row))
    arrays = [
        da.from_array(
            open_source(m.path),
            chunks=(s, rows * s, size, channels),
            # Keyed by the file's absolute path: two universes never share Dask keys, even when
            # they have the same file name in different folders.
            name=f"universe-{tokenize(os.path.abspath(m.path), s, rows)}",
            lock=False,  # readers open their own handles; h5py serialises itself
            meta=np.empty((0, 0, 0, 0), np.int16),
        )
        for m in metas
    ]
    return xr.DataArray(
        da.stack(arrays),
        dims=("universe", "d", "h", "w", "channel"),
        coords={"universe": [str(m.path) for m in metas], "channel": metas[0].redshifts},
        name="counts",
    )


@functools.cache
def value_table(log1p: bool, dtype: str) -> np.ndarray:
    """Stored value of every int16 count, indexed by the count's uint16 bit pattern.

    A 64 Ki-entry lookup replaces log1p + cast (~3× faster) and is exactly what
    `np.log1p(count.astype(float32)).astype(dtype)` gives.
    """
    counts = COUNT_VALUES.astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):  # negative counts are never valid
        values = np.log1p(counts) if log1p else counts
    return values.astype(dtype)


# Voxels per table lookup: the index is copied to intp (8 bytes a value) before the gather; in
# pieces that copy stays in cache (measured ~2x faster on a 16 MB block than one whole lookup).
_LOOKUP_VALUES = 1 << 18


def _to_values(block: np.ndarray, log1p: bool, dtype: str) -> np.ndarray:
    table = value_table(log1p, dtype)
    index = np.ascontiguousarray(block).view(np.uint16)
    flat = index.reshape(-1)
    out = np.empty(flat.shape, dtype=table.dtype)
    for start in range(0, flat.size, _LOOKUP_VALUES):
        np.take(
            table, flat[start : start + _LOOKUP_VALUES], out=out[start : start + _LOOKUP_VALUES]
        )
    return out.reshape(block.shape)


def crop_samples(
    counts: xr.DataArray, *, sample_size: int, slab_depth: int, log1p: bool, dtype: str
) -> xr.DataArray:
    """(universe, d, h, w, channel) counts → (sample, slab_index, channel, slab, sh, sw) values.

    That is the byte order of the shard's chunks (1, C, slab_depth, S, S), so each Dask block is
    written as-is. Samples run universe-major, then by crop origin (d, h, w), row-major.
    """
    s = sample_size
    values = counts.copy(
        data=counts.data.map_blocks(_to_values, log1p, dtype, dtype=np.dtype(dtype))
    )
    cubes = values.coarsen(d=s, h=s, w=s).construct(
        d=("block_d", "sd"), h=("block_h", "sh"), w=("block_w", "sw")
    )
    slabs = cubes.coarsen(sd=slab_depth).construct(sd=("slab_index", "slab"))
    ordered = slabs.transpose(
        "universe", "block_d", "block_h", "block_w", "slab_index", "channel", "slab", "sh", "sw"
    )
    # Merging the leading dims copies each Dask block once into C order (the transpose above
    # is only a view until then); a block's samples are consecutive in row-major order, so each
    # write below is one run of consecutive samples. (xarray's stack would put `sample` last and
    # cost a second copy to bring it forward.)
    n = math.prod(ordered.sizes[d] for d in ("universe", "block_d", "block_h", "block_w"))
    dims = ("slab_index", "channel", "slab", "sh", "sw")
    return xr.DataArray(
        ordered.data.reshape(n, *(ordered.sizes[d] for d in dims)),
        dims=("sample", *dims),
        coords={"channel": ordered["channel"].values},
        name="values",
    )


def _cropper(settings: PreprocessConfig) -> Callable[[xr.DataArray], xr.DataArray]:
    """`crop_samples` with this config's crop size, slab depth, transform and dtype bound."""
    return functools.partial(
        crop_samples,
        sample_size=settings.sample_size,
        slab_depth=settings.slab_depth,
        log1p=settings.log1p,
        dtype=settings.dtype,
    )


def _histogram_block(block: np.ndarray) -> np.ndarray:
    return channel_histogram(block).reshape(1, 1, 1, 1, -1)


def train_histogram(counts: xr.DataArray) -> da.Array:
    """Dask reduction: (C, 65536) histogram of the counts, summed over every block."""
    channels = counts.sizes["channel"]
    per_block = counts.data.map_blocks(
        _histogram_block, chunks=(1, 1, 1, 1, channels * 2**16), dtype=np.int64
    )
    return per_block.sum(axis=(0, 1, 2, 3)).reshape(channels, 2**16)


def _validate(paths: list[Path], sample_size: int) -> list[UniverseMeta]:
    if not paths:
        raise PreprocessError("preprocess: no universe files given")
    seen: dict[Path, Path] = {}
    for p in paths:
        key = Path(p).resolve()
        if key in seen:
            raise PreprocessError(f"{p}: given twice (also as {seen[key]}); samples would repeat")
        seen[key] = Path(p)
    metas = [read_universe_meta(p) for p in paths]
    first = metas[0]
    for m in metas[1:]:
        if m.size != first.size:
            raise PreprocessError(
                f"{m.path}: universe size {m.size} differs from {first.size} of {first.path}; "
                f"all universes must share one size"
            )
    if first.size % sample_size:
        raise PreprocessError(
            f"{first.path}: preprocess.sample_size {sample_size} does not divide the universe "
            f"size {first.size}"
        )
    return metas


def _create_shard(
    path: Path, split: str, metas: list[UniverseMeta], settings: PreprocessConfig
) -> ChunkWriter | None:
    """Write the shard's small datasets and attributes, allocate `x`; return its writer."""
    s, slab = settings.sample_size, settings.slab_depth
    c = metas[0].num_channels if metas else 4
    per_universe = (metas[0].size // s) ** 3 if metas else 0
    n = per_universe * len(metas)
    with h5py.File(path, "w") as f:
        if n:
            create_preallocated(
                f, "x", shape=(n, c, s, s, s), dtype=settings.dtype, chunks=(1, c, slab, s, s)
            )
            nb = metas[0].size // s
            bd, bh, bw = np.meshgrid(*(np.arange(nb),) * 3, indexing="ij")
            origins = np.stack([bd.ravel(), bh.ravel(), bw.ravel()], axis=1) * s
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
    if not n:
        return None
    return ChunkWriter(path, chunk_bytes=c * slab * s * s * np.dtype(settings.dtype).itemsize)


def _verify_written(path: Path, metas: list[UniverseMeta], settings: PreprocessConfig) -> None:
    """Read a shard's first and last samples back through HDF5 and recompute them from their
    universes: the raw chunk writer bypasses HDF5, so the standard reader must agree with it."""
    table = value_table(settings.log1p, settings.dtype)
    s = settings.sample_size
    with h5py.File(path, "r") as f:
        n = f["x"].shape[0]
        for i in sorted({0, n - 1}):
            u = int(f["universe_index"][i])
            d, h, w = (int(v) for v in f["crop_origin"][i])
            stored = f["x"][i]  # (C, S, S, S)
            with h5py.File(metas[u].path, "r") as src:
                counts = np.asarray(src["full"][d : d + s, h : h + s, w : w + s, :], np.int16)
            expected = table[counts.view(np.uint16)].transpose(3, 0, 1, 2)
            if not np.array_equal(stored, expected, equal_nan=True):
                raise PreprocessError(
                    f"{path}: sample {i} read back through HDF5 differs from {metas[u].path} "
                    f"at origin ({d}, {h}, {w}): the shard writer wrote a corrupt shard"
                )


class _LogProgress(Callback):
    """Periodic progress lines for non-interactive logs (Dask's ProgressBar redraws a tty line)."""

    def __init__(self, every_s: float, total_bytes: int) -> None:
        super().__init__()
        self.every_s, self.total_bytes = every_s, total_bytes

    def _start_state(self, dsk: Any, state: dict[str, Any]) -> None:
        self.total = sum(len(state[k]) for k in ("ready", "waiting", "running"))
        self.done, self.t0 = 0, time.perf_counter()
        self.last = self.t0

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        self.done += 1
        now = time.perf_counter()
        if now - self.last >= self.every_s:
            self.last = now
            share = self.done / max(self.total, 1)
            rate = share * self.total_bytes / (now - self.t0) / 1e6
            print(
                f"preprocess: {share:.0%} of {self.total} tasks, ~{rate:.0f} MB/s of input",
                file=sys.stderr,
                flush=True,
            )


def _progress(total_bytes: int) -> contextlib.AbstractContextManager:
    if sys.stderr.isatty():
        from dask.diagnostics import ProgressBar

        return ProgressBar(out=sys.stderr)
    return _LogProgress(PROGRESS_EVERY_S, total_bytes)


def _distributed_client(address: str) -> Any:
    try:
        from dask.distributed import Client
    except ImportError:
        raise PreprocessError(
            f"preprocess.dask_scheduler is {address!r} but dask.distributed is not installed "
            f"(pip install distributed), or set it to null for local threads"
        ) from None
    try:
        # A few seconds, not distributed's 30 s default: a wrong address should fail fast.
        return Client(address, timeout=DASK_CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as err:
        raise PreprocessError(
            f"key 'preprocess.dask_scheduler': no Dask scheduler answers at {address!r} within "
            f"{DASK_CONNECT_TIMEOUT_S} s ({type(err).__name__}); start it, or set it to null for "
            f"local threads"
        ) from None


def _compute(
    samples: dict[str, da.Array],
    writers: dict[str, ChunkWriter | None],
    hist: da.Array,
    hist_out: np.ndarray,
    settings: PreprocessConfig,
    total_bytes: int,
) -> None:
    """Run the graph: shards written through `writers`, the training histogram into `hist_out`."""
    targets = [writers[s] for s in samples]
    if settings.dask_scheduler:
        with _distributed_client(settings.dask_scheduler) as client:
            # Workers write the shards themselves (the writers pickle, the filesystem is shared);
            # one submission, so the histogram shares the shard reads; futures keep their order.
            stores = da.store(list(samples.values()), targets, lock=False, compute=False)
            futures = client.compute([*stores, hist])
            client.gather(futures)
            hist_out[...] = futures[-1].result()
        return
    # One store for everything: the training histogram shares its reads with the shard writes,
    # so every universe is read from disk once.
    stores = da.store(
        [*samples.values(), hist],
        [*targets, hist_out],
        lock=False,  # blocks never share a chunk, and the histogram is one block
        compute=False,
    )
    with _progress(total_bytes):
        da.compute(*stores, scheduler="threads", num_workers=settings.num_workers)


def preprocess(
    universe_paths: list[Path],
    out_dir: Path,
    *,
    settings: PreprocessConfig,
    seed: int,
    config_hash: str,
) -> dict[str, Any]:
    """Write the shard folder `out_dir` (atomically, as a whole) and return its manifest.

    The folder holds the shards, stats.json, manifest.json and features.h5 (docs/formats.md)."""
    t0 = time.perf_counter()
    paths = [Path(p) for p in universe_paths]
    metas = _validate(paths, settings.sample_size)
    by_path = {m.path: m for m in metas}
    assigned = assign_splits(paths, settings.splits.as_dict(), seed)
    split_metas = {s: [by_path[p] for p in assigned[s]] for s in SPLITS}
    crop = _cropper(settings)
    counts = {
        s: open_universes(ms, sample_size=settings.sample_size)
        for s, ms in split_metas.items()
        if ms
    }
    samples = {s: crop(c).data for s, c in counts.items()}
    hist = train_histogram(counts["train"])
    hist_np = np.zeros(hist.shape, dtype=np.int64)
    total_bytes = sum(m.nbytes for m in metas)

    out_dir = Path(out_dir)
    with (
        atomic_path(out_dir) as tmp,
        # Checksums run beside the Dask work (hashlib releases the GIL), one thread per four
        # Dask threads so hashing (~1.5 GB/s a thread) keeps up; they are not in the graph
        # because dask.compute (2026.8) returns mixed Array/Delayed results out of order.
        ThreadPoolExecutor(
            max_workers=max(1, (settings.num_workers or os.cpu_count() or 1) // 4),
            thread_name_prefix="sha256",
        ) as hasher,
    ):
        hashing = [hasher.submit(sha256_file, m.path) for m in metas]
        try:
            tmp.mkdir(parents=True)
            writers = {
                s: _create_shard(tmp / f"{s}.h5", s, split_metas[s], settings) for s in SPLITS
            }
            _compute(samples, writers, hist, hist_np, settings, total_bytes)
            for split, writer in writers.items():
                if writer is not None:
                    _verify_written(tmp / f"{split}.h5", split_metas[split], settings)
            # The baselines' statistics, read back from the finished shards (one more pass
            # over them, ~1 % of preprocessing; it works the same for the grouped path).
            write_features(tmp, tmp / FEATURES_FILE, num_workers=settings.num_workers)
        except BaseException:
            for future in hashing:  # fail now, not after hashing every remaining universe
                future.cancel()
            raise
        digests = [future.result() for future in hashing]

        stats = _stats(np.asarray(hist_np), settings, out_dir)
        (tmp / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
        manifest = _manifest(split_metas, metas, digests, settings, seed, config_hash)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")

    seconds = time.perf_counter() - t0
    print(
        f"preprocess: {sum(manifest['counts'].values())} samples from {len(metas)} universes, "
        f"{total_bytes / 1e6:.0f} MB in {seconds:.1f} s ({total_bytes / 1e6 / seconds:.0f} MB/s) "
        f"→ {out_dir}",
        file=sys.stderr,
        flush=True,
    )
    return manifest


def _stats(hist: np.ndarray, settings: PreprocessConfig, out_dir: Path) -> dict[str, Any]:
    """Per-channel mean and std of the training values, from their (C, 65536) count histogram."""
    moments = histogram_moments(hist, value_table(settings.log1p, settings.dtype))
    if not np.all(np.isfinite(moments["mean"])):
        raise PreprocessError(
            f"{out_dir}: training values have non-finite mean {moments['mean'].tolist()} "
            f"(negative counts in a universe?)"
        )
    return {
        "mean": moments["mean"].tolist(),
        "std": moments["std"].tolist(),
        "split": "train",
        "num_values": moments["count"].tolist(),
        # Whether datasets apply mean/std (preprocess.standardize): the shards carry it, so
        # training and evaluation cannot disagree.
        "standardize": settings.standardize,
    }


def _manifest(
    split_metas: dict[str, list[UniverseMeta]],
    metas: list[UniverseMeta],
    digests: list[str],
    settings: PreprocessConfig,
    seed: int,
    config_hash: str,
) -> dict[str, Any]:
    s = settings.sample_size
    per_universe = (metas[0].size // s) ** 3
    return {
        "counts": {name: per_universe * len(ms) for name, ms in split_metas.items()},
        "universes": {name: len(ms) for name, ms in split_metas.items()},
        "sample_shape": [metas[0].num_channels, s, s, s],
        "dtype": settings.dtype,
        "log1p": settings.log1p,
        "standardize": settings.standardize,
        "sample_size": s,
        "slab_depth": settings.slab_depth,
        "universe_size": metas[0].size,
        "seed": seed,
        "split_ratios": settings.splits.as_dict(),
        "config_hash": config_hash,
        "splits": {str(m.path): name for name, ms in split_metas.items() for m in ms},
        "sources": [
            {
                "path": str(m.path),
                "sha256": digest,
                "size": m.path.stat().st_size,
                "universe_size": m.size,
                "unitPar": [float(v) for v in m.unit_par],
            }
            for m, digest in zip(metas, digests, strict=True)
        ],
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }


# --- the same shards from many jobs: plan, crop per group, gather -----------------------------
# The workflow runs these as separate cluster jobs so that ~10,000 universes never meet on one
# command line or in one process. The shards are identical to `preprocess`'s: `plan_shards`
# allocates them in full, each group writes its universes' samples at their final chunk offsets
# (ChunkWriter, no HDF5 locking across processes), and `gather_shards` adds the groups'
# histograms and links the finished files into place.

PLAN_FILE = "plan.json"


class _RowOffset:
    """Store target that writes a group's rows at their place in the whole split's shard."""

    def __init__(self, writer: ChunkWriter, start: int) -> None:
        self.writer, self.start = writer, start

    def __setitem__(self, key: Any, block: np.ndarray) -> None:
        rows = key[0]
        shifted = slice(rows.start + self.start, rows.stop + self.start)
        self.writer[(shifted, *key[1:])] = block


def plan_shards(
    universe_paths: list[Path],
    staging: Path,
    *,
    settings: PreprocessConfig,
    seed: int,
    universes_per_job: int,
) -> dict[str, Any]:
    """Allocate the shards in `staging` and write the plan: which universes each group crops."""
    paths = [Path(p) for p in universe_paths]
    metas = _validate(paths, settings.sample_size)
    by_path = {m.path: m for m in metas}
    assigned = assign_splits(paths, settings.splits.as_dict(), seed)
    per_universe = (metas[0].size // settings.sample_size) ** 3
    place = {
        str(p): {"split": s, "first_sample": i * per_universe}
        for s in SPLITS
        for i, p in enumerate(assigned[s])
    }
    ordered = sorted(str(p) for p in paths)
    groups = [ordered[i : i + universes_per_job] for i in range(0, len(ordered), universes_per_job)]
    staging = Path(staging)
    staging.mkdir(parents=True, exist_ok=True)
    for s in SPLITS:
        _create_shard(staging / f"{s}.h5", s, [by_path[p] for p in assigned[s]], settings)
    plan = {
        "splits": {s: [str(p) for p in assigned[s]] for s in SPLITS},
        "place": place,
        "groups": groups,
        "samples_per_universe": per_universe,
        "seed": seed,
    }
    with atomic_path(staging / PLAN_FILE) as tmp:
        tmp.write_text(json.dumps(plan, indent=1) + "\n")
    return plan


def crop_group(staging: Path, group: int, out: Path, *, settings: PreprocessConfig) -> None:
    """Crop group `group` of the plan into the staged shards; save its histogram and digests."""
    staging = Path(staging)
    plan = json.loads((staging / PLAN_FILE).read_text())
    if not 0 <= group < len(plan["groups"]):
        raise PreprocessError(
            f"{staging / PLAN_FILE}: group {group} does not exist (the plan has "
            f"{len(plan['groups'])})"
        )
    members = [Path(p) for p in plan["groups"][group]]
    metas = [read_universe_meta(p) for p in members]
    crop = _cropper(settings)
    samples: dict[str, da.Array] = {}
    targets: dict[str, Any] = {}
    train_counts = None
    for m in metas:
        where = plan["place"][str(m.path)]
        counts = open_universes([m], sample_size=settings.sample_size)
        key = f"{where['split']}:{m.path}"
        samples[key] = crop(counts).data
        if where["split"] == "train":
            train_counts = (
                counts if train_counts is None else xr.concat([train_counts, counts], "universe")
            )
        s = settings.sample_size
        c = m.num_channels
        writer = ChunkWriter(
            staging / f"{where['split']}.h5",
            chunk_bytes=c * settings.slab_depth * s * s * np.dtype(settings.dtype).itemsize,
        )
        targets[key] = _RowOffset(writer, where["first_sample"])
    channels = metas[0].num_channels
    if train_counts is not None:
        hist = train_histogram(train_counts)
    else:
        hist = da.zeros((channels, 2**16), dtype=np.int64)
    hist_np = np.zeros((channels, 2**16), dtype=np.int64)
    _compute(samples, targets, hist, hist_np, settings, sum(m.nbytes for m in metas))
    digests = [sha256_file(m.path) for m in metas]
    with atomic_path(out) as tmp, open(tmp, "wb") as f:
        np.savez(
            f,
            hist=hist_np,
            paths=np.array([str(m.path) for m in metas]),
            sha256=np.array(digests),
        )


def gather_shards(
    staging: Path,
    group_files: list[Path],
    out_dir: Path,
    *,
    settings: PreprocessConfig,
    config_hash: str,
) -> dict[str, Any]:
    """Statistics from the groups' histograms, the manifest, the shards linked into `out_dir`,
    and their features (`features.h5`)."""
    staging = Path(staging)
    plan = json.loads((staging / PLAN_FILE).read_text())
    hist_total = None
    digest_of: dict[str, str] = {}
    for path in group_files:
        with np.load(path) as part:
            hist_total = part["hist"] if hist_total is None else hist_total + part["hist"]
            digest_of.update(zip(part["paths"].tolist(), part["sha256"].tolist(), strict=True))
    every = [p for s in SPLITS for p in plan["splits"][s]]
    missing = sorted(set(every) - set(digest_of))
    if missing:
        raise PreprocessError(
            f"{staging}: {len(missing)} universe(s) were cropped by no group, e.g. {missing[0]}"
        )
    metas_by_path = {p: read_universe_meta(Path(p)) for p in every}
    metas = [metas_by_path[p] for p in sorted(every)]
    split_metas = {s: [metas_by_path[p] for p in plan["splits"][s]] for s in SPLITS}
    for s in SPLITS:
        if split_metas[s]:  # the groups wrote raw chunks: read some back through HDF5
            _verify_written(staging / f"{s}.h5", split_metas[s], settings)
    stats = _stats(np.asarray(hist_total), settings, Path(out_dir))
    manifest = _manifest(
        split_metas,
        metas,
        [digest_of[str(m.path)] for m in metas],
        settings,
        plan["seed"],
        config_hash,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for s in SPLITS:
        # A hard link, not a move: the staged file stays whole until the workflow drops it, so a
        # gather killed half-way can simply run again.
        with atomic_path(out_dir / f"{s}.h5") as tmp:
            os.link(staging / f"{s}.h5", tmp)
    write_features(staging, out_dir / FEATURES_FILE, num_workers=settings.num_workers)
    for name, content in (("stats.json", stats), ("manifest.json", manifest)):
        with atomic_path(out_dir / name) as tmp:
            tmp.write_text(json.dumps(content, indent=2) + "\n")
    return manifest
