"""`cosmocub preprocess` by hand: the workflow's plan → every group → gather, in one process.

The shard folder it writes (shards, stats.json, manifest.json, features.h5;
docs/reference/formats.md,
"Shards") is byte for byte the one the workflow's jobs write from the same config.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

from cosmocub.config import PreprocessConfig
from cosmocub.data.shard_jobs import crop_group, gather_shards, plan_shards
from cosmocub.data.splits import check_universes
from cosmocub.io import atomic_path

# The jobs' staging folder and group files, inside the temporary shard folder: on the same
# filesystem (gather hard-links the shards from it) and gone with it if the run fails.
JOBS_DIR = ".jobs"


def preprocess(
    universe_paths: list[Path],
    out_dir: Path,
    *,
    settings: PreprocessConfig,
    seed: int,
    config_hash: str,
    universes_per_job: int,
) -> dict[str, Any]:
    """Write the shard folder `out_dir` (atomically, as a whole) and return its manifest.

    The universes are cropped `universes_per_job` at a time, one group after another, as the
    workflow's group jobs would crop them."""
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    with atomic_path(out_dir) as tmp:
        staging, groups_dir = tmp / JOBS_DIR / "staging", tmp / JOBS_DIR / "groups"
        plan = plan_shards(
            check_universes([Path(p) for p in universe_paths], settings.sample_size),
            staging,
            settings=settings,
            seed=seed,
            universes_per_job=universes_per_job,
        )
        group_files = [groups_dir / f"{g}.npz" for g in range(len(plan["groups"]))]
        for g, group_file in enumerate(group_files):
            crop_group(staging, g, group_file, settings=settings)
        manifest = gather_shards(
            staging, group_files, tmp, settings=settings, config_hash=config_hash
        )
        shutil.rmtree(tmp / JOBS_DIR)  # the shards keep their data through the hard links

    seconds = time.perf_counter() - t0
    # The universes' int16 counts, in MB: every universe has the first one's size and channels.
    channels, size = manifest["sample_shape"][0], manifest["universe_size"]
    total_bytes = len(manifest["sources"]) * size**3 * channels * 2
    print(
        f"preprocess: {sum(manifest['counts'].values())} samples from "
        f"{len(manifest['sources'])} universes, {total_bytes / 1e6:.0f} MB in {seconds:.1f} s "
        f"({total_bytes / 1e6 / seconds:.0f} MB/s) → {out_dir}",
        file=sys.stderr,
        flush=True,
    )
    return manifest
