"""The simulate jobs: which seeds each group of synthetic universes holds, and one group made in
one process (one interpreter start, one import and one set of force-mesh k-grids for all of them).

Each universe is the file `cosmocub simulate` writes, under the same name (synth_<seed>.hdf5),
written atomically; so preprocessing reads a universe the same whichever way it was made.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from cosmocub.config import Config, ConfigError, SimulateConfig
from cosmocub.data.naming import synthetic_id, universe_seed
from cosmocub.data.simulate import run_simulate

log = logging.getLogger(__name__)


def group_seeds(cfg: Config) -> list[list[int]]:
    """The seeds of the config's synthetic universes in order, cluster.simulate.universes_per_job
    to a group (the last may be shorter)."""
    if cfg.universes.source != "synthetic":
        raise ConfigError(
            f"key 'universes.source': {cfg.universes.source!r} universes are linked, not "
            f"simulated (simulate jobs need 'synthetic')"
        )
    seeds = [universe_seed(i, master_seed=cfg.seed) for i in range(cfg.universes.count)]
    per_job = cfg.cluster.simulate.universes_per_job
    return [seeds[i : i + per_job] for i in range(0, len(seeds), per_job)]


def seeds_of_group(cfg: Config, group: int) -> list[int]:
    """The seeds of group `group`; a ConfigError naming the number of groups if there is none."""
    groups = group_seeds(cfg)
    if not 0 <= group < len(groups):
        raise ConfigError(
            f"simulate group {group} does not exist: universes.count {cfg.universes.count} at "
            f"cluster.simulate.universes_per_job {cfg.cluster.simulate.universes_per_job} make "
            f"{len(groups)} groups"
        )
    return groups[group]


def run_simulate_group(
    out_dir: str | os.PathLike, seeds: list[int], *, size: int, settings: SimulateConfig
) -> list[dict[str, float]]:
    """Simulate `seeds` one after another into out_dir/synth_<seed>.hdf5; return each universe's
    `universe_metrics`. The first failure stops the group and propagates: the universes written
    before it are whole files, the failing one leaves nothing (each file is renamed into place
    only once written)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = []
    for done, seed in enumerate(seeds):
        metrics.append(
            run_simulate(
                out_dir / f"{synthetic_id(seed)}.hdf5", size=size, seed=seed, settings=settings
            )
        )
        log.info("simulate group: %d of %d universes done", done + 1, len(seeds))
    return metrics
