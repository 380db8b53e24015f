"""Per-sample field statistics of the shards, the inputs of the baselines a CNN is judged against.

For every sample of every split: the power spectrum P(k) of each channel in log-spaced |k| bins
up to Nyquist, and one-point statistics of the log1p counts (moments, the empty-voxel share and
PDF quantiles). Dask computes them once, a block of samples per task, after the shards are
written; they are stored beside the shards in `features.h5` (docs/formats.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import dask.array as da
import h5py
import numpy as np

from cosmocub.cosmology.power import binned_power_spectrum, log_k_edges
from cosmocub.data.h5chunks import H5Source
from cosmocub.io import atomic_path

FEATURES_FILE = "features.h5"
SPLITS = ("train", "val", "test")
# Log-spaced |k| bins from the crop's fundamental to its Nyquist frequency; on small crops some
# stay empty (NaN), and the baselines drop those columns.
NUM_K_BINS = 10
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
ONE_POINT_NAMES = ("mean", "std", "skewness", "kurtosis", "empty", *(f"q{q:g}" for q in QUANTILES))
# Samples per Dask task: enough FFTs per task that scheduling costs nothing.
BLOCK_SAMPLES = 16


def counts_power_spectrum(
    counts_dhw: np.ndarray, *, num_bins: int = NUM_K_BINS
) -> tuple[np.ndarray, np.ndarray]:
    """(k, P) of one count field's overdensity δ = n/n̄ − 1, in voxel units (box = side).

    Raw P: no shot-noise subtraction or window correction — for a regression those are a fixed
    transform of each bin, except the shot noise's 1/n̄, which the one-point mean already carries.
    An empty field (n̄ = 0) has P = 0.
    """
    counts = np.asarray(counts_dhw, dtype=np.float64)
    n = counts.shape[0]
    mean = counts.mean()
    delta = counts / mean - 1.0 if mean > 0 else np.zeros_like(counts)
    k, power, _ = binned_power_spectrum(delta, float(n), log_k_edges(n, float(n), num_bins))
    return k, power


def one_point_statistics(log1p_counts: np.ndarray) -> np.ndarray:
    """Moments, the share of empty voxels and the quantiles of one channel's log1p counts."""
    values = np.asarray(log1p_counts, dtype=np.float64).ravel()
    mean = values.mean()
    centred = values - mean
    squared = centred * centred
    m2 = squared.mean()
    if m2 > 0:
        # scipy.stats.skew and .kurtosis (biased, Fisher) from the central moments, written out:
        # scipy's wrappers were half of the features' time and hold the GIL, which left the
        # gather's Dask threads waiting on one another (preprocess-gather at 16 threads).
        skew = (squared * centred).mean() / m2**1.5
        kurt = (squared * squared).mean() / m2**2 - 3.0
    else:  # a constant field has no shape; 0 is its Gaussian-like value
        skew = kurt = 0.0
    return np.array(
        [mean, np.sqrt(m2), skew, kurt, np.mean(values == 0), *np.quantile(values, QUANTILES)]
    )


def sample_features(values_cdhw: np.ndarray, *, log1p: bool) -> tuple[np.ndarray, np.ndarray]:
    """(log10 P(k) per channel and bin, one-point statistics per channel) of one stored sample.

    `values_cdhw` holds what the shard stores: log1p counts if `log1p`, else counts.
    """
    values = np.asarray(values_cdhw, dtype=np.float64)
    counts = np.expm1(values) if log1p else values
    logs = values if log1p else np.log1p(values)
    with np.errstate(divide="ignore"):
        pk = [np.log10(counts_power_spectrum(c)[1]) for c in counts]
    one_point = [one_point_statistics(c) for c in logs]
    return np.concatenate(pk), np.concatenate(one_point)


def _block_features(block: np.ndarray, log1p: bool) -> np.ndarray:
    rows = [np.concatenate(sample_features(sample, log1p=log1p)) for sample in block]
    return np.stack(rows) if rows else np.zeros((0, 0))


