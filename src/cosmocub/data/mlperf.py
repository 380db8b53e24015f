"""The MLPerf HPC CosmoFlow TFRecord folders as a source (universes.source mlperf): the layout
(train/, validation/ and test/ if present), the groups of files a job validates, each record as a
lazily read sample, and the groups' manifests (docs/reference/formats.md, "Universe groups").

A record plays the part a universe plays for the HDF5 sources: a cube of int16 counts with its
unitPar, cut into preprocess.sample_size crops. Its unit path is the file's, or `<file>@<k>` for
record k of a file that holds several. Units sort by the universe their file name carries, then
by crop (`univ_ics_2019-03_a10018182_006`: universe a10018182, crop 6), so that the shards run
universe-major as every other source's do.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from cosmocub.config import Config, ConfigError
from cosmocub.cosmology.parameters import NAME_PAR, REDSHIFTS, phys_from_unit
from cosmocub.data.tfrecord import TFRecordError, decode_sample, read_records

# The dataset's folders and the split each becomes.
FOLDERS = {"train": "train", "validation": "val", "test": "test"}
_CROP_NAME = re.compile(r"^(?P<universe>.+)_(?P<crop>\d+)$")
_RECORD = re.compile(r"^(?P<file>.+\.tfrecord)@(?P<record>\d+)$")


def universe_and_crop(path: str | os.PathLike) -> tuple[str, int]:
    """(universe, crop) from a file name such as univ_ics_2019-03_a10018182_006.tfrecord
    ("univ_ics_2019-03_a10018182", 6); a name without a crop is a universe of its own."""
    stem = Path(record_file(path)).name.split(".tfrecord")[0]
    match = _CROP_NAME.match(stem)
    return (match["universe"], int(match["crop"])) if match else (stem, 0)


def record_file(path: str | os.PathLike) -> str:
    """The file of a unit path (`<file>@<k>` or the file itself)."""
    match = _RECORD.match(str(path))
    return match["file"] if match else str(path)


def record_index(path: str | os.PathLike) -> int:
    match = _RECORD.match(str(path))
    return int(match["record"]) if match else 0


def is_record(path: str | os.PathLike) -> bool:
    return record_file(path).endswith(".tfrecord")


def unit_order(path: str | os.PathLike) -> tuple[str, int, int]:
    """Sort key of a unit: universe, crop, record in its file."""
    return (*universe_and_crop(path), record_index(path))


@functools.cache
def _listing(mlperf_dir: str) -> dict[str, tuple[str, ...]]:
    """Each present folder's .tfrecord file names, sorted (one scandir each: 590k names in ~1 s)."""
    root = Path(mlperf_dir)
    if not root.is_dir():
        raise ConfigError(f"key 'universes.mlperf_dir': {root} is not a folder")
    out = {}
    for folder in FOLDERS:
        path = root / folder
        if not path.is_dir():
            if folder == "test":
                continue
            raise ConfigError(
                f"key 'universes.mlperf_dir': {root} has no {folder}/ folder (the MLPerf HPC "
                f"layout holds train/ and validation/, and test/ where present)"
            )
        with os.scandir(path) as entries:
            names = sorted(e.name for e in entries if e.name.endswith(".tfrecord"))
        if not names:
            raise ConfigError(f"key 'universes.mlperf_dir': {path} holds no .tfrecord files")
        out[folder] = tuple(names)
    return out


def split_of_files(cfg: Config) -> dict[str, str]:
    """Each file's split (its path relative to universes.mlperf_dir → train, val or test). The
    dataset's folders are kept; without test/, the validation folder's universes are shared
    out between val and test, half each (a seeded draw by universe, never a universe in both)."""
    return _split_of_files(str(cfg.universes.mlperf_dir), cfg.seed)


