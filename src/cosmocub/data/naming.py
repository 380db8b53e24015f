"""Which universes a run uses and what their files are called: synthetic seeds or a public folder,
the groups each universe job makes or links, and their manifests' names (pure: the Snakefile
reads them at parse time).

The names are the file stems (without .hdf5) under <results>/universes, in a stable order; a
group's manifest is <results>/universes/groups/<group name>.json.
"""

from __future__ import annotations

from pathlib import Path

from cosmocub.config import Config, ConfigError
from cosmocub.data.mlperf import file_groups

# Universe seeds of one master (top-level) seed: a range of their own.
SEEDS_PER_MASTER = 1_000_000


def universe_seed(index: int, *, master_seed: int) -> int:
    """Seed of the index-th synthetic universe: disjoint ranges per master seed."""
    return master_seed * SEEDS_PER_MASTER + index


def synthetic_id(seed: int) -> str:
    """File stem of the synthetic universe of `seed`."""
    return f"synth_{seed}"


def universe_ids(cfg: Config) -> list[str]:
    """File stems (without .hdf5) of every universe the workflow uses, in a stable order (the
    MLPerf folders: each file's path under universes.mlperf_dir, in the order of its groups)."""
    if cfg.universes.made_here:
        return [
            synthetic_id(universe_seed(i, master_seed=cfg.seed)) for i in range(cfg.universes.count)
        ]
    if cfg.universes.source == "mlperf":  # the files, by their paths in the dataset's folder
        return [f for group in file_groups(cfg) for f in group]
    folder = Path(cfg.universes.cosmoflow_dir or "")
    if not folder.is_dir():
        raise ConfigError(f"key 'universes.cosmoflow_dir': {folder} is not a folder")
    stems = sorted(p.stem for p in folder.glob("univ_*.hdf5"))
    if not stems:
        raise ConfigError(f"key 'universes.cosmoflow_dir': {folder} holds no univ_*.hdf5 files")
    return stems[: cfg.universes.max_files] if cfg.universes.max_files else stems


def group_seeds(cfg: Config, *, master_seed: int | None = None) -> list[list[int]]:
    """The seeds of the config's synthetic universes in order, cluster.simulate.universes_per_job
    to a group (the last may be shorter); with `master_seed`, those that config would make at
    that top-level seed (a study point's own universes, known_answer_study.seeds)."""
    if not cfg.universes.made_here:
        raise ConfigError(
            f"key 'universes.source': {cfg.universes.source!r} universes are linked, not "
            f"simulated (simulate jobs need 'synthetic' or 'known_answer')"
        )
    master = cfg.seed if master_seed is None else master_seed
    seeds = [universe_seed(i, master_seed=master) for i in range(cfg.universes.count)]
    per_job = cfg.cluster.simulate.universes_per_job
    return [seeds[i : i + per_job] for i in range(0, len(seeds), per_job)]


def public_groups(cfg: Config) -> list[list[str]]:
    """The public universes' stems, cluster.preprocess.universes_per_job to a link group (the
    groups preprocessing crops: a link is a header read and a symlink, too little for a job)."""
    stems = universe_ids(cfg)
    per_job = cfg.cluster.preprocess.universes_per_job
    return [stems[i : i + per_job] for i in range(0, len(stems), per_job)]


def universe_group_names(cfg: Config, *, master_seed: int | None = None) -> list[str]:
    """The stems of the group manifests that together list the config's universes, in order:
    seed<m>-<g> for universes made here (at top-level seed m: the config's own, or
    `master_seed`), public-<g> for linked ones, mlperf-<g> for the MLPerf folders' files."""
    if cfg.universes.made_here:
        master = cfg.seed if master_seed is None else master_seed
        return [f"seed{master}-{g}" for g in range(len(group_seeds(cfg, master_seed=master)))]
    if cfg.universes.source == "mlperf":
        return [f"mlperf-{g}" for g in range(len(file_groups(cfg)))]
    return [f"public-{g}" for g in range(len(public_groups(cfg)))]


def simulate_group_of(cfg: Config, seed: int) -> tuple[int, int]:
    """(top-level seed, simulate group) of the universe synth_<seed>: any top-level seed's
    universes (a study's points may run at seeds of their own), but only the first
    universes.count of each; a ConfigError otherwise."""
    master, index = divmod(seed, SEEDS_PER_MASTER)
    if not cfg.universes.made_here or index >= cfg.universes.count:
        raise ConfigError(
            f"synth_{seed}.hdf5 is not one of this config's universes (universe {index} of "
            f"top-level seed {master}; universes.count {cfg.universes.count}, universes.source "
            f"{cfg.universes.source!r})"
        )
    return master, index // cfg.cluster.simulate.universes_per_job


def seeds_of_group(cfg: Config, group: int, *, master_seed: int | None = None) -> list[int]:
    """The seeds of group `group` (at `master_seed`, else the config's own top-level seed); a
    ConfigError naming the number of groups if there is none."""
    groups = group_seeds(cfg, master_seed=master_seed)
    if not 0 <= group < len(groups):
        raise ConfigError(
            f"simulate group {group} does not exist: universes.count {cfg.universes.count} at "
            f"cluster.simulate.universes_per_job {cfg.cluster.simulate.universes_per_job} make "
            f"{len(groups)} groups"
        )
    return groups[group]
