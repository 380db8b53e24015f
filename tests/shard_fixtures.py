"""For tests and benchmarks (which add tests/ to their path): tiny random shard folders in the
docs/reference/formats.md layout, three universes in the public CosmoFlow layout, the workflow's
preprocessing commands in order, and many training runs one after another in one process group
(process start-up is the cost).

The shards' targets depend on the inputs (a fixed random projection of per-channel means), so a
model can fit them; nothing here is physics.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


def write_public_universes(folder: Path, *, size: int = 8) -> Path:
    """Three universes of size³ named as the public CosmoFlow files are (univ_ics_2019-03_a1 …),
    every count 1: what a link_group job validates and links."""
    from cosmocub.data.universe import write_universe

    folder.mkdir()
    for name in ("univ_ics_2019-03_a1", "univ_ics_2019-03_a2", "univ_ics_2019-03_a3"):
        write_universe(
            folder / f"{name}.hdf5",
            np.ones((size, size, size, 4), np.int16),
            unit_par=np.zeros(4, np.float32),
            phys_par=np.array([0.3, 0.8, 0.96, 70], np.float32),
            redshifts=np.array([0.0, 0.5, 1.5, 3.0], np.float32),
        )
    return folder


def preprocess_stages(
    config: Path, universes: Path, work: Path, groups: int, *, threads: int = 1
) -> Iterator[tuple[str, int]]:
    """The workflow's preprocessing commands on `universes` (their group manifests made):
    preprocess-plan, every preprocess-group, preprocess-gather into work/shards; yields each
    stage's command and its jobs once it has run, so that a benchmark can time them."""
    from cosmocub.cli import main

    common = ["--config", str(config)]
    staging, npz = work / "staging", work / "groups"
    plan = ["preprocess-plan", "--universes-dir", str(universes), "--staging", str(staging)]
    assert main([*plan, *common]) == 0
    yield "preprocess-plan", 1
    for g in range(groups):
        group = ["preprocess-group", "--staging", str(staging), "--group", str(g)]
        assert (
            main([*group, "--out", str(npz / f"{g}.npz"), "--threads", str(threads), *common]) == 0
        )
    yield "preprocess-group", groups
    gather = ["preprocess-gather", "--staging", str(staging), "--groups-dir", str(npz)]
    assert main([*gather, "--out", str(work / "shards"), *common]) == 0
    yield "preprocess-gather", 1


class _Stopped(Exception):
    """Raised by every rank at the same step: the run stops after a checkpoint, to resume."""


def train_runs(
    manifest_path: str | os.PathLike,
    *,
    before_run: Callable[[dict], None] | None = None,
    on_step_end: Callable[[int, Any], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Train every run of a manifest, {"shards": DIR, "runs": [{"name", "config", "run_dir",
    "stop_at"?}, …]}, in the process group that already exists (`train` leaves it open); a run
    with stop_at > 0 is stopped there on every rank and started again, so that it resumes from
    its newest checkpoint. `before_run(run)` runs first (a benchmark's control) and
    `on_step_end(step, model)` after every step (as `train`'s). Returns {name: train summary}."""
    from cosmocub.config import load_config
    from cosmocub.train.main import train

    manifest = json.loads(Path(manifest_path).read_text())
    summaries = {}
    for run in manifest["runs"]:
        if before_run is not None:
            before_run(run)
        cfg = load_config(run["config"])
        where = {"shards_dir": manifest["shards"], "run_dir": run["run_dir"]}
        if run.get("stop_at", 0):

            def stop(step: int, model: Any, at: int = run["stop_at"]) -> None:
                if on_step_end is not None:
                    on_step_end(step, model)
                if step == at:
                    raise _Stopped

            with contextlib.suppress(_Stopped):
                train(cfg, **where, on_step_end=stop)
        summaries[run["name"]] = train(cfg, **where, on_step_end=on_step_end)
    return summaries
