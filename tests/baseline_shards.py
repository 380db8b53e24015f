"""Small shards for the baselines' tests: crops whose Poisson rate follows the first parameter,
so the ridge fits have signal to find."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

SIZE = 8


def write_split(
    path: Path, rng: np.random.Generator, universes: int, crops: int = 2, *, interleaved=False
) -> None:
    """`crops` crops of side SIZE per universe, two channels; universe u is source_files[u].
    Rows are grouped by universe, or with `interleaved` crop-major (universe 0, 1, … then
    again), so that "the first N universes" is not "the first rows"."""
    y_u = rng.uniform(-1, 1, size=(universes, 4)).astype(np.float32)
    universe_of = np.arange(universes)
    universe_of = np.tile(universe_of, crops) if interleaved else np.repeat(universe_of, crops)
    y = y_u[universe_of]
    rate = 3.0 + 2.0 * y[:, 0]
    x = rng.poisson(rate[:, None, None, None, None], size=(len(y), 2, SIZE, SIZE, SIZE))
    with h5py.File(path, "w") as f:
        f["x"] = np.log1p(x).astype(np.float16)
        f["y"] = y
        f["universe_index"] = universe_of.astype(np.int32)
        f.attrs["log1p"] = True
        f.attrs["source_files"] = json.dumps([f"u{k}.hdf5" for k in range(universes)])


def write_shards(
    folder: Path, sizes: dict[str, int], *, seed: int = 0, bispectrum: bool = False
) -> Path:
    """train/val/test shards of `sizes` universes each in `folder`, and their features.h5."""
    from cosmocub.data.features import FEATURES_FILE, write_features

    rng = np.random.default_rng(seed)
    for split, n in sizes.items():
        write_split(folder / f"{split}.h5", rng, n)
    write_features(folder, folder / FEATURES_FILE, num_workers=1, bispectrum=bispectrum)
    return folder
