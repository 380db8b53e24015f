"""What the known-answer study's own fits read from a point's shards: the stored whole boxes'
counts (back from log1p), a split's labels and universe index, and per-universe means of
per-row errors in the order of the evaluation's predictions.npz. Shared by the bispectrum fits
of case (c) (known_answer_bispectrum) and case (a)'s floor (known_answer_likelihood)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np


def open_log1p_counts(shard: Path, reader: str) -> tuple[h5py.File, h5py.Dataset]:
    """The open shard and its `x` (N, C, D, H, W) of log1p counts, a whole box a row; a
    one-line ValueError naming `reader` (what needs them) for a shard stored otherwise."""
    f = h5py.File(shard, "r")
    if not f.attrs.get("log1p", False) or f.attrs.get("crops") == "random":
        f.close()
        raise ValueError(
            f"{shard}: {reader} reads the stored samples' log1p counts, a sample a row "
            "(preprocess.log1p true, fixed crops)"
        )
    return f, f["x"]


def counts(log1p_values: np.ndarray) -> np.ndarray:
    """The integer counts behind stored log1p values (float64)."""
    return np.rint(np.expm1(np.asarray(log1p_values, dtype=np.float64)))


def split_labels(shard: Path) -> tuple[np.ndarray, np.ndarray]:
    """(unitPar labels (N, 4) as float64, each row's universe index) of a split's shard."""
    with h5py.File(shard, "r") as f:
        y = f["y"][:].astype(np.float64)
        where = f["universe_index"][:] if "universe_index" in f else np.arange(len(y))
    return y, where


def per_universe(errors: np.ndarray, universe_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted universes, the mean of `errors` over each universe's rows)."""
    universes, inverse = np.unique(universe_index, return_inverse=True)
    sums = np.bincount(inverse, weights=errors, minlength=len(universes))
    return universes, sums / np.bincount(inverse, minlength=len(universes))
