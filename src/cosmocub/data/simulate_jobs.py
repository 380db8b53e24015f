"""The simulate jobs: one group of synthetic universes (naming.group_seeds) made in one process
(one interpreter start, one import and one set of force-mesh k-grids for all of them); the
known-answer fields (universes.source known_answer) are made by the same jobs.

Each universe is the file `cosmocub simulate` writes, under the same name (synth_<seed>.hdf5),
written atomically; so preprocessing reads a universe the same whichever way it was made.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from cosmocub.config import SimulateConfig
from cosmocub.data.known_answer_fields import run_known_answer
from cosmocub.data.naming import synthetic_id
from cosmocub.data.simulate import run_simulate

log = logging.getLogger(__name__)


def run_simulate_group(
    out_dir: str | os.PathLike,
    seeds: list[int],
    *,
    size: int,
    settings: SimulateConfig,
    source: str = "synthetic",
) -> list[dict[str, float]]:
    """Simulate `seeds` one after another into out_dir/synth_<seed>.hdf5; return each universe's
    `universe_metrics` (source known_answer: known-answer fields, `run_known_answer`'s
    metrics; the simulate settings do not apply to them). The first failure stops the group and
    propagates: the universes written before it are whole files, the failing one leaves nothing
    (each file is renamed into place only once written)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = []
    for done, seed in enumerate(seeds):
        out = out_dir / f"{synthetic_id(seed)}.hdf5"
        if source == "known_answer":
            metrics.append(run_known_answer(out, size=size, seed=seed))
        else:
            metrics.append(run_simulate(out, size=size, seed=seed, settings=settings))
        log.info("simulate group: %d of %d universes done", done + 1, len(seeds))
    return metrics
