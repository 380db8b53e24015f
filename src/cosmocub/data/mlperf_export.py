"""`cosmocub export-mlperf`: the config's universes as an MLPerf HPC CosmoFlow folder (train/,
validation/, test/; one GZIP TFRecord of one tf.train.Example a crop), so that other CosmoFlow
codes read cosmocub's universes, and tests and benchmarks make MLPerf folders of any size.

The crops are the shards' (preprocess.sample_size, in cube_origins order) and so is the split
(the seeded draw of data.splits): read back through universes.source mlperf, they give the
shards the universes give.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from cosmocub.config import Config
from cosmocub.data.shard_file import cube_origins
from cosmocub.data.splits import PreprocessError, assign_splits, check_metas
from cosmocub.data.tfrecord import encode_example, frame_record
from cosmocub.data.universe import read_universe
from cosmocub.data.universe_groups import read_group_metas
from cosmocub.io import atomic_path

FOLDER_OF_SPLIT = {"train": "train", "val": "validation", "test": "test"}


def export_mlperf(cfg: Config, universes_dir: str | os.PathLike, out: str | os.PathLike) -> dict:
    """Write the folder `out` (atomically, as a whole; an existing one is refused) and return
    the number of files in each of its folders."""
    out = Path(out)
    if out.exists():
        raise PreprocessError(f"{out}: exists; export-mlperf writes a new folder, never into one")
    if not cfg.universes.made_here:
        raise PreprocessError(
            f"key 'universes.source': export-mlperf exports universes made here (synthetic or "
            f"known_answer), not {cfg.universes.source!r} ones"
        )
    s = cfg.preprocess.sample_size
    metas = check_metas(read_group_metas(cfg, universes_dir), s)
    assigned = assign_splits([m.path for m in metas], cfg.preprocess.splits.as_dict(), cfg.seed)
    by_path = {m.path: m for m in metas}
    written = {}
    with atomic_path(out) as tmp:
        for split, folder in FOLDER_OF_SPLIT.items():
            (tmp / folder).mkdir(parents=True)
            for path in assigned[split]:
                _export_universe(path, by_path[path].unit_par, tmp / folder, sample_size=s)
            written[folder] = len(assigned[split]) * len(cube_origins(metas[0].size, s))
    return written


def _export_universe(path: Path, unit_par, folder: Path, *, sample_size: int) -> None:
    """One universe's crops, each a file <stem>_<crop>.tfrecord (crops in cube_origins order)."""
    s = sample_size
    counts, _ = read_universe(path)  # (N, N, N, C) int16, read once
    for crop, (d, h, w) in enumerate(cube_origins(counts.shape[0], s)):
        example = encode_example(counts[d : d + s, h : h + s, w : w + s], unit_par)
        # mtime 0: the same universes export to the same bytes; zlib's level 6 as TensorFlow's
        # writer uses (gzip's 9 took several times as long for ~1 % less).
        name = folder / f"{Path(path).stem}_{crop:03d}.tfrecord"
        with gzip.GzipFile(name, "wb", compresslevel=6, mtime=0) as f:
            f.write(frame_record(example))
