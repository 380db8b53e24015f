"""Per-universe estimates and calibrated intervals from per-crop Gaussian predictions.

Pure numpy: a universe's crops combine by inverse-variance weighting; crops of one universe are
correlated (they share its parameters and its large-scale modes), so the combined variance
1/Σw is too small by a factor that validation measures; a per-parameter temperature does the same
for single crops. Both factors are fitted on the coverage they give on validation
(`coverage_scale`), not on the likelihood alone. Coverage counts true values inside the central
68 % and 95 % intervals.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

COVERAGE_LEVELS = (0.68, 0.95)
# Expected coverage levels of the calibration plot.
CURVE_LEVELS = np.round(np.linspace(0.05, 0.95, 19), 2)
# Observed coverage this far (in points) from nominal counts as miscalibrated.
COVERAGE_TOLERANCE = 0.07


def universe_index_groups(universe_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the sorted universe indices, each sample's row among them)."""
    universes, inverse = np.unique(np.asarray(universe_index), return_inverse=True)
    return universes, inverse


def mean_per_universe(values: np.ndarray, universe_index: np.ndarray) -> np.ndarray:
    """(U, P) mean of the (N, P) rows of each universe (sorted by universe index)."""
    universes, inverse = universe_index_groups(universe_index)
    sums = np.zeros((len(universes), values.shape[1]))
    np.add.at(sums, inverse, values)
    return sums / np.bincount(inverse, minlength=len(universes))[:, None]


