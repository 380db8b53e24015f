"""The particle-mesh run's inner loops, compiled with numba: cloud-in-cell mass assignment and
force interpolation, the 4-point finite-difference gradient, and the leapfrog's kick and drift.

A particle's 8 cells and weights are cheap to compute and costly to store: computed again where
they are needed (deposit, then interpolation), they cost no memory traffic, where a stored
stencil (a sparse (P, m³) matrix) made these loops the simulation's largest cost after its FFTs.
Loops run serially in particle order, so sums are bit-identical from run to run; the workflow
runs one simulation per core, so threads inside one would only compete with the next job.
"""

from __future__ import annotations

import numba
import numpy as np

# cache=True keeps the compiled kernels on disk (beside this file, or numba's user cache where
# that is read-only), so a simulate job after the first pays a load, not a compile.
_jit = numba.njit(cache=True, nogil=True, error_model="numpy")


@_jit
def _lower_cell(x: float, m: int) -> tuple[int, int, float]:
    """Lower and upper cell of coordinate x (mesh-cell units, any real value, wrapped into
    [0, m)) and the upper cell's weight, all in x's precision."""
    base = np.floor(x)
    upper_weight = x - base
    low = np.int64(base)
    # Positions are kept in the box, so the integer division of a modulo is rarely needed (it
    # was a third of the loop's time when done for every coordinate).
    if low >= m or low < 0:
        low %= m
    high = low + 1
    if high == m:
        high = 0
    return low, high, upper_weight


@_jit
def cic_deposit(positions: np.ndarray, scale: float, density: np.ndarray) -> None:
    """Particle number per cell of an m³ mesh, written into density (m, m, m) float32 (its
    sum is then P, to float32 rounding): positions (3, P) float32 in voxels, scale = cells per
    voxel."""
    m = density.shape[0]
    density[...] = 0.0
    s = np.float32(scale)
    one = np.float32(1.0)
    for p in range(positions.shape[1]):
        x0, x1, wx = _lower_cell(positions[0, p] * s, m)
        y0, y1, wy = _lower_cell(positions[1, p] * s, m)
        z0, z1, wz = _lower_cell(positions[2, p] * s, m)
        ux, uy, uz = one - wx, one - wy, one - wz
        w00, w01, w10, w11 = ux * uy, ux * wy, wx * uy, wx * wy
        density[x0, y0, z0] += w00 * uz
        density[x0, y0, z1] += w00 * wz
        density[x0, y1, z0] += w01 * uz
        density[x0, y1, z1] += w01 * wz
        density[x1, y0, z0] += w10 * uz
        density[x1, y0, z1] += w10 * wz
        density[x1, y1, z0] += w11 * uz
        density[x1, y1, z1] += w11 * wz


@_jit
def cic_interpolate(
    mesh_field: np.ndarray, positions: np.ndarray, scale: float, out: np.ndarray
) -> None:
    """A channels-last mesh field (m, m, m, C) float32 read at each particle with the deposit's
    weights (the deposit's adjoint, so a particle feels no force of its own), written into out
    (C, P) float32: positions (3, P) float32 in voxels, scale = cells per voxel."""
    m = mesh_field.shape[0]
    channels = mesh_field.shape[3]
    num = positions.shape[1]
    s = np.float32(scale)
    one = np.float32(1.0)
    for p in range(num):
        x0, x1, wx = _lower_cell(positions[0, p] * s, m)
        y0, y1, wy = _lower_cell(positions[1, p] * s, m)
        z0, z1, wz = _lower_cell(positions[2, p] * s, m)
        ux, uy, uz = one - wx, one - wy, one - wz
        w00, w01, w10, w11 = ux * uy, ux * wy, wx * uy, wx * wy
        for c in range(channels):
            out[c, p] = (
                w00 * (uz * mesh_field[x0, y0, z0, c] + wz * mesh_field[x0, y0, z1, c])
                + w01 * (uz * mesh_field[x0, y1, z0, c] + wz * mesh_field[x0, y1, z1, c])
                + w10 * (uz * mesh_field[x1, y0, z0, c] + wz * mesh_field[x1, y0, z1, c])
                + w11 * (uz * mesh_field[x1, y1, z0, c] + wz * mesh_field[x1, y1, z1, c])
            )


@_jit
def _wrap(i: int, m: int) -> int:
    if i >= m:
        return i - m
    if i < 0:
        return i + m
    return i


