"""Cube symmetries: 48 distinct, each a bijection of voxels, batched draws reproducible."""

import torch

from cosmocub.data.augment import CUBE_SYMMETRIES, cube_symmetry, random_cube_symmetries


def test_the_48_symmetries_are_distinct_and_keep_every_voxel():
    x = torch.arange(2 * 4**3, dtype=torch.float32).reshape(2, 4, 4, 4)
    images = {tuple(cube_symmetry(x, i).flatten().tolist()) for i in range(len(CUBE_SYMMETRIES))}
    assert len(CUBE_SYMMETRIES) == 48 and len(images) == 48
    for i in range(48):
        y = cube_symmetry(x, i)
        assert y.shape == x.shape
        # Channels are never mixed: each channel keeps its own set of values.
        assert torch.equal(y[0].flatten().sort().values, x[0].flatten())
        assert torch.equal(y[1].flatten().sort().values, x[1].flatten())


def test_identity_and_known_maps():
    x = torch.randn(1, 3, 3, 3)
    assert torch.equal(cube_symmetry(x, 0), x)
    # index 1: axes in order, flip W only.
    assert torch.equal(cube_symmetry(x, 1), x.flip(3))
    # A voxel at (d, h, w) = (0, 1, 2) under the transpose (W, H, D) and no flip lands at (2, 1, 0).
    transpose = CUBE_SYMMETRIES.index(((2, 1, 0), (False, False, False)))
    assert cube_symmetry(x, transpose)[0, 2, 1, 0] == x[0, 0, 1, 2]


def test_batched_draws_depend_only_on_the_generator():
    x = torch.randn(6, 2, 4, 4, 4)
    a = random_cube_symmetries(x, torch.Generator().manual_seed(3))
    b = random_cube_symmetries(x, torch.Generator().manual_seed(3))
    c = random_cube_symmetries(x, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    # Statistics that the universe's parameters shape are unchanged by the symmetry.
    assert torch.allclose(a.mean(dim=(2, 3, 4)), x.mean(dim=(2, 3, 4)), atol=1e-6)