def combine_crops(
    mean: np.ndarray, var: np.ndarray, universe_index: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Inverse-variance weighted (U, P) means and their variance 1/Σ(1/σ²) for independent crops.

    Multiply the variance by an inflation factor (`coverage_scale` on validation) to account for
    the crops' correlation.
    """
    if mean.shape != var.shape or np.any(var <= 0):
        raise ValueError(f"combine_crops: mean {mean.shape} and var {var.shape} (> 0) must match")
    universes, inverse = universe_index_groups(universe_index)
    weights = 1.0 / var
    w_sum = np.zeros((len(universes), mean.shape[1]))
    wm_sum = np.zeros_like(w_sum)
    np.add.at(w_sum, inverse, weights)
    np.add.at(wm_sum, inverse, weights * mean)
    return wm_sum / w_sum, 1.0 / w_sum


def variance_scale(mean: np.ndarray, var: np.ndarray, true: np.ndarray) -> np.ndarray:
    """(P,) factor s that makes the variances fit: the maximum-likelihood s of N(true; mean, s·var),
    i.e. the mean squared standardised error (a temperature T = √s)."""
    z2 = (true - mean) ** 2 / var
    return z2.mean(axis=0)


def coverage_scale(
    mean: np.ndarray, var: np.ndarray, true: np.ndarray, levels=COVERAGE_LEVELS
) -> np.ndarray:
    """(P,) variance factor s whose central Gaussian intervals at `levels` cover the rows as
    nominally as any s can: the least sum of squared gaps |observed − level|² over the levels,
    ties going to the s nearest (in log) the maximum-likelihood scale (`variance_scale`).

    The likelihood scale fits the errors' second moment, which is the intervals' coverage only
    for Gaussian errors. Where a parameter is barely learnt the errors are those of a bounded
    prior (a predicted mean near the centre of a uniform range): √s is then their RMS, whose ±1σ
    covers 58 % and ±1.96σ 100 %. Measured on the universes study's 200 test universes
    (docs/explanation/universes_study.md): H_0's 68 % coverage 0.46–0.51 with the likelihood scale.
    Fitted
    on coverage, the 68 % interval holds 68 % and the 95 % one cannot be above 100 %, so both
    stay within 5 points. The candidates are the scales at which a row enters a level's
    interval, (z/h_level)², where coverage changes."""
    z = np.abs(true - mean) / np.sqrt(var)
    half_widths = norm.ppf(0.5 + 0.5 * np.asarray(levels, dtype=np.float64))
    likelihood = variance_scale(mean, var, true)
    out = likelihood.astype(np.float64).copy()
    for j in range(z.shape[1]):
        candidates = ((z[:, j, None] / half_widths[None, :]) ** 2).reshape(-1)
        candidates = np.unique(candidates[candidates > 0])
        if not len(candidates):  # every row exact: nothing to widen for
            continue
        # (C, L) coverage at each candidate, by counting in the sorted |z| (a row is inside
        # where z ≤ h·√s): C log N, not a (C, N) table, since validation can hold many crops.
        sorted_z = np.sort(z[:, j])
        bounds = half_widths[None, :] * np.sqrt(candidates)[:, None]
        observed = np.searchsorted(sorted_z, bounds, side="right") / len(sorted_z)
        gaps = ((observed - np.asarray(levels)[None, :]) ** 2).sum(axis=1)
        best = np.flatnonzero(gaps <= gaps.min() + 1e-12)
        near = np.argmin(np.abs(np.log(candidates[best] / likelihood[j])))
        out[j] = candidates[best[near]]
    return out


def coverage(
    mean: np.ndarray, var: np.ndarray, true: np.ndarray, levels=COVERAGE_LEVELS
) -> np.ndarray:
    """(L, P) share of true values inside the central Gaussian interval of each level."""
    z = np.abs(true - mean) / np.sqrt(var)
    half_widths = norm.ppf(0.5 + 0.5 * np.asarray(levels, dtype=np.float64))
    return (z[None, :, :] <= half_widths[:, None, None]).mean(axis=1)


def held_out_coverage(
    mean: np.ndarray,
    var: np.ndarray,
    true: np.ndarray,
    *,
    folds: int = 5,
    levels=COVERAGE_LEVELS,
) -> np.ndarray:
    """(L, P) coverage of the rows, each row's interval scaled by the `coverage_scale` fitted on
    the other folds (row i in fold i % folds): the calibration's coverage on rows it was not
    fitted on, from the validation split alone.

    What the test's coverage says mixes two things: how well the scale fitted on validation
    holds, and how alike the test universes' errors are to validation's (200 test universes
    give a 68 % fraction a binomial σ of 3.3 points). This separates the first, over all the
    validation rows. The rows should be in no particular order (validation universes are a
    seeded permutation, data/splits.py)."""
    n = len(mean)
    if not 2 <= folds <= n:
        raise ValueError(f"held_out_coverage: {folds} folds for {n} rows (need 2 ≤ folds ≤ rows)")
    fold = np.arange(n) % folds
    scaled = np.empty_like(np.asarray(var, dtype=np.float64))
    for k in range(folds):
        fit, held = fold != k, fold == k
        scaled[held] = var[held] * coverage_scale(mean[fit], var[fit], true[fit], levels)
    return coverage(mean, scaled, true, levels)


def error_rms(mean: np.ndarray, var: np.ndarray, true: np.ndarray) -> np.ndarray:
    """(P,) root mean square of the standardised errors (true − mean) / σ: 1 where the
    variances fit the errors' spread, below 1 where the errors are smaller than predicted."""
    return np.sqrt(((true - mean) ** 2 / var).mean(axis=0))


def interval_width(var: np.ndarray, level: float) -> np.ndarray:
    """(P,) mean full width of the central interval of `level`."""
    return 2 * norm.ppf(0.5 + 0.5 * level) * np.sqrt(var).mean(axis=0)


def gaussian_nll(mean: np.ndarray, var: np.ndarray, true: np.ndarray) -> np.ndarray:
    """(P,) mean Gaussian negative log-likelihood, with its ½ log 2π."""
    return (0.5 * (np.log(2 * np.pi * var) + (true - mean) ** 2 / var)).mean(axis=0)


def miscalibrated(observed: np.ndarray, levels=COVERAGE_LEVELS) -> bool:
    """Whether any observed coverage (L, P) is more than COVERAGE_TOLERANCE from its level."""
    gap = np.abs(np.asarray(observed) - np.asarray(levels, dtype=np.float64)[:, None])
    return bool(np.any(gap > COVERAGE_TOLERANCE))
