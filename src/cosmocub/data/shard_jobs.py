"""The three preprocessing jobs: plan (allocate the shards, group the universes), crop one group
into the shards, gather (statistics, manifest, shards and features into place).

The workflow runs them as separate cluster jobs so that ~10,000 universes never meet on one
command line or in one process; `cosmocub preprocess` runs the same three in one process. Each
group writes its universes' samples at their final chunk offsets of the shards the plan
allocated in full (ChunkWriter, no HDF5 locking across processes), so the shards do not depend on
how the universes are grouped or in which order the groups run.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

from cosmocub.config import PreprocessConfig
from cosmocub.cosmology.parameters import NAME_PAR, phys_from_unit
from cosmocub.data.crop import (
    cropper,
    open_universe_slabs,
    open_universes,
    train_histogram,
    universe_values,
)
from cosmocub.data.dask_compute import compute_into
from cosmocub.data.features import FEATURES_FILE, write_feature_file
from cosmocub.data.group_rows import gathered_features, read_back_rows, rows_of_part
from cosmocub.data.h5chunks import ChunkWriter
from cosmocub.data.mlperf import is_record
from cosmocub.data.mlperf import record_file as source_file
from cosmocub.data.shard_file import (
    RowOffset,
    create_shard,
    keeps_universes,
    shard_writer,
)
from cosmocub.data.shard_summary import shard_manifest, shard_stats
from cosmocub.data.splits import SPLITS, PreprocessError, assign_splits, check_metas
from cosmocub.data.universe import UniverseMeta
from cosmocub.io import atomic_path, sha256_file

PLAN_FILE = "plan.json"


def plan_shards(
    metas: list[UniverseMeta],
    staging: Path,
    *,
    settings: PreprocessConfig,
    seed: int,
    universes_per_job: int,
    fixed: FixedSplits | None = None,
    known_sha256: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Allocate the shards in `staging` and write the plan: which universes each group crops.

    `metas`: the universes' headers (from their groups' manifests in the workflow, or their
    files by hand: `check_universes`); no universe file is opened here. `fixed`: a dataset's
    own splits and groups (the MLPerf folders), in place of the seeded draw and groups of
    `universes_per_job`. `known_sha256`: the checksums the universe groups' manifests already
    hold (made here, or MLPerf files), which the crop jobs then do not compute again."""
    metas = check_metas(metas, settings.sample_size)
    paths = [m.path for m in metas]
    by_path = {m.path: m for m in metas}
    if fixed is not None and settings.train_crops == "random":
        raise PreprocessError(
            "preprocess.train_crops random crops whole universes at random; the MLPerf folders "
            "hold crops of them (universes.source mlperf): use train_crops fixed"
        )
    if fixed is None:
        assigned = assign_splits(paths, settings.splits.as_dict(), seed)
    else:
        assigned = {s: [Path(p) for p in fixed.splits[s]] for s in SPLITS}
    per_universe = (metas[0].size // settings.sample_size) ** 3
    # first_sample: the universe's first row of its shard's `x` (its one row when the shard
    # holds universes whole).
    place = {
        str(p): {
            "split": s,
            "first_sample": i * (1 if keeps_universes(s, settings) else per_universe),
        }
        for s in SPLITS
        for i, p in enumerate(assigned[s])
    }
    if fixed is None:
        ordered = sorted(str(p) for p in paths)
        groups = [
            ordered[i : i + universes_per_job] for i in range(0, len(ordered), universes_per_job)
        ]
    else:
        groups = fixed.groups
    staging = Path(staging)
    staging.mkdir(parents=True, exist_ok=True)
    for s in SPLITS:
        create_shard(staging / f"{s}.h5", s, [by_path[p] for p in assigned[s]], settings)
    plan = {
        "splits": {s: [str(p) for p in assigned[s]] for s in SPLITS},
        "place": place,
        # What the gather's manifest says of each source, so that it opens none of them.
        "universes": {
            str(m.path): {
                "size": m.size,
                "num_channels": m.num_channels,
                "unitPar": m.unit_par.tolist(),
                "redshifts": m.redshifts.tolist(),
                **(
                    {"sha256": known_sha256[str(m.path)]}
                    if known_sha256 and str(m.path) in known_sha256
                    else {}
                ),
            }
            for m in metas
        },
        **({"source_universes": fixed.report} if fixed is not None else {}),
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
    # The headers as the plan holds them: the universes are opened only to read their counts.
    metas = [planned_meta(p, plan["universes"][p]) for p in plan["groups"][group]]
    crop = cropper(settings)
    samples: dict[str, da.Array] = {}
    targets: dict[str, Any] = {}
    universe_of: dict[str, str] = {}  # samples' key → its universe's path
    writers: dict[str, ChunkWriter] = {}  # one per split's shard, shared by its universes
    train_parts = []
    for batch in _batches(metas, plan):
        m = batch[0]
        where = plan["place"][str(m.path)]
        key = f"{where['split']}:{m.path}"
        universe_of[key] = str(m.path)
        whole = keeps_universes(where["split"], settings)
        if whole:
            counts = open_universe_slabs(batch, slab_depth=settings.slab_depth)
            samples[key] = universe_values(
                counts, slab_depth=settings.slab_depth, log1p=settings.log1p, dtype=settings.dtype
            ).data
        else:
            counts = open_universes(batch, sample_size=settings.sample_size)
            samples[key] = crop(counts).data
        if where["split"] not in writers:
            writers[where["split"]] = shard_writer(
                staging / f"{where['split']}.h5", m, settings, whole=whole
            )
        targets[key] = RowOffset(writers[where["split"]], where["first_sample"])
        if where["split"] == "train":
            train_parts.append(counts)
    # One concatenation: one a universe made the group's graph quadratic in its universes.
    train_counts = xr.concat(train_parts, "universe") if train_parts else None
    channels = metas[0].num_channels
    if train_counts is not None:
        hist = train_histogram(train_counts)
    else:
        hist = da.zeros((channels, 2**16), dtype=np.int64)
    hist_np = np.zeros((channels, 2**16), dtype=np.int64)
    # Checksums run beside the Dask work (hashlib releases the GIL), one thread per four Dask
    # threads so hashing (~1.5 GB/s a thread) keeps up; they are not in the graph because
    # dask.compute (2026.8) returns mixed Array/Delayed results out of order.
    with ThreadPoolExecutor(
        max_workers=max(1, (settings.num_workers or os.cpu_count() or 1) // 4),
        thread_name_prefix="sha256",
    ) as hasher:
        # Only where no group manifest holds it: a linked public file is read here anyway.
        known = {p: plan["universes"][p].get("sha256") for p in map(str, (m.path for m in metas))}
        hashing = {
            p: hasher.submit(sha256_file, source_file(p))
            for p, digest in known.items()
            if not digest
        }
        try:
            written = compute_into(
                samples, targets, hist, hist_np, settings, sum(m.nbytes for m in metas)
            )
        except BaseException:
            for future in hashing.values():  # fail now, not after hashing every remaining one
                future.cancel()
            raise
        digests = [known[p] or hashing[p].result() for p in known]
    # The group's own rows, read back through HDF5: checked against their universes and turned
    # into features here, in parallel across groups, so the gather reads no shard.
    own_rows = read_back_rows(staging, plan, metas, settings)
    with atomic_path(out) as tmp, open(tmp, "wb") as f:
        extra = {}
        if written is not None:  # on a Dask cluster: the hosts that wrote each universe's blocks
            by_universe = {universe_of[key]: hosts for key, hosts in written.items()}
            extra["written_by"] = np.array(json.dumps(by_universe))
        np.savez(
            f,
            hist=hist_np,
            paths=np.array([str(m.path) for m in metas]),
            sha256=np.array(digests),
            bytes=np.array([os.stat(source_file(m.path)).st_size for m in metas], dtype=np.int64),
            **own_rows,
            **extra,
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
    and their features (`features.h5`) from the groups' own; returns the manifest. It reads
    only what the plan and the groups wrote about themselves: no universe and no shard."""
    staging = Path(staging)
    plan = json.loads((staging / PLAN_FILE).read_text())
    hist_total = None
    digest_of: dict[str, str] = {}
    bytes_of: dict[str, int] = {}
    written_by: dict[str, dict[str, int]] = {}
    parts = []
    for path in group_files:
        with np.load(path) as part:
            hist_total = part["hist"] if hist_total is None else hist_total + part["hist"]
            digest_of.update(zip(part["paths"].tolist(), part["sha256"].tolist(), strict=True))
            bytes_of.update(zip(part["paths"].tolist(), part["bytes"].tolist(), strict=True))
            if "written_by" in part.files:
                written_by.update(json.loads(part["written_by"].item()))
            parts.append(rows_of_part(part))
    every = [p for s in SPLITS for p in plan["splits"][s]]
    missing = sorted(set(every) - set(digest_of))
    if missing:
        raise PreprocessError(
            f"{staging}: {len(missing)} universe(s) were cropped by no group, e.g. {missing[0]}"
        )
    # The sources as the plan and the groups recorded them: the gather opens none of them.
    sources = [
        {
            "path": p,
            "sha256": digest_of[p],
            "size": bytes_of[p],
            "universe_size": plan["universes"][p]["size"],
            "unitPar": plan["universes"][p]["unitPar"],
        }
        for p in sorted(every)
    ]
    stats = shard_stats(np.asarray(hist_total), settings, Path(out_dir))
    manifest = shard_manifest(
        {s: plan["splits"][s] for s in SPLITS},
        sources,
        num_channels=len(hist_total),
        settings=settings,
        seed=plan["seed"],
        config_hash=config_hash,
        written_by=dict(sorted(written_by.items())) or None,
    )
    if "source_universes" in plan:  # a dataset's own split: the universes its crops came from
        manifest["source_universes"] = plan["source_universes"]
    features = gathered_features(staging, plan, parts, settings)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for s in SPLITS:
        # A hard link, not a move: the staged file stays whole until the workflow drops it, so a
        # gather killed half-way can simply run again.
        with atomic_path(out_dir / f"{s}.h5") as tmp:
            os.link(staging / f"{s}.h5", tmp)
    write_feature_file(out_dir / FEATURES_FILE, features, bispectrum=settings.bispectrum)
    for name, content in (("stats.json", stats), ("manifest.json", manifest)):
        with atomic_path(out_dir / name) as tmp:
            tmp.write_text(json.dumps(content, indent=2) + "\n")
    return manifest


def _batches(metas: list[UniverseMeta], plan: dict[str, Any]) -> list[list[UniverseMeta]]:
    """The group's universes as the Dask graph takes them: one a batch (a cluster's workers
    then say which host wrote each universe), or, for the MLPerf folders' records (thousands
    of small units a group), each split's records in one batch, whose rows are consecutive in
    its shard (a graph a record cost ~60 ms each: 6,400 records, minutes)."""
    if not metas or not is_record(metas[0].path):
        return [[m] for m in metas]
    by_split: dict[str, list[UniverseMeta]] = {}
    for m in metas:
        by_split.setdefault(plan["place"][str(m.path)]["split"], []).append(m)
    return list(by_split.values())


@dataclass(frozen=True, kw_only=True)
class FixedSplits:
    """A dataset's own split of its units (paths), the groups its jobs crop (runs of the units
    in their order, each split's units in that order too), and what the report says of it."""

    splits: dict[str, list[str]]
    groups: list[list[str]]
    report: dict[str, Any]


def planned_meta(path: str, planned: dict[str, Any]) -> UniverseMeta:
    """A universe's header from the plan's record of it."""
    unit_par = np.asarray(planned["unitPar"], dtype=np.float32)
    return UniverseMeta(
        path=Path(path),
        size=int(planned["size"]),
        num_channels=int(planned["num_channels"]),
        unit_par=unit_par,
        phys_par=phys_from_unit(unit_par),
        name_par=NAME_PAR,
        redshifts=np.asarray(planned["redshifts"], dtype=np.float32),
    )


def group_files(staging: Path, groups_dir: Path) -> list[Path]:
    """The `<group>.npz` files in `groups_dir` that the plan in `staging` asks the gather for."""
    plan = json.loads((Path(staging) / PLAN_FILE).read_text())
    return [Path(groups_dir) / f"{g}.npz" for g in range(len(plan["groups"]))]
