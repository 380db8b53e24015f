"""Per-sample field statistics of the shards, the inputs of the baselines a CNN is judged against.

For every sample of every split: the power spectrum P(k) of each channel in log-spaced |k| bins
up to Nyquist, that of its log1p counts (the log-density spectrum, which keeps information the
nonlinear field's P(k) loses: Neyrinck, Szapudi & Szalay 2009), one-point statistics of the
log1p counts (moments, the empty-voxel share and PDF quantiles) and, where
preprocess.bispectrum asks, band-averaged bispectra. Each preprocess group computes those of its
own samples once it has written them (Dask, a block of samples per task), and the gather puts
them together beside the shards in `features.h5` (docs/reference/formats.md).
"""

from __future__ import annotations

import itertools
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
# Log-spaced |k| bands of the bispectrum statistics (preprocess.bispectrum).
NUM_B_BANDS = 4
# The datasets of each split's group in features.h5, in their column order within a row
# ("bispectrum" only where asked for; files written before "log_pk" existed lack it).
FEATURE_SETS = ("pk", "log_pk", "one_point", "bispectrum")
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
    delta = _count_overdensity(counts_dhw)
    n = delta.shape[0]
    k, power, _ = binned_power_spectrum(delta, float(n), log_k_edges(n, float(n), num_bins))
    return k, power


def log_power_spectrum(log1p_dhw: np.ndarray, *, num_bins: int = NUM_K_BINS) -> np.ndarray:
    """P(k) of one channel's log1p counts less their mean, in the bins of
    `counts_power_spectrum`: the log-density spectrum. A log maps the nonlinear field's long
    tail back towards a Gaussian, so its P(k) carries information that the counts' P(k) spreads
    into higher-order statistics (on the synthetic whole boxes a ridge on it and the counts'
    P(k) and one-point statistics reaches Ω_m's per-universe error 0.111, where without it
    0.157: docs/explanation/known_answer.md)."""
    logs = np.asarray(log1p_dhw, dtype=np.float64)
    n = logs.shape[0]
    edges = log_k_edges(n, float(n), num_bins)
    return binned_power_spectrum(logs - logs.mean(), float(n), edges)[1]


def _count_overdensity(counts_dhw: np.ndarray) -> np.ndarray:
    # δ = n/n̄ − 1 in float64; 0 for an empty field (n̄ = 0).
    counts = np.asarray(counts_dhw, dtype=np.float64)
    mean = counts.mean()
    return counts / mean - 1.0 if mean > 0 else np.zeros_like(counts)


def bispectrum_statistics(
    counts_dhw: np.ndarray,
    *,
    num_bands: int = NUM_B_BANDS,
    modes_left_out: np.ndarray | None = None,
) -> np.ndarray:
    """Band-averaged bispectrum of one count field's overdensity: per triple of log-spaced |k|
    bands (i ≤ j ≤ l) that closes a triangle, ⟨δ_i·δ_j·δ_l⟩ / (⟨δ_i²⟩⟨δ_j²⟩⟨δ_l²⟩)^½, with δ_i
    the field filtered to band i (FFTs; equilateral triples i = j = l, squeezed ones i < j = l).

    A field with no power in a band gives 0 there (a constant field has no shape).
    `modes_left_out` (a boolean mask on the rfftn grid): modes no band takes (for probes of where
    a statistic sits: benchmarks/bispectrum_subsets.py, removed; last at 040e681,
    docs/explanation/benchmarks.md); None for the feature.
    """
    delta = _count_overdensity(counts_dhw)
    n = delta.shape[0]
    delta_k = np.fft.rfftn(delta)
    edges = log_k_edges(n, float(n), num_bands)
    k = k_magnitude(n)
    kept = np.ones(k.shape, dtype=bool) if modes_left_out is None else ~modes_left_out
    bands = [
        np.fft.irfftn(
            np.where((k >= lo) & (k < hi) & kept, delta_k, 0.0), s=delta.shape, axes=(0, 1, 2)
        )
        for lo, hi in itertools.pairwise(edges)
    ]
    power = [float(np.mean(b * b)) for b in bands]
    out = []
    for a, b, c in bispectrum_triples(num_bands):
        norm = np.sqrt(power[a] * power[b] * power[c])
        out.append(float(np.mean(bands[a] * bands[b] * bands[c])) / norm if norm > 0 else 0.0)
    return np.array(out)


