"""The four cosmological parameters the CNN learns, their base values and the unitPar mapping,
and the redshifts of a universe's snapshots: the numbers every layer above shares."""

from __future__ import annotations

import numpy as np

NAME_PAR: tuple[str, ...] = ("Omega_m", "sigma_8", "N_spec", "H_0")
# Channel order of `full`: the redshifts of the four snapshots (docs/reference/formats.md).
REDSHIFTS: tuple[float, ...] = (0.0, 0.5, 1.5, 3.0)
NUM_CHANNELS = len(REDSHIFTS)
NUM_PARAMS = len(NAME_PAR)
BASE_PHYS_PAR = np.array([0.3, 0.8, 0.96, 70.0])


def phys_from_unit(unit_par: np.ndarray, *, dtype: type = np.float32) -> np.ndarray:
    """physPar = base·(1 + 0.1·u), the generator's mapping of unitPar (docs/reference/formats.md).

    float32 as the files store it; metrics ask for float64.
    """
    return (BASE_PHYS_PAR * (1.0 + 0.1 * np.asarray(unit_par, dtype=np.float64))).astype(dtype)
