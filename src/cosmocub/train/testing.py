"""Tiny random shard folders in the docs/formats.md layout, for tests and benchmarks.

The targets depend on the inputs (a fixed random projection of per-channel means), so a model
can fit them; nothing here is physics.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np


def make_random_shards(
    folder: str | os.PathLike,
    *,
    counts: dict[str, int],
    size: int,
    channels: int = 4,
    slab_depth: int | None = None,
    dtype: str = "float16",
    seed: int = 0,
) -> Path:
    """Write `<split>.h5` for each split in `counts` and stats.json; returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    slab_depth = slab_depth or size
    projection = rng.normal(size=(channels, 4)).astype(np.float32)
    stored = {}
    for split, n in counts.items():
        x = np.log1p(rng.poisson(1.0, size=(n, channels, size, size, size))).astype(np.float32)
        # Targets in [-1, 1) that the per-channel means determine (so they are learnable).
        means = x.mean(axis=(2, 3, 4))  # (n, C)
        y = np.tanh(8.0 * (means - means.mean(0)) @ projection).astype(np.float32)
        with h5py.File(folder / f"{split}.h5", "w") as f:
            f.create_dataset(
                "x", data=x.astype(dtype), chunks=(1, channels, slab_depth, size, size)
            )
            f.create_dataset("y", data=y)
            f.create_dataset("universe_index", data=np.zeros(n, dtype=np.int32))
            f.create_dataset("crop_origin", data=np.zeros((n, 3), dtype=np.int32))
            f.attrs.update(
                source_files=json.dumps([]),
                split=split,
                log1p=True,
                sample_size=size,
                slab_depth=slab_depth,
            )
        stored[split] = x
    reference = stored.get("train", next(iter(stored.values())))
    stats = {
        "mean": reference.mean(axis=(0, 2, 3, 4)).tolist(),
        "std": reference.std(axis=(0, 2, 3, 4)).tolist(),
        "split": "train",
    }
    (folder / "stats.json").write_text(json.dumps(stats))
    return folder