def bispectrum_triples(num_bands: int = NUM_B_BANDS) -> list[tuple[int, int, int]]:
    """Band triples i ≤ j ≤ l whose modes can close a triangle (band l's lower edge below the
    sum of bands i and j's upper edges), in a fixed order; the edges' ratios do not depend on n."""
    edges = log_k_edges(64, 64.0, num_bands)
    return [
        (a, b, c)
        for a in range(num_bands)
        for b in range(a, num_bands)
        for c in range(b, num_bands)
        if edges[c] < edges[a + 1] + edges[b + 1]
    ]


def axis_nyquist_modes(n: int) -> np.ndarray:
    """Boolean mask on the rfftn grid of an n³ cube: the modes at |k| = π, which on an even grid
    are the three real-valued axis modes (n/2, 0, 0) and its two turns, none on an odd one. On
    the known-answer phase fields a third of the band bispectrum's f_nl sits in them
    (docs/explanation/known_answer.md, case (c))."""
    return np.isclose(k_magnitude(n), np.pi)


def k_magnitude(n: int) -> np.ndarray:
    """|k| in radians per voxel on the rfftn grid of an n³ cube: (n, n, n//2 + 1)."""
    k1 = 2.0 * np.pi * np.fft.fftfreq(n)
    kz = 2.0 * np.pi * np.fft.rfftfreq(n)
    return np.sqrt(k1[:, None, None] ** 2 + k1[None, :, None] ** 2 + kz[None, None, :] ** 2)


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


def sample_features(
    values_cdhw: np.ndarray, *, log1p: bool, bispectrum: bool = False
) -> dict[str, np.ndarray]:
    """The statistics of one stored sample by feature set, in FEATURE_SETS order: "pk" log10
    P(k) per channel and bin, "log_pk" log10 of its log1p counts' P(k), "one_point" the
    one-point statistics per channel, and with `bispectrum` "bispectrum" per channel and triple.

    `values_cdhw` holds what the shard stores: log1p counts if `log1p`, else counts.
    """
    values = np.asarray(values_cdhw, dtype=np.float64)
    counts = np.expm1(values) if log1p else values
    logs = values if log1p else np.log1p(values)
    with np.errstate(divide="ignore"):
        out = {
            "pk": np.concatenate([np.log10(counts_power_spectrum(c)[1]) for c in counts]),
            "log_pk": np.concatenate([np.log10(log_power_spectrum(c)) for c in logs]),
        }
    out["one_point"] = np.concatenate([one_point_statistics(c) for c in logs])
    if bispectrum:
        out["bispectrum"] = np.concatenate([bispectrum_statistics(c) for c in counts])
    return out


def _block_features(block: np.ndarray, log1p: bool, bispectrum: bool = False) -> np.ndarray:
    rows = [
        np.concatenate(list(sample_features(s, log1p=log1p, bispectrum=bispectrum).values()))
        for s in block
    ]
    return np.stack(rows) if rows else np.zeros((0, 0))


def _universe_features(
    block: np.ndarray, origins: np.ndarray, sample_size: int, log1p: bool, bispectrum: bool
) -> np.ndarray:
    # block (1, C, N, N, N): one whole universe; its fixed crops, each contiguous as a crop shard
    # stores it, so that every feature is bit for bit the fixed crop's.
    s = sample_size
    crops = [
        np.ascontiguousarray(block[0, :, d : d + s, h : h + s, w : w + s]) for d, h, w in origins
    ]
    return _block_features(np.stack(crops), log1p, bispectrum)