@functools.cache
def _split_of_files(mlperf_dir: str, seed: int) -> dict[str, str]:
    # Cached: the workflow asks at parse time for every group's files (590k names).
    listing = _listing(mlperf_dir)
    split = {
        f"{folder}/{name}": FOLDERS[folder] for folder, names in listing.items() for name in names
    }
    if "test" not in listing:
        universes = sorted({universe_and_crop(n)[0] for n in listing["validation"]})
        order = np.random.default_rng(seed).permutation(len(universes))
        to_test = {universes[i] for i in order[: len(universes) // 2]}
        for name in listing["validation"]:
            if universe_and_crop(name)[0] in to_test:
                split[f"validation/{name}"] = "test"
    return split


def file_groups(cfg: Config) -> list[list[str]]:
    """The files (relative paths) of each validation job, cluster.preprocess.files_per_job to a
    group, in unit order across the folders: the groups preprocessing crops too."""
    return _file_groups(
        str(cfg.universes.mlperf_dir), cfg.seed, cfg.cluster.preprocess.files_per_job
    )


@functools.cache
def _file_groups(mlperf_dir: str, seed: int, per_job: int) -> list[list[str]]:
    files = sorted(_split_of_files(mlperf_dir, seed), key=unit_order)
    return [files[i : i + per_job] for i in range(0, len(files), per_job)]


def validate_group(cfg: Config, group: int) -> list[dict[str, Any]]:
    """Read every file of group `group` once: its sha256, each record's CRCs, `x` (a cube of
    int16 counts, one side for the whole dataset) and `y` (4 finite unitPar in [-1, 1]);
    returns the manifest's entries, one per record. The first bad file or record raises a
    TFRecordError naming both."""
    groups = file_groups(cfg)
    if not 0 <= group < len(groups):
        raise ConfigError(
            f"mlperf group {group} does not exist: {cfg.universes.mlperf_dir} makes "
            f"{len(groups)} groups of cluster.preprocess.files_per_job "
            f"{cfg.cluster.preprocess.files_per_job}"
        )
    root = Path(cfg.universes.mlperf_dir or "")
    split = split_of_files(cfg)
    entries = []
    for relative in groups[group]:
        path = root / relative
        raw = path.read_bytes()
        records = list(file_payloads(path, raw))
        universe, crop = universe_and_crop(relative)
        for k, payload in enumerate(records):
            x, y = decode_sample(path, k, payload)
            unit = str(path) if len(records) == 1 else f"{path}@{k}"
            entries.append(
                {
                    "path": unit,
                    "split": split[relative],
                    "universe": universe,
                    "crop": crop,
                    "size": int(x.shape[0]),
                    "num_channels": int(x.shape[3]),
                    "bytes": len(raw),
                    "sha256": hashlib.sha256(raw).hexdigest(),
                    "unitPar": y.tolist(),
                    "physPar": phys_from_unit(y).tolist(),
                    "namePar": list(NAME_PAR),
                    "redshifts": list(REDSHIFTS),
                }
            )
    return entries


def file_payloads(path: Path, raw: bytes):
    """The records of one file's bytes: GZIP (the published datasets) or plain TFRecord."""
    if not raw:
        raise TFRecordError(f"{path}: empty file, no records")
    stream: io.BufferedIOBase = io.BytesIO(raw)
    if raw[:2] == b"\x1f\x8b":
        stream = gzip.GzipFile(fileobj=stream)  # type: ignore[assignment]
    try:
        payloads = list(read_records(path, stream))  # type: ignore[arg-type]
    except (gzip.BadGzipFile, EOFError, OSError) as err:
        raise TFRecordError(f"{path}: GZIP stream is corrupt or truncated ({err})") from None
    if not payloads:
        raise TFRecordError(f"{path}: holds no records")
    return payloads


@functools.lru_cache(maxsize=32)
def _decoded(file: str, index: int) -> np.ndarray:
    # Several Dask blocks of one record read it one after another: the last few records stay
    # decoded (17 MB each at 128³) so that each is unzipped once.
    path = Path(file)
    payloads = file_payloads(path, path.read_bytes())
    return decode_sample(path, index, payloads[index])[0]


class RecordSource:
    """Array-like (S, S, S, C) int16 view of one record's `x`, read (and CRC-checked) on use; it
    pickles small, so a Dask cluster's workers read it from the shared filesystem too."""

    def __init__(self, unit: str | os.PathLike, size: int, channels: int) -> None:
        self.file, self.index = os.path.abspath(record_file(unit)), record_index(unit)
        self.shape, self.dtype, self.ndim = (size, size, size, channels), np.dtype(np.int16), 4

    def __getitem__(self, key: Any) -> np.ndarray:
        return _decoded(self.file, self.index)[key].copy()  # the cache's array stays as read
