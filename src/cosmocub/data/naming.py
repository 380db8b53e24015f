"""Which universes a run uses and what their files are called: synthetic seeds or a public folder.

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
    if cfg.universes.source == "synthetic":
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