def _universe_features(
    block: np.ndarray, origins: np.ndarray, sample_size: int, log1p: bool
) -> np.ndarray:
    # block (1, C, N, N, N): one whole universe; its fixed crops, each contiguous as a crop shard
    # stores it, so that every feature is bit for bit the fixed crop's.
    s = sample_size
    crops = [
        np.ascontiguousarray(block[0, :, d : d + s, h : h + s, w : w + s]) for d, h, w in origins
    ]
    return _block_features(np.stack(crops), log1p)


def shard_features(shard: Path, *, num_workers: int | None = None) -> dict[str, np.ndarray]:
    """Features of every sample of one shard: {"pk": (N, C·bins), "one_point": (N, C·10), "k"}.

    A shard of whole universes (preprocess.train_crops random) gives the features of its fixed
    crops (its rows), the same numbers the shard of crops would give."""
    with h5py.File(shard, "r") as f:
        x = f["x"]
        log1p = bool(f.attrs["log1p"])
        whole = f.attrs.get("crops") == "random"
        # Whole universes: the rows are their fixed crops (y has one per row).
        s = int(f.attrs["sample_size"]) if whole else x.shape[2]
        n, c = f["y"].shape[0] if whole else x.shape[0], x.shape[1]
        k = counts_power_spectrum(np.ones((s, s, s)))[0]
        pk_width, op_width = c * len(k), c * len(ONE_POINT_NAMES)
        if n == 0:
            return {"pk": np.zeros((0, pk_width)), "one_point": np.zeros((0, op_width)), "k": k}
        width = pk_width + op_width
        # Opened per block by path, so the graph pickles to worker processes.
        source = H5Source(shard, "x", x.shape, x.dtype)
        if whole:
            # Rows run universe-major, every universe with the same crops in the same order.
            per_universe = n // x.shape[0]
            universes = da.from_array(source, chunks=(1, *x.shape[1:]))
            feats = universes.map_blocks(
                _universe_features,
                f["crop_origin"][:per_universe],
                s,
                log1p,
                chunks=((per_universe,) * x.shape[0], (width,)),
                drop_axis=[2, 3, 4],
                dtype=np.float64,
            )
        else:
            samples = da.from_array(source, chunks=(BLOCK_SAMPLES, c, s, s, s))
            feats = samples.map_blocks(
                _block_features,
                log1p,
                chunks=(samples.chunks[0], (width,)),
                drop_axis=[2, 3, 4],
                dtype=np.float64,
            )
        # Processes, not threads: the statistics are many small numpy calls, and threads spent
        # the time waiting on the GIL (2 threads 1.6x one; at 16 the gather ran past 200 s on
        # the H200 machine's 16 cores where one thread needs ~60 s).
        feats = feats.compute(
            scheduler="synchronous" if num_workers == 1 else "processes", num_workers=num_workers
        )
    return {"pk": feats[:, :pk_width], "one_point": feats[:, pk_width:], "k": k}


def write_features(shards_dir: Path, out: Path, *, num_workers: int | None = None) -> None:
    """Compute the features of shards_dir/{train,val,test}.h5 into `out` (temp name + rename)."""
    shards_dir = Path(shards_dir)
    per_split = {s: shard_features(shards_dir / f"{s}.h5", num_workers=num_workers) for s in SPLITS}
    with atomic_path(out) as tmp, h5py.File(tmp, "w") as f:
        for split, feats in per_split.items():
            group = f.create_group(split)
            group["pk"] = feats["pk"]
            group["one_point"] = feats["one_point"]
        f["k"] = per_split["train"]["k"]
        f.attrs["one_point_names"] = json.dumps(ONE_POINT_NAMES)
        f.attrs["k_units"] = "radians per voxel"


def read_features(path: Path, split: str) -> dict[str, np.ndarray]:
    """{"pk", "one_point"} of one split from a features file, with a clear error if absent."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: shard features not found (rerun preprocessing, or "
            f"`cosmocub features --shards {path.parent}`)"
        )
    with h5py.File(path, "r") as f:
        if split not in f:
            raise ValueError(f"{path}: no group {split!r} (not a cosmocub features file)")
        return {name: f[split][name][:] for name in ("pk", "one_point")}
