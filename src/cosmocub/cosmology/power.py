"""Power spectra: the linear P(k) that seeds a universe (colossus) and the estimator that measures
one.

The estimator is shared by the tests (initial field against input) and what compared synthetic
against real universes (benchmarks/realism.py, removed; last at a39a33b,
docs/explanation/benchmarks.md), so
both read k and P in the same units: h/Mpc and (Mpc/h)³.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
from colossus.cosmology.cosmology import Cosmology

# Fixed by the public generator (docs/reference/formats.md): flat, Ω_b = 0.045.
OMEGA_B = 0.045
# Table range for the interpolated P(k): a 512 Mpc/h box at 1 Mpc/h voxels needs 0.012–5.4 h/Mpc.
_K_TABLE = np.logspace(-4.0, 2.0, 600)

_cosmology_ids = itertools.count()


def linear_power_spectrum(
    *, omega_m: float, sigma_8: float, n_s: float, h0: float
) -> Callable[[np.ndarray], np.ndarray]:
    """Linear matter P(k) at z = 0, Eisenstein & Hu (1998) transfer function, normalised to σ_8.

    Returns a function of k [h/Mpc] → P [(Mpc/h)³] (0 at k = 0). colossus keeps a global "current"
    cosmology; a private Cosmology object per call leaves it alone, and `persistence=""` keeps
    colossus from writing its interpolation tables to ~/.colossus from every simulation job.
    """
    cosmo = Cosmology(
        name=f"cosmocub-{next(_cosmology_ids)}",
        flat=True,
        Om0=float(omega_m),
        Ob0=OMEGA_B,
        H0=float(h0),
        sigma8=float(sigma_8),
        ns=float(n_s),
        relspecies=False,
        persistence="",
        print_warnings=False,
    )
    log_k = np.log(_K_TABLE)
    log_p = np.log(cosmo.matterPowerSpectrum(_K_TABLE, z=0.0, model="eisenstein98"))

    def power(k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        out = np.zeros_like(k)
        positive = k > 0
        out[positive] = np.exp(np.interp(np.log(k[positive]), log_k, log_p))
        return out

    return power


def overdensity(counts: np.ndarray) -> np.ndarray:
    """δ = n / n̄ − 1 of a count field (float32)."""
    counts = np.asarray(counts, dtype=np.float32)
    mean = float(counts.mean(dtype=np.float64))
    if mean <= 0:
        raise ValueError(f"overdensity: field of shape {counts.shape} has mean {mean}, need > 0")
    return counts / np.float32(mean) - np.float32(1.0)


def measure_power_spectrum(
    field: np.ndarray, box_size: float, *, num_bins: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Spherically averaged power spectrum of a periodic cubic field (e.g. an overdensity).

    `box_size` is the side in Mpc/h. Bins are linear in |k|, one fundamental mode 2π/box wide
    by default, from the fundamental to the Nyquist wavenumber. Returns (k, P, n_modes): the
    mean |k| of the modes in each bin [h/Mpc], the mean power [(Mpc/h)³] and the number of
    Fourier modes (counting k and −k separately) in each bin; empty bins are dropped.
    """
    n = _cube_side(field, box_size)
    k_fund = 2.0 * np.pi / box_size
    bins = num_bins if num_bins is not None else n // 2
    edges = np.linspace(0.5 * k_fund, k_fund * (n // 2) + 0.5 * k_fund, bins + 1)
    k, power, n_modes = binned_power_spectrum(field, box_size, edges)
    filled = n_modes > 0
    return k[filled], power[filled], n_modes[filled]


def log_k_edges(n: int, box_size: float, num_bins: int) -> np.ndarray:
    """`num_bins` + 1 log-spaced |k| edges from the fundamental 2π/box to the Nyquist π·n/box.

    The first edge sits just below the fundamental and the last just above Nyquist, so both
    end modes fall inside; on a small cube some bins can hold no mode (their P is NaN).
    """
    k_fund = 2.0 * np.pi / box_size
    edges = k_fund * np.geomspace(1.0, n / 2, num_bins + 1)
    edges[0] *= 1.0 - 1e-6
    edges[-1] *= 1.0 + 1e-6
    return edges


def binned_power_spectrum(
    field: np.ndarray,
    box_size: float,
    edges: np.ndarray,
    *,
    shot_noise: float = 0.0,
    window: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """P(k) of a cubic field (DESIGN.md, "Field statistics") averaged in the |k| bins `edges`.

    P = V·|DFT(field)|²/n⁶ per mode, divided by the squared mass-assignment window (`window`
    "ngp" or "cic": W(k) = Π sinc(k_i·Δ/2)^p, p = 1 or 2; None: no correction), minus
    `shot_noise` (V / number of particles for a count field's overdensity; 0 for a continuous
    field). Returns (k, P, n_modes) per bin, every bin kept: NaN k and P where a bin has no mode.
    """
    n = _cube_side(field, box_size)
    volume = float(box_size) ** 3
    field_k = np.fft.rfftn(np.asarray(field, dtype=np.float64))
    # Continuum convention: δ̃(k) = (V/N³)·DFT, P = |δ̃|²/V.
    power = (field_k.real**2 + field_k.imag**2) * (volume / float(n) ** 6)

    k_fund = 2.0 * np.pi / box_size
    k1d = np.fft.fftfreq(n, d=1.0 / n) * k_fund
    kz = np.fft.rfftfreq(n, d=1.0 / n) * k_fund
    if window is not None:
        exponent = {"ngp": 1, "cic": 2}.get(window)
        if exponent is None:
            raise ValueError(f"binned_power_spectrum: window {window!r} is not 'ngp' or 'cic'")
        half_cell = 0.5 * box_size / n
        w1, wz = np.sinc(k1d * half_cell / np.pi), np.sinc(kz * half_cell / np.pi)
        w3 = (w1[:, None, None] * w1[None, :, None] * wz[None, None, :]) ** exponent
        power = power / w3**2
    power = power - shot_noise
    k_mag = np.sqrt(k1d[:, None, None] ** 2 + k1d[None, :, None] ** 2 + kz[None, None, :] ** 2)
    num_bins = len(edges) - 1
    inside, which, w = rfft_bins(k_mag, edges)
    n_modes = np.bincount(which, weights=w, minlength=num_bins)
    k_sum = np.bincount(which, weights=w * k_mag.ravel()[inside], minlength=num_bins)
    p_sum = np.bincount(which, weights=w * power.ravel()[inside], minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return k_sum / n_modes, p_sum / n_modes, n_modes.astype(np.int64)


def rfft_mode_weight(n: int) -> np.ndarray:
    """(n//2 + 1,) the weight of each kz plane of an n³ cube's rfftn grid: the rfft stores half
    the modes, so every plane but kz = 0 (and Nyquist, for even n) stands for itself and its
    mirror image (2), those two for themselves (1)."""
    weight = np.full(n // 2 + 1, 2.0)
    weight[0] = 1.0
    if n % 2 == 0:
        weight[-1] = 1.0
    return weight


def rfft_bins(k_mag: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, ...]:
    """The modes of an rfftn grid (|k| `k_mag`, (n, n, n//2 + 1)) that fall in the bins
    `edges`: (their flat indices, their bins, their `rfft_mode_weight`s)."""
    which = np.digitize(k_mag.ravel(), edges) - 1
    inside = np.flatnonzero((which >= 0) & (which < len(edges) - 1))
    weight = np.broadcast_to(rfft_mode_weight(k_mag.shape[0]), k_mag.shape).ravel()
    return inside, which[inside], weight[inside]


def _cube_side(field: np.ndarray, box_size: float) -> int:
    shape = np.shape(field)
    if len(shape) != 3 or len(set(shape)) != 1:
        raise ValueError(f"power spectrum: field shape {shape} is not a cube")
    if box_size <= 0:
        raise ValueError(f"power spectrum: box_size {box_size} must be > 0")
    return int(shape[0])
