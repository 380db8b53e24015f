"""Symmetries of the cube as data augmentation: a universe has no preferred axis or direction.

The 48 rotations and reflections of a cube (6 axis orders × 8 sign flips) map a statistically
isotropic density field to another equally likely one with the same cosmological parameters.
"""

from __future__ import annotations

import itertools

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


def random_cube_symmetries(x_bcdhw: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each sample of the batch (B, C, D, H, W) under its own random symmetry of the cube."""
    choices = torch.randint(len(CUBE_SYMMETRIES), (x_bcdhw.shape[0],), generator=generator)
    return torch.stack([cube_symmetry(x, int(i)) for x, i in zip(x_bcdhw, choices, strict=True)])
