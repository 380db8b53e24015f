"""Known-answer universes: fields whose parameters sit in a statistic known beforehand, so that a
CNN's error against the classical fits says whether it learns what the fields hold.

A universe has the cosmoUniverse layout of the synthetic N-body ones (4 channels, 4 unitPar),
made of three cases, one per channel (the fourth repeats the third), each with its own seed:
- channel 0, Gaussian: a Gaussian random field with P(k) = A²·(k/k_p)^n; A (unitPar 0) and n
  (unitPar 1) enter only P(k), which is a sufficient statistic: nothing beats the P(k) fit;
- channel 1, lognormal: t = (exp(h − σ²/2) − 1)/b with b² = exp(σ²) − 1, h Gaussian with the
  covariance log(1 + b²C(r)), so that t has unit variance and the fixed covariance C(r) for every
  σ (unitPar 2): σ moves the one-point PDF (t's skewness) at fixed P(k);
- channels 2 and 3, phases: g + f·(g² − 1) (f: unitPar 3) brought to a fixed amplitude |δ(k)| on
  every mode and to a fixed set of one-point values (Gaussian quantiles) by alternating the two
  (IAAFT), ending on the values: the one-point PDF is the same in every universe, P(k) within
  the iteration's residual; f is left in the phases alone.
Each field y is stored as counts n = round(n̄·(1 + ε·y)), so log1p(n) ≈ log n̄ + ε·y and the
count overdensity the P(k) features take is ε·y. All spectra share the shape k^n up to the
Nyquist |k| = π per voxel and none above it (the P(k) features' last bin ends there).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from cosmocub import __version__
from cosmocub.cosmology.power import rfft_mode_weight
from cosmocub.data.features import k_magnitude
from cosmocub.data.universe import write_universe

CASES = ("gaussian", "lognormal", "phase", "phase")  # the case in each channel
# What each unitPar slot is in a known-answer universe; evaluation names them so in metrics.json
# (evaluate_run.parameter_space), while training's metrics.jsonl keeps the N-body names per slot.
PARAMETERS = ("amplitude", "slope", "lognormal_sigma", "f_nl")
PARAMETER_CASE = {"amplitude": "gaussian", "slope": "gaussian"} | {
    "lognormal_sigma": "lognormal",
    "f_nl": "phase",
}


@dataclass(frozen=True, kw_only=True)
class KnownAnswerDesign:
    """The parameters' ranges: physical = centre + half_range·u for u in [-1, 1); chosen so that
    the classical fits land between exact and the mean (docs/explanation/known_answer.md)."""

    amplitude: tuple[float, float] = (0.1, 0.004)  # A: the Gaussian field's std at u = 0
    slope: tuple[float, float] = (-2.0, 0.08)  # n of P(k) ∝ k^n, k in radians per voxel
    lognormal_sigma: tuple[float, float] = (0.45, 0.005)  # σ of the lognormal's Gaussian h
    f_nl: tuple[float, float] = (0.0, 0.5)  # f of g + f·(g² − 1)
    reference_slope: float = -2.0  # the lognormal and phase cases' fixed spectrum shape
    pivot_k: float = 1.0  # k_p (radians per voxel): A is the amplitude there
    mean_count: float = 1000.0  # n̄
    scale: float = 0.1  # ε: the stored overdensity per unit of the lognormal and phase fields
    iterations: int = 20  # IAAFT rounds of the phase case

    def physical(self, unit_par: np.ndarray) -> np.ndarray:
        ranges = np.array([getattr(self, name) for name in PARAMETERS], dtype=np.float64)
        return ranges[:, 0] + ranges[:, 1] * np.asarray(unit_par, dtype=np.float64)


DESIGN = KnownAnswerDesign()


def power_law(size: int, slope: float, *, pivot_k: float = 1.0) -> np.ndarray:
    """(k/k_p)^slope on the rfftn grid, 0 at k = 0 and above the Nyquist |k| = π."""
    k = k_magnitude(size)
    inside = (k > 0) & (k <= np.pi * (1 + 1e-9))
    out = np.zeros_like(k)
    out[inside] = (k[inside] / pivot_k) ** slope
    return out


def mode_mean(power_k: np.ndarray, size: int) -> float:
    """The mean of power_k over the full grid of modes, given on the rfftn half (its planes
    other than kz = 0 and Nyquist stand for their mirror images too): a field's variance."""
    return float(np.sum(power_k * rfft_mode_weight(size)) / size**3)


