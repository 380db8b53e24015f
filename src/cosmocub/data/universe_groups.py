"""The universe jobs, a group at a time: make a group of synthetic (or known-answer) universes, or
validate and link a group of public ones, and write the group's manifest beside them.

The manifest (<universes>/groups/<name>.json, docs/reference/formats.md) is what the workflow's
later jobs read instead of one target per universe: each universe's path, seed, header (size,
channels, parameters, redshifts), bytes and, for a universe made here, its sha256.
Preprocessing plans the shards from the manifests alone, so no job opens 10,000 files to learn
their headers.
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from cosmocub.config import Config
from cosmocub.data import mlperf
from cosmocub.data.naming import (
    group_seeds,
    public_groups,
    seeds_of_group,
    synthetic_id,
    universe_group_names,
)
from cosmocub.data.shard_jobs import FixedSplits
from cosmocub.data.simulate_jobs import simulate_one
from cosmocub.data.splits import SPLITS, PreprocessError
from cosmocub.data.universe import UniverseMeta, read_universe_meta
from cosmocub.io import atomic_path, sha256_file, write_json

log = logging.getLogger(__name__)

GROUPS_DIR = "groups"


def manifest_path(universes_dir: str | os.PathLike, name: str) -> Path:
    """Where the group manifest `name` (naming.universe_group_names) lives."""
    return Path(universes_dir) / GROUPS_DIR / f"{name}.json"


def make_group(
    cfg: Config,
    group: int,
    universes_dir: str | os.PathLike,
    *,
    master_seed: int | None = None,
    workers: int = 1,
) -> tuple[Path, list[dict[str, float]]]:
    """Make group `group` of the config's universes (at `master_seed`, else the config's seed)
    into universes_dir/synth_<seed>.hdf5, `workers` at once, then its manifest; returns the
    manifest's path and each universe's metrics (as `cosmocub simulate` logs them).

    Each universe is renamed into place once whole, and the manifest comes last: a job that
    fails leaves whole universes and no manifest, so the workflow runs the group again."""
    master = cfg.seed if master_seed is None else master_seed
    seeds = seeds_of_group(cfg, group, master_seed=master)
    folder = Path(universes_dir)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{synthetic_id(seed)}.hdf5" for seed in seeds]
    jobs = [
        (path, cfg.universes.size, seed, cfg.simulate, cfg.universes.source)
        for path, seed in zip(paths, seeds, strict=True)
    ]
    if workers > 1 and len(jobs) > 1:
        # Processes: the particle-mesh steps are numpy calls that hold the GIL between FFTs.
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
            metrics = list(pool.map(_simulate_job, jobs))
    else:
        metrics = [_simulate_job(job) for job in jobs]
    entries = []
    for path, seed in zip(paths, seeds, strict=True):
        entry = _entry(read_universe_meta(path))
        # Just written, so in the page cache: the checksum costs no second read from disk.
        entries.append({**entry, "seed": seed, "sha256": sha256_file(path)})
    out = manifest_path(folder, f"seed{master}-{group}")
    _write_manifest(out, source=cfg.universes.source, group=group, universes=entries)
    return out, metrics


def _simulate_job(job: tuple) -> dict[str, float]:
    path, size, seed, settings, source = job
    return simulate_one(path, size=size, seed=seed, settings=settings, source=source)


def link_group(cfg: Config, group: int, universes_dir: str | os.PathLike) -> Path:
    """Validate the headers of group `group` of the public universes (naming.public_groups) and
    symlink each into universes_dir under its own name; then write the group's manifest.

    No checksum here: that needs every byte, and preprocessing reads every byte once anyway
    (its manifest holds each source's sha256, shards/manifest.json)."""
    groups = public_groups(cfg)
    if not 0 <= group < len(groups):
        raise PreprocessError(
            f"link group {group} does not exist: {cfg.universes.cosmoflow_dir} holds "
            f"{sum(map(len, groups))} universes, {len(groups)} groups of "
            f"cluster.preprocess.universes_per_job {cfg.cluster.preprocess.universes_per_job}"
        )
    folder = Path(universes_dir)
    folder.mkdir(parents=True, exist_ok=True)
    source_dir = Path(cfg.universes.cosmoflow_dir or "")
    entries = []
    for stem in groups[group]:
        source = source_dir / f"{stem}.hdf5"
        meta = read_universe_meta(source)  # one line naming the file and the problem
        dest = folder / source.name
        if dest.exists() and not dest.is_symlink():
            # The public folder itself, or a file of the user's: a link must not replace it.
            raise PreprocessError(
                f"{dest}: a file, not a link, stands where {source} would be linked; link the "
                f"universes into a folder of their own (--out), not universes.cosmoflow_dir"
            )
        with atomic_path(dest) as tmp:
            tmp.symlink_to(source.resolve())
        entries.append({**_entry(meta), "path": str(dest), "source": str(source.resolve())})
    out = manifest_path(folder, f"public-{group}")
    _write_manifest(out, source=cfg.universes.source, group=group, universes=entries)
    return out


def _entry(meta: UniverseMeta) -> dict[str, Any]:
    return {
        "path": str(meta.path),
        "size": meta.size,
        "num_channels": meta.num_channels,
        "bytes": meta.path.stat().st_size,
        "unitPar": meta.unit_par.tolist(),
        "physPar": meta.phys_par.tolist(),
        "namePar": list(meta.name_par),
        "redshifts": meta.redshifts.tolist(),
    }


def _write_manifest(out: Path, *, source: str, group: int, universes: list[dict]) -> None:
    write_json(out, {"source": source, "group": group, "universes": universes}, indent=1)
    log.info("universe group %d: %d universes, manifest %s", group, len(universes), out)


def read_group_manifests(
    cfg: Config, universes_dir: str | os.PathLike, *, master_seed: int | None = None
) -> list[list[dict[str, Any]]]:
    """Each of the config's universe groups' manifest entries, in order (no universe file is
    opened). A missing manifest, or one that lists other universes (or MLPerf files) than the
    config's group holds, is a PreprocessError naming it."""
    if cfg.universes.made_here:
        expected = [
            [synthetic_id(seed) for seed in seeds]
            for seeds in group_seeds(cfg, master_seed=master_seed)
        ]
    elif cfg.universes.source == "mlperf":
        root = Path(cfg.universes.mlperf_dir or "")
        expected = [[str(root / f) for f in files] for files in mlperf.file_groups(cfg)]
    else:
        expected = public_groups(cfg)
    groups = []
    names = universe_group_names(cfg, master_seed=master_seed)
    for name, stems in zip(names, expected, strict=True):
        path = manifest_path(universes_dir, name)
        if not path.is_file():
            raise PreprocessError(
                f"{path}: universe group manifest not found (make the group first: "
                f"`cosmocub {_GROUP_COMMAND[cfg.universes.source]}`)"
            )
        try:
            entries = json.loads(path.read_text())["universes"]
            if cfg.universes.source == "mlperf":
                listed = list(dict.fromkeys(mlperf.record_file(e["path"]) for e in entries))
            else:
                listed = [Path(e["path"]).stem for e in entries]
        except (ValueError, KeyError, TypeError) as err:
            raise PreprocessError(f"{path}: not a universe group manifest ({err})") from None
        if listed != stems:
            raise PreprocessError(
                f"{path}: lists {len(listed)} universes ({', '.join(listed[:2])}, ...) where the "
                f"config's group holds {len(stems)} ({', '.join(stems[:2])}, ...): make it again"
            )
        groups.append(entries)
    return groups


_GROUP_COMMAND = {
    "synthetic": "simulate-group",
    "known_answer": "simulate-group",
    "cosmoflow": "link-group",
    "mlperf": "mlperf-group",
}


def read_group_metas(
    cfg: Config, universes_dir: str | os.PathLike, *, master_seed: int | None = None
) -> list[UniverseMeta]:
    """The headers of the config's universes (`read_group_manifests`), in order."""
    return group_metas(read_group_manifests(cfg, universes_dir, master_seed=master_seed))


def group_metas(groups: list[list[dict[str, Any]]]) -> list[UniverseMeta]:
    """The headers of the universes the groups' manifest entries list, in order."""
    return [_meta(e) for entries in groups for e in entries]


def mlperf_group(cfg: Config, group: int, universes_dir: str | os.PathLike) -> Path:
    """Validate group `group` of the MLPerf folders' files (every record read and checked,
    data.mlperf.validate_group) and write its manifest; nothing is linked or copied."""
    entries = mlperf.validate_group(cfg, group)
    out = manifest_path(universes_dir, f"mlperf-{group}")
    _write_manifest(out, source="mlperf", group=group, universes=entries)
    return out


def _meta(entry: dict[str, Any]) -> UniverseMeta:
    return UniverseMeta(
        path=Path(entry["path"]),
        size=int(entry["size"]),
        num_channels=int(entry["num_channels"]),
        unit_par=np.asarray(entry["unitPar"], dtype=np.float32),
        phys_par=np.asarray(entry["physPar"], dtype=np.float32),
        name_par=tuple(entry["namePar"]),
        redshifts=np.asarray(entry["redshifts"], dtype=np.float32),
    )


def mlperf_fixed_splits(groups: list[list[dict[str, Any]]]) -> FixedSplits:
    """The MLPerf folders' split (each record's manifest `split`), the groups as validated, and
    the universes behind the crops: how many, and how many have crops in two splits (a leak
    that flatters every test figure)."""
    order = sorted(
        (e for entries in groups for e in entries), key=lambda e: mlperf.unit_order(e["path"])
    )
    splits: dict[str, list[str]] = {s: [] for s in SPLITS}
    universes: dict[str, set[str]] = {}
    for e in order:
        splits[e["split"]].append(e["path"])
        universes.setdefault(e["universe"], set()).add(e["split"])
    leaked = sorted(u for u, where in universes.items() if len(where) > 1)
    report = {
        "source": "mlperf",
        "universes": {s: sum(s in where for where in universes.values()) for s in SPLITS},
        "universes_in_two_splits": len(leaked),
        "universes_in_two_splits_first": leaked[:5],
    }
    ordered_groups = [
        sorted((e["path"] for e in entries), key=mlperf.unit_order) for entries in groups
    ]
    return FixedSplits(splits=splits, groups=ordered_groups, report=report)
