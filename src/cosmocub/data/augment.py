"""Symmetries of the cube as data augmentation: a universe has no preferred axis or direction.

The 48 rotations and reflections of a cube (6 axis orders × 8 sign flips) map a statistically
isotropic density field to another equally likely one with the same cosmological parameters;
so does moving the crop origin in a periodic universe (`draw_crop_origins`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

# Every (axis order of D, H, W) × (flip D?, flip H?, flip W?): 48 symmetries.
CUBE_SYMMETRIES: tuple[tuple[tuple[int, int, int], tuple[bool, bool, bool]], ...] = tuple(
    (perm, flips)
    for perm in itertools.permutations(range(3))
    for flips in itertools.product((False, True), repeat=3)
)


def cube_symmetry(x: torch.Tensor, index: int) -> torch.Tensor:
    """Apply symmetry `index` (0 = identity) to the last three dims (D, H, W), D = H = W, of a
    sample (C, D, H, W) or a whole batch (B, C, D, H, W)."""
    perm, flips = CUBE_SYMMETRIES[index]
    lead = x.dim() - 3
    out = x.permute(*range(lead), *(lead + p for p in perm))
    dims = [lead + d for d, flip in enumerate(flips) if flip]
    return out.flip(dims) if dims else out


def draw_symmetries(
    count: int, generator: torch.Generator, allowed: Sequence[int] | None = None
) -> list[int]:
    """`count` symmetry indices drawn uniformly from `allowed` (default: all 48)."""
    allowed = range(len(CUBE_SYMMETRIES)) if allowed is None else allowed
    choices = torch.randint(len(allowed), (count,), generator=generator)
    return [allowed[int(i)] for i in choices]


def draw_crop_origins(
    count: int, generator: torch.Generator, universe_size: int
) -> list[tuple[int, int, int]]:
    """`count` crop origins (d, h, w), each uniform over all universe_size³ voxels: in a periodic
    universe every origin is a valid crop (data/periodic.py wraps the reads)."""
    origins = torch.randint(universe_size, (count, 3), generator=generator)
    return [(int(d), int(h), int(w)) for d, h, w in origins.tolist()]


def random_cube_symmetries(x_bcdhw: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each sample of the batch (B, C, D, H, W) under its own random symmetry of the cube."""
    choices = draw_symmetries(x_bcdhw.shape[0], generator)
    return torch.stack([cube_symmetry(x, i) for x, i in zip(x_bcdhw, choices, strict=True)])


# --- under a spatial split ---------------------------------------------------------------------
# A rank that holds block B of each sample needs block B of the *transformed* sample. That is the
# symmetry applied to one region of the stored sample (`source_region`), so every symmetry can be
# served exactly. But the shards are chunked by depth slab: a region that is a slab along H or W
# touches every chunk, and the rank would read the whole sample to keep a part of it. So a split
# keeps the symmetries whose region is again one rank's block: all 8 flips (a flipped block is the
# mirrored rank's block), and only the axis orders that send each axis to one split into as many
# ranks. The default depth split [S, 1, 1] keeps 16 of the 48 (flips × swapping H and W); an even
# split [s, s, s] keeps all 48; no split keeps all 48.


def symmetries_for_split(split_dhw: Sequence[int]) -> tuple[int, ...]:
    """Indices of the symmetries whose source region of a rank's block is again a block."""
    return tuple(
        i
        for i, (perm, _) in enumerate(CUBE_SYMMETRIES)
        if all(split_dhw[p] == split_dhw[k] for k, p in enumerate(perm))
    )


def source_region(index: int, block_dhw: Sequence[slice], size: int) -> tuple[slice, slice, slice]:
    """The region R (D, H, W slices) of a stored sample of side `size` such that
    cube_symmetry(x[..., R], index) == cube_symmetry(x, index)[..., block_dhw]."""
    perm, flips = CUBE_SYMMETRIES[index]
    region: list[slice] = [slice(None)] * 3
    for k, (axis_block, flip) in enumerate(zip(block_dhw, flips, strict=True)):
        lo, hi, step = axis_block.indices(size)
        if step != 1:
            raise ValueError(f"block {tuple(block_dhw)}: slices must have step 1")
        # Output axis k is stored axis perm[k], read mirrored when axis k is flipped.
        region[perm[k]] = slice(size - hi, size - lo) if flip else slice(lo, hi)
    return region[0], region[1], region[2]