def unit_variance(power_k: np.ndarray, size: int) -> np.ndarray:
    """power_k scaled so that a field with it has unit variance."""
    return power_k / mode_mean(power_k, size)


def gaussian_field(rng: np.random.Generator, power_k: np.ndarray, size: int) -> np.ndarray:
    """A Gaussian random field with variance per mode `power_k` (rfftn grid): white noise of unit
    variance filtered by √P, so its variance is `mode_mean(power_k)`."""
    noise_k = np.fft.rfftn(rng.standard_normal((size,) * 3))
    return np.fft.irfftn(noise_k * np.sqrt(power_k), s=(size,) * 3, axes=(0, 1, 2))


def gaussian_case(
    rng: np.random.Generator,
    size: int,
    *,
    amplitude: float,
    slope: float,
    pivot_k: float = 1.0,
    reference_slope: float = DESIGN.reference_slope,
) -> np.ndarray:
    """Case (a): P(k) ∝ amplitude²·(k/k_p)^slope, normalised so that amplitude is the field's
    std at the reference slope (and P at the pivot is amplitude² times the same constant at
    every slope)."""
    norm = mode_mean(power_law(size, reference_slope, pivot_k=pivot_k), size)
    return gaussian_field(rng, amplitude**2 * power_law(size, slope, pivot_k=pivot_k) / norm, size)


def lognormal_case(
    rng: np.random.Generator,
    size: int,
    *,
    sigma: float,
    reference_slope: float = DESIGN.reference_slope,
) -> np.ndarray:
    """Case (b): t = (exp(h − s²/2) − 1)/b, unit variance and covariance C(r) (the reference
    spectrum's) for every σ; h has covariance log(1 + b²C(r)), b² = exp(σ²) − 1, s² its variance
    (σ² up to the modes a positive spectrum of h must drop: there are none at these σ)."""
    shape = unit_variance(power_law(size, reference_slope), size)
    cov_r = np.fft.irfftn(shape, s=(size,) * 3, axes=(0, 1, 2))  # C(r), C(0) = 1
    b_sq = np.expm1(sigma**2)
    power_h = np.fft.rfftn(np.log1p(b_sq * cov_r)).real
    power_h = np.maximum(power_h, 0.0)
    h = gaussian_field(rng, power_h, size)
    variance = mode_mean(power_h, size)
    return np.expm1(h - variance / 2) / np.sqrt(b_sq)


def phase_case(
    rng: np.random.Generator,
    size: int,
    *,
    f_nl: float,
    iterations: int,
    reference_slope: float = DESIGN.reference_slope,
) -> np.ndarray:
    """Case (c): g + f·(g² − 1) with g of the reference spectrum, then `iterations` rounds of
    imposing the amplitudes √(N³·S(k)) and rank-ordering onto the Gaussian quantiles, ending on
    the ranks: every universe has the same one-point values, whatever f, and |δ(k)| per mode
    within the iteration's residual (log P(k) moves ~5e-5 from f = −1 to 1 at 32³ after 20
    rounds, ending on the amplitudes instead left the skewness moving ~2e-4 with f)."""
    shape = unit_variance(power_law(size, reference_slope), size)
    g = gaussian_field(rng, shape, size)
    field = g + f_nl * (g * g - 1.0)
    amplitude = np.sqrt(shape * size**3)
    values = np.sort(gaussian_quantiles(size**3))
    for _ in range(iterations):
        field = _impose_amplitudes(field, amplitude, size)
        ranks = np.argsort(np.argsort(field, axis=None))
        field = values[ranks].reshape(field.shape)
    return field


def gaussian_quantiles(count: int) -> np.ndarray:
    """The standard normal's quantiles at (i + ½)/count: the phase case's one-point values."""
    from scipy.special import ndtri

    return ndtri((np.arange(count) + 0.5) / count)


def _impose_amplitudes(field: np.ndarray, amplitude: np.ndarray, size: int) -> np.ndarray:
    field_k = np.fft.rfftn(field)
    modulus = np.abs(field_k)
    phase = np.where(modulus > 0, field_k / np.where(modulus > 0, modulus, 1.0), 1.0)
    return np.fft.irfftn(amplitude * phase, s=(size,) * 3, axes=(0, 1, 2))


