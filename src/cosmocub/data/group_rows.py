"""A preprocess group's own rows of each shard: read back through HDF5 once the group has written
them, checked against their universes, and turned into their features; and the gather's
assembly of every group's features into the shards' (docs/reference/formats.md, "Shards").

Both passes over the written data run in the group jobs, in parallel on a cluster; the gather
puts small arrays side by side and reads no shard.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cosmocub.config import PreprocessConfig
from cosmocub.data.features import FEATURE_SETS, shard_features
from cosmocub.data.shard_file import keeps_universes, verify_written
from cosmocub.data.splits import SPLITS, PreprocessError
from cosmocub.data.universe import UniverseMeta


def read_back_rows(
    staging: Path, plan: dict[str, Any], metas: list[UniverseMeta], settings: PreprocessConfig
) -> dict[str, np.ndarray]:
    """Check and describe the rows the group of `metas` wrote into each staged shard; returns
    the arrays its group file holds: per split `rows_<split>` (its first and end row, in rows
    of `y`) and `features_<split>_<set>`."""
    per_universe = plan["samples_per_universe"]
    out: dict[str, np.ndarray] = {}
    for split in SPLITS:
        whole = keeps_universes(split, settings)
        # The universe index of each of the group's universes in this split's shard.
        index_of = {
            plan["place"][str(m.path)]["first_sample"] // (1 if whole else per_universe): m
            for m in metas
            if plan["place"][str(m.path)]["split"] == split
        }
        if not index_of:
            continue
        first, last = min(index_of), max(index_of)
        # A group is a run of sorted paths, and each split lists its universes sorted: so a
        # group's universes of one split sit side by side in its shard.
        assert len(index_of) == last - first + 1, "a group's universes are not contiguous"
        rows = (first * per_universe, (last + 1) * per_universe)
        shard = Path(staging) / f"{split}.h5"
        verify_written(shard, index_of, settings, rows=rows)
        x_rows = (first, last + 1) if whole else rows
        feats = shard_features(
            shard, num_workers=settings.num_workers, bispectrum=settings.bispectrum, x_rows=x_rows
        )
        out[f"rows_{split}"] = np.array(rows, dtype=np.int64)
        for name in FEATURE_SETS:
            if name in feats:
                out[f"features_{split}_{name}"] = feats[name]
    return out


def rows_of_part(part: Any) -> dict[str, tuple[int, dict[str, np.ndarray]]]:
    """A loaded group file's rows by split: (first row, features by set)."""
    out = {}
    for split in SPLITS:
        if f"rows_{split}" in part.files:
            prefix = f"features_{split}_"
            feats = {k[len(prefix) :]: part[k] for k in part.files if k.startswith(prefix)}
            out[split] = (int(part[f"rows_{split}"][0]), feats)
    return out


def gathered_features(
    staging: Path,
    plan: dict[str, Any],
    parts: list[dict[str, tuple[int, dict[str, np.ndarray]]]],
    settings: PreprocessConfig,
) -> dict[str, dict[str, np.ndarray]]:
    """Each split's features (as `shard_features` gives them) from the groups' rows, in row
    order; a row that no group, or two groups, computed is a PreprocessError."""
    out = {}
    for split in SPLITS:
        # No rows asked: only the widths and k of this shard, read from its attributes.
        empty = shard_features(
            Path(staging) / f"{split}.h5", bispectrum=settings.bispectrum, x_rows=(0, 0)
        )
        pieces = sorted((p[split] for p in parts if split in p), key=lambda piece: piece[0])
        expected = plan["samples_per_universe"] * len(plan["splits"][split])
        row = 0
        for start, feats in pieces:
            if start != row:
                raise PreprocessError(
                    f"{staging}: the groups' features of {split} start at row {start} where row "
                    f"{row} is next ({expected} rows in all): a group file is missing or stale"
                )
            row += len(feats["pk"])
        if row != expected:
            raise PreprocessError(
                f"{staging}: the groups' features of {split} cover {row} of {expected} rows"
            )
        out[split] = {
            name: np.concatenate([empty[name], *(feats[name] for _, feats in pieces)])
            if name != "k"
            else empty["k"]
            for name in empty
        }
    return out
