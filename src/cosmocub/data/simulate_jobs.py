"""One universe of a simulate job (data.universe_groups makes a group of them): synthetic, or a
known-answer field (universes.source known_answer).

Each universe is the file `cosmocub simulate` writes, under the same name (synth_<seed>.hdf5),
written atomically; so preprocessing reads a universe the same whichever way it was made.
"""

from __future__ import annotations

import os
from pathlib import Path

from cosmocub.config import SimulateConfig
from cosmocub.data.known_answer_fields import run_known_answer
from cosmocub.data.simulate import run_simulate


def simulate_one(
    out: str | os.PathLike, *, size: int, seed: int, settings: SimulateConfig, source: str
) -> dict[str, float]:
    """Make one universe of `source` (synthetic, or known_answer: a known-answer field, for which
    the simulate settings do not apply) at `out`, atomically; return its metrics."""
    if source == "known_answer":
        return run_known_answer(Path(out), size=size, seed=seed)
    return run_simulate(Path(out), size=size, seed=seed, settings=settings)