def stored_counts(fields: np.ndarray, design: KnownAnswerDesign = DESIGN) -> np.ndarray:
    """The counts a field is stored as: n = round(n̄·(1 + field)), float64."""
    return np.rint(design.mean_count * (1.0 + fields))


@dataclass(frozen=True, kw_only=True)
class KnownAnswerUniverse:
    counts_dhwc: np.ndarray  # (N, N, N, 4) int16: the cases of CASES, one a channel
    unit_par: np.ndarray  # (4,) float32 in [-1, 1): the slots of PARAMETERS
    phys_par: np.ndarray  # (4,) float32: DESIGN.physical(unit_par)
    seconds: float


def known_answer_universe(
    *, size: int, seed: int, unit_par: np.ndarray | None = None, design: KnownAnswerDesign = DESIGN
) -> KnownAnswerUniverse:
    """The known-answer universe of `seed` (deterministic): its parameters drawn uniformly in
    [-1, 1) unless given, each channel's field from a random stream of its own (so a universe
    that differs only in unit_par has the same white noise in every channel)."""
    start = time.perf_counter()
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)]
    drawn = streams[0].uniform(-1.0, 1.0, size=4).astype(np.float32)
    unit = drawn if unit_par is None else np.asarray(unit_par, dtype=np.float32)
    unit = np.minimum(unit, np.nextafter(np.float32(1.0), np.float32(0.0)))
    if unit.shape != (4,) or np.any(unit < -1.0):
        raise ValueError(f"known_answer_universe: unit_par {unit.tolist()} must be 4 in [-1, 1)")
    amplitude, slope, sigma, f_nl = design.physical(unit)
    reference = design.reference_slope
    fields = [
        gaussian_case(
            streams[1],
            size,
            amplitude=amplitude,
            slope=slope,
            pivot_k=design.pivot_k,
            reference_slope=reference,
        ),
        design.scale * lognormal_case(streams[2], size, sigma=sigma, reference_slope=reference),
        *(
            design.scale
            * phase_case(
                stream, size, f_nl=f_nl, iterations=design.iterations, reference_slope=reference
            )
            for stream in streams[3:]
        ),
    ]
    counts = stored_counts(np.stack(fields, axis=-1), design)
    low, high = float(counts.min()), float(counts.max())
    if low < 0 or high > np.iinfo(np.int16).max:
        raise ValueError(
            f"known-answer seed {seed}: counts in [{low:g}, {high:g}] leave int16's [0, 32767]; "
            f"lower KnownAnswerDesign.scale or mean_count"
        )
    return KnownAnswerUniverse(
        counts_dhwc=counts.astype(np.int16),
        unit_par=unit,
        phys_par=design.physical(unit).astype(np.float32),
        seconds=time.perf_counter() - start,
    )


def run_known_answer(out: str | os.PathLike, *, size: int, seed: int) -> dict[str, float]:
    """Make the known-answer universe of `seed` and write it to `out` in the cosmoUniverse
    layout (atomically); returns per channel the std and skewness of its overdensity, and the
    wall time, for MLflow."""
    universe = known_answer_universe(size=size, seed=seed)
    attrs: dict[str, Any] = {
        "cosmocub_seed": seed,
        "generator": f"cosmocub {__version__}: known-answer fields",
        "channel_cases": list(CASES),
        "parameters": list(PARAMETERS),
        "mean_count": DESIGN.mean_count,
    }
    write_universe(
        out,
        universe.counts_dhwc,
        unit_par=universe.unit_par,
        phys_par=universe.phys_par,
        redshifts=np.zeros(len(CASES), dtype=np.float32),  # channels are cases, not redshifts
        attrs=attrs,
    )
    delta = universe.counts_dhwc.astype(np.float64) / DESIGN.mean_count - 1.0
    metrics = {"wall_time_s": universe.seconds}
    for c in range(delta.shape[-1]):
        d = delta[..., c] - delta[..., c].mean()
        metrics[f"std_c{c}"] = float(d.std())
        metrics[f"skewness_c{c}"] = float(np.mean(d**3) / d.std() ** 3)
    return metrics
