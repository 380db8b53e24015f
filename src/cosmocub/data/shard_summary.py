"""What stands beside the shards: stats.json (the training values' per-channel moments) and
manifest.json (the split, the settings and a checksum of every source), docs/formats.md."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from cosmocub.config import PreprocessConfig
from cosmocub.data.crop import value_table
from cosmocub.data.splits import PreprocessError
from cosmocub.data.universe import UniverseMeta, histogram_moments


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
    split_metas: dict[str, list[UniverseMeta]],
    metas: list[UniverseMeta],
    digests: list[str],
    settings: PreprocessConfig,
    seed: int,
    config_hash: str,
    *,
    written_by: dict[str, dict[str, int]] | None = None,
) -> dict[str, Any]:
    """The manifest of shards cut from `split_metas`; `metas` (with their sha256 `digests`) are
    the sources in the order the manifest lists them. `written_by` (shards written on a Dask
    cluster): for each universe's path, the hosts whose workers wrote its blocks, and how many."""
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
        # "random": train.h5 holds the training universes whole, cropped at random (sample_size)
        # while training; its counts stay the fixed crops', the samples of one epoch.
        "train_crops": settings.train_crops,
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
        # Only on a cluster: local threads leave the manifest as it always was.
        **({"written_by": written_by} if written_by else {}),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