def shard_features(
    shard: Path,
    *,
    num_workers: int | None = None,
    bispectrum: bool = False,
    x_rows: tuple[int, int] | None = None,
) -> dict[str, np.ndarray]:
    """Features of every sample of one shard: {"pk": (N, C·bins), "log_pk": (N, C·bins),
    "one_point": (N, C·10), "k"} and with `bispectrum` "bispectrum": (N, C·triples); with
    `x_rows` (start, stop), those of the samples in rows start:stop of the shard's `x` only (a
    preprocess group's own rows).

    A shard of whole universes (preprocess.train_crops random) gives the features of its fixed
    crops (its rows), the same numbers the shard of crops would give. Each sample's features are
    computed alone, so they do not depend on which rows are asked for together."""
    with h5py.File(shard, "r") as f:
        x = f["x"]
        log1p = bool(f.attrs["log1p"])
        whole = f.attrs.get("crops") == "random"
        # Whole universes: the rows are their fixed crops (y has one per row).
        s = int(f.attrs["sample_size"]) if whole else x.shape[2]
        n, c = f["y"].shape[0] if whole else x.shape[0], x.shape[1]
        start, stop = (0, x.shape[0]) if x_rows is None else x_rows
        k = counts_power_spectrum(np.ones((s, s, s)))[0]
        pk_width, op_width = c * len(k), c * len(ONE_POINT_NAMES)
        bs_width = c * len(bispectrum_triples()) if bispectrum else 0
        width = 2 * pk_width + op_width + bs_width
        if n == 0 or stop <= start:
            return _split_columns(np.zeros((0, width)), k, pk_width, c)
        # Opened per block by path, so the graph pickles to worker processes.
        source = H5Source(shard, "x", x.shape, x.dtype)
        if whole:
            # Rows run universe-major, every universe with the same crops in the same order.
            per_universe = n // x.shape[0]
            universes = da.from_array(source, chunks=(1, *x.shape[1:]))[start:stop]
            feats = universes.map_blocks(
                _universe_features,
                f["crop_origin"][:per_universe],
                s,
                log1p,
                bispectrum,
                chunks=((per_universe,) * (stop - start), (width,)),
                drop_axis=[2, 3, 4],
                dtype=np.float64,
            )
        else:
            samples = da.from_array(source, chunks=(BLOCK_SAMPLES, c, s, s, s))[start:stop]
            feats = samples.map_blocks(
                _block_features,
                log1p,
                bispectrum,
                chunks=(samples.chunks[0], (width,)),
                drop_axis=[2, 3, 4],
                dtype=np.float64,
            )
        # Processes, not threads: the statistics are many small numpy calls, and threads spent
        # the time waiting on the GIL (2 threads 1.6x one; at 16 the gather ran past 200 s on
        # the H200 machine's 16 cores where one thread needs ~60 s). One block needs none: a
        # small group would wait longer for the processes to start than for its numbers.
        one_block = len(feats.chunks[0]) == 1
        feats = feats.compute(
            scheduler="synchronous" if num_workers == 1 or one_block else "processes",
            num_workers=num_workers,
        )
    return _split_columns(feats, k, pk_width, c)


def _split_columns(
    feats: np.ndarray, k: np.ndarray, pk_width: int, channels: int
) -> dict[str, np.ndarray]:
    # Columns in FEATURE_SETS order: pk, log_pk (as wide), one_point, then any bispectrum.
    op_end = 2 * pk_width + channels * len(ONE_POINT_NAMES)
    out = {
        "pk": feats[:, :pk_width],
        "log_pk": feats[:, pk_width : 2 * pk_width],
        "one_point": feats[:, 2 * pk_width : op_end],
        "k": k,
    }
    if feats.shape[1] > op_end:
        out["bispectrum"] = feats[:, op_end:]
    return out


def write_features(
    shards_dir: Path, out: Path, *, num_workers: int | None = None, bispectrum: bool = False
) -> None:
    """Compute the features of shards_dir/{train,val,test}.h5 into `out` (temp name + rename)."""
    shards_dir = Path(shards_dir)
    per_split = {
        s: shard_features(shards_dir / f"{s}.h5", num_workers=num_workers, bispectrum=bispectrum)
        for s in SPLITS
    }
    write_feature_file(out, per_split, bispectrum=bispectrum)


def write_feature_file(
    out: Path, per_split: dict[str, dict[str, np.ndarray]], *, bispectrum: bool
) -> None:
    """`features.h5` from each split's `shard_features` (temp name + rename)."""
    with atomic_path(out) as tmp, h5py.File(tmp, "w") as f:
        for split, feats in per_split.items():
            group = f.create_group(split)
            for name in FEATURE_SETS:
                if name in feats:
                    group[name] = feats[name]
        f["k"] = per_split["train"]["k"]
        f.attrs["one_point_names"] = json.dumps(ONE_POINT_NAMES)
        f.attrs["k_units"] = "radians per voxel"
        if bispectrum:
            f.attrs["bispectrum_triples"] = json.dumps(bispectrum_triples())


def read_features(path: Path, split: str) -> dict[str, np.ndarray]:
    """{"pk", "log_pk", "one_point"} of one split from a features file, and "bispectrum" where
    the file has it (preprocess.bispectrum), with a clear error if the file is absent. A file
    written before "log_pk" existed gives the sets it has."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: shard features not found (rerun preprocessing, or "
            f"`cosmocub features --shards {path.parent}`)"
        )
    with h5py.File(path, "r") as f:
        if split not in f:
            raise ValueError(f"{path}: no group {split!r} (not a cosmocub features file)")
        return {name: f[split][name][:] for name in FEATURE_SETS if name in f[split]}
