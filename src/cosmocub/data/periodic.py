"""Periodic reads: a box of a universe that may run past its edges, wrapped round (a universe is
periodic), as at most two plain slices per axis of the stored array (an HDF5 dataset or numpy).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np


def wrapped_pieces(start: int, length: int, size: int) -> list[tuple[slice, slice]]:
    """[(source slice, destination slice)] that read indices start … start + length − 1 mod
    `size` into 0 … length − 1: one piece, or two where the run wraps past the end."""
    if not 0 < length <= size:
        raise ValueError(f"a periodic run of {length} does not fit a side of {size}")
    start %= size
    first = min(length, size - start)
    pieces = [(slice(start, start + first), slice(0, first))]
    if first < length:
        pieces.append((slice(0, length - first), slice(first, length)))
    return pieces


def read_periodic(
    universes: Any,
    row: int,
    origin_dhw: Sequence[int],
    region_dhw: Sequence[slice],
    crop_size: int,
) -> np.ndarray:
    """universes[row, :] (C, N, N, N) cropped at `origin_dhw` (wrapping) to a crop of side
    `crop_size`, and of that crop only `region_dhw` (D, H, W slices of step 1): (C, d, h, w).

    Each axis is at most two slices, so a read is at most 8 boxes of the stored array; an HDF5
    dataset reads only the chunks they touch."""
    channels, size = universes.shape[1], universes.shape[2]
    if crop_size > size:
        raise ValueError(f"a crop of {crop_size}³ does not fit a universe of {size}³")
    axes = []
    for origin, region in zip(origin_dhw, region_dhw, strict=True):
        lo, hi, step = region.indices(crop_size)
        if step != 1 or lo >= hi:
            raise ValueError(f"region {tuple(region_dhw)}: slices must be non-empty, of step 1")
        axes.append(wrapped_pieces(int(origin) + lo, hi - lo, size))
    shape = [pieces[-1][1].stop for pieces in axes]  # the last piece ends at the length
    out = np.empty((channels, *shape), dtype=universes.dtype)
    for (sd, dd), (sh, dh), (sw, dw) in itertools.product(*axes):
        out[:, dd, dh, dw] = universes[row, :, sd, sh, sw]
    return out
