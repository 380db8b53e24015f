"""Case (a) of the known-answer study beside its floor: the Bayes estimate of the Gaussian
channel's amplitude and slope from its P(k), under the field's exact likelihood.

The goal CNN ÷ P(k) fit in [0.95, 1.1] takes the ridge on 10 binned log powers as the known
answer; it is linear in P(k), and with the parameters' bounded (uniform) prior the best
estimate from P(k) is not (docs/explanation/known_answer.md, "Case (a): the floor": 0.84 × the
ridge's
error on the amplitude, from a Fisher estimate). A network with the spectrum in its tap can beat
the ridge and still use nothing beyond P(k); what it cannot beat, but by the test set's noise, is
this estimate. So the study sets the CNN beside it, per universe and seed.

Per test universe: the count overdensity δ = counts/n̄ − 1 of channel 0 (exact: the counts are
integers, stored as log1p), its power summed over each shell of equal |k|² up to the Nyquist
|k| = π; each mode's power is exponential (a complex pair) or χ²₁ (a real mode) about
N³·(P_θ(k) + the counts' rounding, 1/(12·n̄²) a voxel), P_θ as known_answer_fields.gaussian_case
builds it. The log-likelihood on a grid of (amplitude, slope) in unitPar, the design's uniform
prior, and each parameter's marginal posterior median (the estimate with the least expected
absolute error, the MAE the study reports). No fitting: nothing is read from the training split.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cosmocub.cosmology.power import rfft_mode_weight
from cosmocub.data.features import k_magnitude
from cosmocub.data.known_answer_fields import (
    CASES,
    DESIGN,
    PARAMETERS,
    KnownAnswerDesign,
    mode_mean,
    power_law,
)
from cosmocub.studies.known_answer_shards import (
    counts,
    open_log1p_counts,
    per_universe,
    split_labels,
)

# The fit this module adds, as a baseline of the study's amplitude and slope rows.
FIT = "pk_likelihood"
FITTED = ("amplitude", "slope")
CHANNEL = CASES.index("gaussian")
GRID = 161  # cells per unitPar axis on [-1, 1): 0.0125 wide, ~1/30 of the posterior's width


def shell_powers(delta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(k of each shell in radians per voxel, its number of real degrees of freedom, (B, shells)
    its summed |δ_k|² / N³) for a batch of (B, N, N, N) fields, over the shells of equal integer
    |k|² with 0 < |k| ≤ π. Each mode of the full grid counts once (a real field's δ_{-k} is δ_k's
    conjugate: the pair is two real degrees of freedom of variance N³P/2, the rfft's weight 2)."""
    n = delta.shape[-1]
    # |k|² in grid units, an integer on every mode: the shells are its distinct values.
    k2 = np.rint((k_magnitude(n) * n / (2.0 * np.pi)).ravel() ** 2).astype(np.int64)
    inside = np.flatnonzero((k2 > 0) & (k2 <= (n // 2) ** 2))
    shells, which = np.unique(k2[inside], return_inverse=True)
    weight = np.broadcast_to(rfft_mode_weight(n), (n, n, n // 2 + 1)).ravel()[inside]
    power = np.abs(np.fft.rfftn(delta, axes=(-3, -2, -1)).reshape(len(delta), -1)[:, inside]) ** 2
    summed = np.zeros((len(delta), len(shells)))
    for b in range(len(delta)):
        summed[b] = np.bincount(which, weights=weight * power[b], minlength=len(shells))
    dof = np.bincount(which, weights=weight, minlength=len(shells))
    return 2.0 * np.pi * np.sqrt(shells) / n, dof, summed / n**3


def unit_grid(cells: int = GRID) -> np.ndarray:
    """The cells' midpoints on [-1, 1)."""
    return -1.0 + (np.arange(cells) + 0.5) * 2.0 / cells


def model_power(
    k: np.ndarray, size: int, *, design: KnownAnswerDesign = DESIGN, cells: int = GRID
) -> np.ndarray:
    """(cells, cells, shells): the expected power a voxel of each shell at every grid point
    (amplitude's unitPar first, slope's second), the counts' rounding included."""
    u = unit_grid(cells)
    amplitude = design.amplitude[0] + design.amplitude[1] * u
    slope = design.slope[0] + design.slope[1] * u
    norm = mode_mean(power_law(size, design.reference_slope, pivot_k=design.pivot_k), size)
    shape = (k / design.pivot_k)[None, :] ** slope[:, None]  # (slope, shell)
    rounding = 1.0 / (12.0 * design.mean_count**2)
    return amplitude[:, None, None] ** 2 * shape[None, :, :] / norm + rounding


def posterior_medians(
    delta: np.ndarray, *, design: KnownAnswerDesign = DESIGN, cells: int = GRID
) -> np.ndarray:
    """(B, 2): each field's marginal posterior median of (amplitude, slope) in unitPar, uniform
    prior on [-1, 1)², the Gaussian likelihood of its shells' powers."""
    k, dof, summed = shell_powers(delta)
    power = model_power(k, delta.shape[-1], design=design, cells=cells)
    # −2 log L = Σ_shell (dof·log P + summed / P) + const: a real mode of variance N³P gives
    # log P + δ²/(N³P); a pair δ_k, δ_-k (two halves of variance N³P/2) 2 log P + 2|δ_k|²/(N³P).
    flat = power.reshape(-1, len(k))
    log_like = -0.5 * ((np.log(flat) @ dof)[:, None] + (1.0 / flat) @ summed.T)  # (cells², B)
    log_like -= log_like.max(axis=0, keepdims=True)
    posterior = np.exp(log_like).reshape(cells, cells, -1)
    posterior /= posterior.sum(axis=(0, 1), keepdims=True)
    edges = np.linspace(-1.0, 1.0, cells + 1)
    out = np.empty((delta.shape[0], 2))
    for j, marginal in enumerate((posterior.sum(axis=1), posterior.sum(axis=0))):
        cumulative = np.vstack([np.zeros(marginal.shape[1]), np.cumsum(marginal, axis=0)])
        for b in range(marginal.shape[1]):
            out[b, j] = np.interp(0.5, cumulative[:, b], edges)
    return out


def overdensity(counts_: np.ndarray, design: KnownAnswerDesign = DESIGN) -> np.ndarray:
    """The count overdensity counts/n̄ − 1 the Gaussian channel was stored as (n̄ = mean_count)."""
    return counts_ / design.mean_count - 1.0


def likelihood_fit_errors(
    shards: Path, *, design: KnownAnswerDesign = DESIGN
) -> tuple[np.ndarray, dict[str, dict[str, np.ndarray]]]:
    """(test universes, {parameter: {FIT: per-universe |error| in unitPar}}) of the P(k)
    likelihood's posterior medians of amplitude and slope on the test split; universes sorted
    as predictions.npz's (a universe's rows averaged, as the evaluation's per-universe errors)."""
    shard = Path(shards) / "test.h5"
    f, x = open_log1p_counts(shard, "the P(k) likelihood")
    with f:
        delta = overdensity(counts(x[:, CHANNEL]), design)
    y, where = split_labels(shard)
    estimate = posterior_medians(delta, design=design)
    out = {}
    for j, name in enumerate(FITTED):
        universes, errors = per_universe(
            np.abs(estimate[:, j] - y[:, PARAMETERS.index(name)]), where
        )
        out[name] = {FIT: errors}
    return universes, out
