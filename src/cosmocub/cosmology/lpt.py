"""Initial conditions: a Gaussian linear density field with a given P(k) and its Lagrangian (1LPT
and 2LPT) displacement fields on the particle lattice, one particle per voxel.

Displacements are in lattice units (voxels) at D1 = 1 (z = 0 linear amplitude); positions at
growth D1 are q + D1·Ψ1 + D2·Ψ2 with D2 = −3/7·D1² (Scoccimarro 1998, flat-ΛCDM approximation).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cosmocub.cosmology.fourier import TimedFFT, wavenumber_squared, wavevectors


def second_order_growth(growth: np.ndarray | float) -> np.ndarray:
    """D2(D1) = −3/7·D1² (the Ω_m(a)^(−1/143) correction is below a percent and dropped)."""
    return -3.0 / 7.0 * np.asarray(growth, dtype=np.float64) ** 2


def white_noise(rng: np.random.Generator, n: int) -> np.ndarray:
    """Unit-variance Gaussian white noise on n³ voxels, float32 (drawn in real space so the same
    seed gives the same field on every platform, whatever the FFT library)."""
    return rng.standard_normal((n, n, n), dtype=np.float32)


def linear_density_k(
    noise: np.ndarray,
    *,
    box_size: float,
    power: Callable[[np.ndarray], np.ndarray],
    fft: TimedFFT,
) -> np.ndarray:
    """Fourier modes δ_k (numpy's unnormalised rfftn convention) of the linear density at z = 0.

    noise: (n, n, n) unit white noise; box_size in Mpc/h; power: k [h/Mpc] → P [(Mpc/h)³].
    Each mode gets ⟨|δ_k|²⟩ = P(k)·n⁶/V. The k = 0 mode (the box has the mean density) and the
    Nyquist planes (whose derivatives are ill-defined on a real field) are set to zero.
    Returns complex64 of shape (n, n, n//2 + 1).
    """
    n = noise.shape[0]
    noise_k = fft.rfftn(noise)  # ⟨|w_k|²⟩ = n³
    k_mag = np.sqrt(wavenumber_squared(n, spacing=box_size / n))
    amplitude = np.sqrt(power(k_mag) * (n**3 / box_size**3)).astype(np.float32)
    amplitude[0, 0, 0] = 0.0
    if n % 2 == 0:
        amplitude[n // 2, :, :] = 0.0
        amplitude[:, n // 2, :] = 0.0
        amplitude[:, :, -1] = 0.0
    return noise_k * amplitude


def lpt_displacements(
    delta_k: np.ndarray, *, order: int, fft: TimedFFT
) -> tuple[np.ndarray, np.ndarray | None]:
    """First- and (order 2) second-order displacement fields of a linear density δ_k.

    Returns (psi1, psi2), each (3, n, n, n) float32 in voxels (psi2 None for order 1), with
    Ψ1 = −∇φ1, ∇²φ1 = δ and Ψ2 = ∇φ2, ∇²φ2 = Σ_{i<j} (φ1,ii·φ1,jj − φ1,ij²).
    """
    if order not in (1, 2):
        raise ValueError(f"lpt_displacements: order {order} must be 1 or 2")
    n = delta_k.shape[0]
    kvec = wavevectors(n)
    inv_k2 = (1.0 / wavenumber_squared(n)).astype(np.float32)
    inv_k2[0, 0, 0] = 0.0
    # Ψ1_k = i·k·δ_k / k²
    psi1 = np.empty((3, n, n, n), dtype=np.float32)
    for axis in range(3):
        psi1[axis] = fft.irfftn(1j * kvec[axis] * delta_k * inv_k2, n)
    if order == 1:
        return psi1, None

    # φ1,ij = k_i·k_j·δ_k / k²; accumulate the source term pair by pair to hold few fields at once.
    def hessian(i: int, j: int) -> np.ndarray:
        return fft.irfftn(kvec[i] * kvec[j] * delta_k * inv_k2, n)

    diagonal = [hessian(i, i) for i in range(3)]
    source = diagonal[0] * diagonal[1] + diagonal[0] * diagonal[2] + diagonal[1] * diagonal[2]
    del diagonal
    for i, j in ((0, 1), (0, 2), (1, 2)):
        source -= hessian(i, j) ** 2
    source_k = fft.rfftn(source)
    del source
    # Ψ2_k = i·k·φ2_k with φ2_k = −S_k / k²
    psi2 = np.empty((3, n, n, n), dtype=np.float32)
    for axis in range(3):
        psi2[axis] = fft.irfftn(-1j * kvec[axis] * source_k * inv_k2, n)
    return psi1, psi2
