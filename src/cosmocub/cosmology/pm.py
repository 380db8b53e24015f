"""Particle-mesh gravity: CIC mass assignment and force interpolation, an FFT Poisson solver, the
kick-drift-kick leapfrog in scale factor, and nearest-grid-point particle counts.

Positions are in lattice units (voxels, box side n) and momenta p = a³E·dx/da in the same units
(H0 = 1), so a universe's physical size enters only through its initial displacements.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from itertools import pairwise

import numpy as np

from cosmocub.cosmology.background import FlatLCDM
from cosmocub.cosmology.fourier import TimedFFT, wavenumber_squared, wavevectors
from cosmocub.cosmology.pm_kernels import (
    cic_deposit,
    cic_interpolate,
    drift,
    gradient_4point,
    kick,
    sort_by_voxel,
)


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


FORCE_GRADIENTS = ("finite_difference", "spectral")


class ParticleMeshForce:
    """F = −∇φ with ∇²φ = 1.5·Ω_m·δ on a periodic mesh of `mesh_factor` cells per voxel per side:
    CIC assignment, the Poisson solve in Fourier space, the gradient either by the 4-point
    finite difference on the mesh (one inverse FFT) or in Fourier space (three), and CIC
    interpolation. The mesh-sized arrays are allocated once per universe and reused each step."""

    def __init__(
        self,
        *,
        n: int,
        mesh_factor: int,
        omega_m: float,
        fft: TimedFFT,
        gradient: str = "finite_difference",
    ) -> None:
        if gradient not in FORCE_GRADIENTS:
            raise ValueError(
                f"ParticleMeshForce: gradient {gradient!r} is not one of {FORCE_GRADIENTS}"
            )
        self.n = n
        self.mesh_factor = mesh_factor
        self.mesh_size = m = n * mesh_factor
        self.omega_m = omega_m
        self.fft = fft
        self.gradient = gradient
        self.ik, inv_k2 = _force_kernels(self.mesh_size, mesh_factor)
        self.green = np.float32(1.5 * omega_m) * inv_k2  # −φ_k / δ_k
        self._density = np.empty((m, m, m), dtype=np.float32)
        if gradient == "finite_difference":
            self._force_mesh = np.empty((m, m, m, 3), dtype=np.float32)  # F, channels last
        else:
            self._force_k = np.empty((m, m, m // 2 + 1, 3), dtype=np.complex64)  # F_k, the same
        self._forces = np.empty((3, n**3), dtype=np.float32)

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """positions (3, P) in voxels → forces (3, P) float32 in voxels·H0². The array returned
        is overwritten by the next call."""
        m = self.mesh_size
        density = self._density
        cic_deposit(positions, self.mesh_factor, density)
        # Mean particles per mesh cell is n³/m³ = 1/mesh_factor³.
        density *= np.float32(self.mesh_factor**3)
        density -= np.float32(1.0)
        neg_potential_k = self.fft.rfftn(density)
        neg_potential_k *= self.green
        if self.gradient == "finite_difference":
            neg_potential = self.fft.irfftn(neg_potential_k, m)
            gradient_4point(neg_potential, self.mesh_factor, self._force_mesh)
            force_mesh = self._force_mesh
        else:
            # F_k = −i·k·φ_k = i·k·(−φ_k), the three axes channels last so that one batched
            # inverse FFT gives (m, m, m, 3).
            for axis in range(3):
                np.multiply(neg_potential_k, self.ik[axis], out=self._force_k[..., axis])
            force_mesh = self.fft.irfftn(self._force_k, m, axes=(0, 1, 2))
        cic_interpolate(force_mesh, positions, self.mesh_factor, self._forces)
        return self._forces


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
    into the periodic box [0, box_voxels)) and momenta, both (3, P), in place (the particles
    reordered by voxel each step, both arrays alike), and calling on_step(a, positions) at
    every step boundary after the first.

    The force at the end of one step is the force at the start of the next, so a run of S steps
    costs S + 1 force evaluations.
    """
    forces = force(positions)
    for a0, a1 in pairwise(steps_a):
        a_half = 0.5 * (a0 + a1)
        kick(momenta, forces, background.kick_factor(a0, a_half, a0))
        drift(positions, momenta, background.drift_factor(a0, a1, a_half), box_voxels)
        # The particles' order is nobody's business (snapshots count them per voxel), and in
        # the mesh's order the force's loops read the mesh in memory order.
        sort_by_voxel(positions, momenta, box_voxels)
        forces = force(positions)
        kick(momenta, forces, background.kick_factor(a_half, a1, a1))
        on_step(float(a1), positions)
        if progress is not None:
            progress()