@_jit
def gradient_4point(field: np.ndarray, cells_per_unit: float, out: np.ndarray) -> None:
    """The periodic gradient of an (m, m, m) float32 field by the 4-point central difference
    (∂f ≈ [8(f₊₁ − f₋₁) − (f₊₂ − f₋₂)] / 12h, error O(h⁴): the stencil of GADGET-2's PM part),
    written channels last into out (m, m, m, 3) float32, per unit of length (cells_per_unit
    cells to the unit).
    One pass over the field replaces the two extra inverse FFTs a spectral gradient costs."""
    m = field.shape[0]
    near = np.float32(8.0 / 12.0 * cells_per_unit)
    far = np.float32(1.0 / 12.0 * cells_per_unit)
    for i in range(m):
        ip1, ip2, im1, im2 = _wrap(i + 1, m), _wrap(i + 2, m), _wrap(i - 1, m), _wrap(i - 2, m)
        for j in range(m):
            jp1, jp2 = _wrap(j + 1, m), _wrap(j + 2, m)
            jm1, jm2 = _wrap(j - 1, m), _wrap(j - 2, m)
            for k in range(m):
                out[i, j, k, 0] = near * (field[ip1, j, k] - field[im1, j, k]) - far * (
                    field[ip2, j, k] - field[im2, j, k]
                )
                out[i, j, k, 1] = near * (field[i, jp1, k] - field[i, jm1, k]) - far * (
                    field[i, jp2, k] - field[i, jm2, k]
                )
            # Along the row, the interior needs no wrap (so the loop vectorises); the two cells
            # at each end do.
            for k in range(2, m - 2):
                out[i, j, k, 2] = near * (field[i, j, k + 1] - field[i, j, k - 1]) - far * (
                    field[i, j, k + 2] - field[i, j, k - 2]
                )
            for k in (0, 1, m - 2, m - 1):
                kp1, kp2 = _wrap(k + 1, m), _wrap(k + 2, m)
                km1, km2 = _wrap(k - 1, m), _wrap(k - 2, m)
                out[i, j, k, 2] = near * (field[i, j, kp1] - field[i, j, km1]) - far * (
                    field[i, j, kp2] - field[i, j, km2]
                )


@_jit
def kick(momenta: np.ndarray, forces: np.ndarray, factor: float) -> None:
    """momenta += factor · forces, both (3, P) float32."""
    f = np.float32(factor)
    for axis in range(3):
        for p in range(momenta.shape[1]):
            momenta[axis, p] += f * forces[axis, p]


@_jit
def drift(positions: np.ndarray, momenta: np.ndarray, factor: float, box: float) -> None:
    """positions += factor · momenta, wrapped into the periodic box [0, box), both (3, P)
    float32: coordinates kept small keep float32's resolution."""
    f = np.float32(factor)
    side = np.float32(box)
    for axis in range(3):
        for p in range(positions.shape[1]):
            x = positions[axis, p] + f * momenta[axis, p]
            if x >= side or x < 0:
                x -= side * np.floor(x / side)
                if x >= side:  # a tiny negative x rounds up to the side itself
                    x = np.float32(0.0)
            positions[axis, p] = x


@_jit
def sort_by_voxel(positions: np.ndarray, momenta: np.ndarray, n: int) -> None:
    """Reorder the particles, in place, by the voxel they are in, x-major as the mesh is laid
    out (a stable counting sort), so that the deposit and the interpolation walk the mesh in
    memory order. As structure forms, neighbours on the lattice drift apart and the mesh reads
    become cache misses: on a 64³ universe, sorting before each force costs ~3 ms and saves
    ~3 ms of the deposit and ~6 ms of the interpolation."""
    num = positions.shape[1]
    voxels = np.empty(num, dtype=np.int32)
    starts = np.zeros(n * n * n + 1, dtype=np.int32)
    for p in range(num):
        voxel = 0
        for axis in range(3):
            voxel = voxel * n + _lower_cell(positions[axis, p], n)[0]  # the deposit's wrap
        voxels[p] = voxel
        starts[voxel + 1] += 1
    for v in range(n * n * n):
        starts[v + 1] += starts[v]
    order = np.empty(num, dtype=np.int32)
    for p in range(num):
        order[starts[voxels[p]]] = p
        starts[voxels[p]] += 1
    scratch = np.empty(num, dtype=positions.dtype)
    for array in (positions, momenta):
        for axis in range(3):
            for q in range(num):
                scratch[q] = array[axis, order[q]]
            array[axis, :] = scratch
