"""Particle-mesh gravity: CIC mass assignment and force interpolation, an FFT Poisson solver, the
kick-drift-kick leapfrog in scale factor, and nearest-grid-point particle counts.

Positions are in lattice units (voxels, box side n) and momenta p = a³E·dx/da in the same units
(H0 = 1), so a universe's physical size enters only through its initial displacements.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import scipy.sparse

from cosmocub.cosmology.background import FlatLCDM
from cosmocub.cosmology.fourier import TimedFFT, wavenumber_squared, wavevectors


@dataclass(frozen=True)
class CICStencil:
    """The 8 mesh cells each particle touches and its weight in each, as one sparse (P, m³)
    matrix W: computed once per force evaluation and shared by the deposit (Wᵀ·1) and the force
    interpolation (W·F, all three components in one pass)."""

    matrix: scipy.sparse.csr_array  # (P, m³), 8 float32 weights per row summing to 1
    mesh_size: int

    @classmethod
    def build(cls, positions_mesh: np.ndarray, mesh_size: int) -> CICStencil:
        """positions_mesh: (3, P) in mesh-cell units, any real values (wrapped periodically)."""
        m = mesh_size
        num = positions_mesh.shape[1]
        # int32 cell indices halve the stencil's memory traffic (the sparse products are
        # memory-bound); meshes of 2³¹ cells and more need int64.
        index_dtype = np.int32 if m**3 < 2**31 else np.int64
        # Per axis: the flat-index contribution of the lower and upper cell, and their weights;
        # corners are then sums and products of pairs, not fresh index arithmetic.
        cells, weights = [], []
        for axis, stride in enumerate((m * m, m, 1)):
            base = np.floor(positions_mesh[axis])
            upper_weight = (positions_mesh[axis] - base).astype(np.float32)
            low = base.astype(index_dtype)
            low %= m
            high = low + 1
            high[high == m] = 0
            low *= stride
            high *= stride
            cells.append((low, high))
            weights.append((np.float32(1.0) - upper_weight, upper_weight))
        # One row of 8 entries per particle (CSR order), corners in the order (x, y, z) bits.
        index = np.empty((num, 8), dtype=index_dtype)
        weight = np.empty((num, 8), dtype=np.float32)
        for cx in (0, 1):
            for cy in (0, 1):
                index_xy = cells[0][cx] + cells[1][cy]
                weight_xy = weights[0][cx] * weights[1][cy]
                for cz in (0, 1):
                    corner = 4 * cx + 2 * cy + cz
                    np.add(index_xy, cells[2][cz], out=index[:, corner])
                    np.multiply(weight_xy, weights[2][cz], out=weight[:, corner])
        indptr = np.arange(0, 8 * num + 1, 8, dtype=index_dtype)
        matrix = scipy.sparse.csr_array(
            (weight.reshape(-1), index.reshape(-1), indptr), shape=(num, m**3)
        )
        return cls(matrix=matrix, mesh_size=m)

    def deposit(self) -> np.ndarray:
        """Particle number per mesh cell, (m, m, m) float32 (summed in float32: a cell holds at
        most a few hundred weights, so the sum keeps ~6 significant digits)."""
        m = self.mesh_size
        ones = np.ones(self.matrix.shape[0], dtype=np.float32)
        return (self.matrix.T @ ones).reshape(m, m, m)

    def interpolate(self, mesh_field: np.ndarray) -> np.ndarray:
        """The mesh field read back at each particle with the same weights: (m, m, m) → (P,),
        or (m, m, m, C) channels last → (P, C), float32."""
        m = self.mesh_size
        channels = mesh_field.shape[3:]
        return self.matrix @ mesh_field.reshape(m**3, *channels)


def ngp_counts(positions: np.ndarray, n: int) -> np.ndarray:
    """Particles per voxel by nearest grid point (voxel i holds [i, i+1)), positions (3, P) in
    voxels: (n, n, n) int64."""
    flat = np.zeros(positions.shape[1], dtype=np.int64)
    for axis in range(3):
        cell = np.floor(positions[axis]).astype(np.int64)
        cell %= n
        flat *= n
        flat += cell
    return np.bincount(flat, minlength=n**3).reshape(n, n, n)


class ParticleMeshForce:
    """F = −∇φ with ∇²φ = 1.5·Ω_m·δ on a periodic mesh of `mesh_factor` cells per voxel per side;
    Poisson solve and gradient in Fourier space, CIC assignment and interpolation."""

    def __init__(self, *, n: int, mesh_factor: int, omega_m: float, fft: TimedFFT) -> None:
        self.n = n
        self.mesh_factor = mesh_factor
        self.mesh_size = n * mesh_factor
        self.omega_m = omega_m
        self.fft = fft
        self.ik, inv_k2 = _force_kernels(self.mesh_size, mesh_factor)
        self.green = np.float32(1.5 * omega_m) * inv_k2  # −φ_k / δ_k
        self._force_k: np.ndarray | None = None

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """positions (3, P) in voxels → forces (3, P) float32 in voxels·H0²."""
        m = self.mesh_size
        stencil = CICStencil.build(positions * np.float32(self.mesh_factor), m)
        # Mean particles per mesh cell is n³/m³ = 1/mesh_factor³.
        density = stencil.deposit()
        density *= np.float32(self.mesh_factor**3)
        density -= np.float32(1.0)
        neg_potential_k = self.fft.rfftn(density)
        del density
        neg_potential_k *= self.green
        # F_k = −i·k·φ_k = i·k·(−φ_k), the three axes channels last so that one batched inverse
        # FFT gives (m, m, m, 3) and one sparse product reads all three at each particle.
        if self._force_k is None:  # one scratch spectrum per run, not one per step
            self._force_k = np.empty((*neg_potential_k.shape, 3), dtype=neg_potential_k.dtype)
        for axis in range(3):
            np.multiply(neg_potential_k, self.ik[axis], out=self._force_k[..., axis])
        del neg_potential_k
        force_mesh = self.fft.irfftn(self._force_k, m, axes=(0, 1, 2))
        return np.ascontiguousarray(stencil.interpolate(force_mesh).T)


@functools.lru_cache(maxsize=4)
def _force_kernels(mesh_size: int, mesh_factor: int) -> tuple[list[np.ndarray], np.ndarray]:
    """i·k per axis (broadcastable, complex64) and 1/k² (0 at k = 0) on a mesh of cells
    1/mesh_factor voxels wide (so k comes out per voxel): the same for every universe of a
    size, so kept between them (read-only)."""
    spacing = 1.0 / mesh_factor
    ik = [(1j * k).astype(np.complex64) for k in wavevectors(mesh_size, spacing=spacing)]
    inv_k2 = (1.0 / wavenumber_squared(mesh_size, spacing=spacing)).astype(np.float32)
    inv_k2[0, 0, 0] = 0.0
    for array in (*ik, inv_k2):
        array.flags.writeable = False
    return ik, inv_k2


def step_scale_factors(
    a_initial: float, snapshots_a: Sequence[float], num_steps: int
) -> np.ndarray:
    """Step boundaries in a from a_initial to max(snapshots_a), with every snapshot on a boundary.

    Steps are spread over the intervals between snapshots in proportion to their length in a (at
    least one each; largest remainders get the rest) and are uniform in a within an interval.
    """
    stops = np.sort(np.asarray(snapshots_a, dtype=np.float64))
    if a_initial >= stops[0]:
        raise ValueError(
            f"step_scale_factors: initial a {a_initial:.4f} is not before the earliest snapshot "
            f"a {stops[0]:.4f}"
        )
    if num_steps < len(stops):
        raise ValueError(
            f"step_scale_factors: {num_steps} steps cannot end on {len(stops)} snapshots"
        )
    starts = np.concatenate([[a_initial], stops[:-1]])
    lengths = stops - starts
    ideal = num_steps * lengths / lengths.sum()
    counts = np.maximum(np.floor(ideal).astype(int), 1)
    while counts.sum() < num_steps:
        counts[np.argmax(ideal - counts)] += 1
    while counts.sum() > num_steps:
        # Only reachable when the minimum of one step per interval overshoots: take from the
        # interval with the most steps above its share.
        counts[np.argmax(np.where(counts > 1, counts - ideal, -np.inf))] -= 1
    pieces = [np.linspace(s, e, c + 1)[1:] for s, e, c in zip(starts, stops, counts, strict=True)]
    return np.concatenate([[a_initial], *pieces])


def evolve_kdk(
    positions: np.ndarray,
    momenta: np.ndarray,
    *,
    steps_a: np.ndarray,
    box_voxels: int,
    background: FlatLCDM,
    force: Callable[[np.ndarray], np.ndarray],
    on_step: Callable[[float, np.ndarray], None],
    progress: Callable[[], None] | None = None,
) -> None:
    """Kick-drift-kick leapfrog through the scale factors `steps_a`, updating positions (wrapped
    into the periodic box [0, box_voxels)) and momenta, both (3, P), in place, and calling
    on_step(a, positions) at every step boundary after the first.

    The force at the end of one step is the force at the start of the next, so a run of S steps
    costs S + 1 force evaluations.
    """
    forces = force(positions)
    drift = np.empty_like(positions)  # scratch, so a step allocates nothing of size P here
    for a0, a1 in pairwise(steps_a):
        a_half = 0.5 * (a0 + a1)
        forces *= np.float32(background.kick_factor(a0, a_half, a0))
        momenta += forces
        np.multiply(momenta, np.float32(background.drift_factor(a0, a1, a_half)), out=drift)
        positions += drift
        # Keep coordinates small so float32 keeps its resolution.
        np.mod(positions, np.float32(box_voxels), out=positions)
        forces = force(positions)
        momenta += forces * np.float32(background.kick_factor(a_half, a1, a1))
        on_step(float(a1), positions)
        if progress is not None:
            progress()
