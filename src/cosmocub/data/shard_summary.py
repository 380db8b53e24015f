"""What stands beside the shards: stats.json (the training values' per-channel moments) and
manifest.json (the split, the settings and a checksum of every source),
docs/reference/formats.md."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from cosmocub.config import PreprocessConfig
from cosmocub.data.crop import value_table
from cosmocub.data.splits import PreprocessError
from cosmocub.data.universe import histogram_moments


def shard_stats(hist: np.ndarray, settings: PreprocessConfig, out_dir: Path) -> dict[str, Any]:
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


def shard_manifest(
    splits: dict[str, list[str]],
    sources: list[dict[str, Any]],
    *,
    num_channels: int,
    settings: PreprocessConfig,
    seed: int,
    config_hash: str,
    written_by: dict[str, dict[str, int]] | None = None,
) -> dict[str, Any]:
    """The manifest of shards cut from the universes `splits` lists (each split's paths);
    `sources` describe them (path, sha256, bytes as "size", universe_size, unitPar) in the order
    the manifest lists them. `written_by` (shards written on a Dask cluster): for each
    universe's path, the hosts whose workers wrote its blocks, and how many."""
    s = settings.sample_size
    universe_size = sources[0]["universe_size"]
    per_universe = (universe_size // s) ** 3
    return {
        "counts": {name: per_universe * len(paths) for name, paths in splits.items()},
        "universes": {name: len(paths) for name, paths in splits.items()},
        "sample_shape": [num_channels, s, s, s],
        "dtype": settings.dtype,
        "log1p": settings.log1p,
        "standardize": settings.standardize,
        "sample_size": s,
        # "random": train.h5 holds the training universes whole, cropped at random (sample_size)
        # while training; its counts stay the fixed crops', the samples of one epoch.
        "train_crops": settings.train_crops,
        "slab_depth": settings.slab_depth,
        "universe_size": universe_size,
        "seed": seed,
        "split_ratios": settings.splits.as_dict(),
        "config_hash": config_hash,
        "splits": {path: name for name, paths in splits.items() for path in paths},
        "sources": [
            {
                "path": src["path"],
                "sha256": src["sha256"],
                "size": int(src["size"]),
                "universe_size": int(src["universe_size"]),
                "unitPar": [float(v) for v in src["unitPar"]],
            }
            for src in sources
        ],
        # Only on a cluster: local threads leave the manifest as it always was.
        **({"written_by": written_by} if written_by else {}),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
