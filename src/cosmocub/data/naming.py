"""Which universes a run uses and what their files are called: synthetic seeds or a public folder,
and the seeds each simulate job makes (pure: the Snakefile reads them at parse time).

The names are the file stems (without .hdf5) under <results>/universes, in a stable order.
"""

from __future__ import annotations

from pathlib import Path

from cosmocub.config import Config, ConfigError


def universe_seed(index: int, *, master_seed: int) -> int:
    """Seed of the index-th synthetic universe: disjoint ranges per master seed."""
    return master_seed * 1_000_000 + index


def synthetic_id(seed: int) -> str:
    """File stem of the synthetic universe of `seed`."""
    return f"synth_{seed}"


def universe_ids(cfg: Config) -> list[str]:
    """File stems (without .hdf5) of every universe the workflow uses, in a stable order."""
    if cfg.universes.made_here:
        return [
            synthetic_id(universe_seed(i, master_seed=cfg.seed)) for i in range(cfg.universes.count)
        ]
    folder = Path(cfg.universes.cosmoflow_dir or "")
    if not folder.is_dir():
        raise ConfigError(f"key 'universes.cosmoflow_dir': {folder} is not a folder")
    stems = sorted(p.stem for p in folder.glob("univ_*.hdf5"))
    if not stems:
        raise ConfigError(f"key 'universes.cosmoflow_dir': {folder} holds no univ_*.hdf5 files")
    return stems[: cfg.universes.max_files] if cfg.universes.max_files else stems


def group_seeds(cfg: Config) -> list[list[int]]:
    """The seeds of the config's synthetic universes in order, cluster.simulate.universes_per_job
    to a group (the last may be shorter)."""
    if not cfg.universes.made_here:
        raise ConfigError(
            f"key 'universes.source': {cfg.universes.source!r} universes are linked, not "
            f"simulated (simulate jobs need 'synthetic' or 'known_answer')"
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
