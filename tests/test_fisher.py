"""Fisher information from simulations (evaluation/fisher.py) on a linear Gaussian summary whose
Fisher matrix is known: s = θ·A + n, n ~ N(0, C), so F = A C⁻¹ Aᵀ."""

from __future__ import annotations

import numpy as np
import pytest

from cosmocub.evaluation.fisher import (
    conditional_sigma,
    estimate_fisher,
    independent_columns,
    marginal_sigma,
)

RESPONSE = np.array([[1.0, 0.5, 0.0, 0.2, 0.0], [0.0, 0.3, 1.0, -0.4, 0.1]])  # (P, F)
COVARIANCE = np.diag([1.0, 2.0, 0.5, 1.5, 1.0]) + 0.3  # correlated noise
EXACT = RESPONSE @ np.linalg.inv(COVARIANCE) @ RESPONSE.T
STEP = np.array([0.1, 0.2])


def _sims(rng, n: int) -> np.ndarray:
    return rng.multivariate_normal(np.zeros(len(COVARIANCE)), COVARIANCE, size=n)


def _pairs(rng, m: int, *, paired: bool) -> tuple[np.ndarray, np.ndarray]:
    """(P, m, F) summaries at θ ± Δ: the same noise at + and − with `paired` (same seeds)."""
    noise_plus = np.stack([_sims(rng, m) for _ in STEP])
    noise_minus = noise_plus if paired else np.stack([_sims(rng, m) for _ in STEP])
    shift = (STEP[:, None] * RESPONSE)[:, None, :]
    return shift + noise_plus, -shift + noise_minus


def test_paired_simulations_recover_the_exact_fisher_matrix() -> None:
    rng = np.random.default_rng(0)
    plus, minus = _pairs(rng, 20, paired=True)
    estimate = estimate_fisher(_sims(rng, 4000), plus, minus, STEP)
    # Paired seeds: the derivatives are exact, only the covariance is estimated (~2 % at 4000).
    np.testing.assert_allclose(estimate.standard, EXACT, atol=0.05 * np.abs(EXACT).max())
    np.testing.assert_allclose(estimate.sigma_compressed, marginal_sigma(EXACT), rtol=0.05)


def test_noisy_derivatives_inflate_the_standard_estimate_and_not_the_compressed() -> None:
    """Unpaired ±Δ simulations: noise in the derivatives adds spurious information to the
    standard estimate (its diagonal ~20 % high on average here); the compressed one, whose
    compression and derivatives come from different halves, stays far closer to the truth."""
    rng = np.random.default_rng(0)
    step = np.array([0.5, 0.5])
    standard, compressed = [], []
    for _ in range(40):
        noise_plus, noise_minus = (np.stack([_sims(rng, 40) for _ in step]) for _ in "+-")
        shift = (step[:, None] * RESPONSE)[:, None, :]
        estimate = estimate_fisher(_sims(rng, 2000), shift + noise_plus, noise_minus - shift, step)
        standard.append(np.diag(estimate.standard))
        compressed.append(np.diag(estimate.compressed))
    exact = np.diag(EXACT)
    standard, compressed = np.mean(standard, axis=0), np.mean(compressed, axis=0)
    assert np.all(standard > 1.1 * exact)
    assert np.all(np.abs(compressed - exact) < 0.5 * np.abs(standard - exact))


def test_too_few_fiducial_simulations_are_refused_with_the_numbers() -> None:
    rng = np.random.default_rng(2)
    plus, minus = _pairs(rng, 4, paired=True)
    with pytest.raises(ValueError, match="6 fiducial simulations for 5 summary values"):
        estimate_fisher(_sims(rng, 6), plus, minus, STEP)


def test_independent_columns_drop_constant_and_repeated_values() -> None:
    """A count field's quantiles can be constant or repeat one another exactly; the kept
    columns have a full-rank covariance and lose no independent value."""
    rng = np.random.default_rng(3)
    base = rng.normal(size=(200, 3))
    values = np.column_stack([base, base[:, 0], np.full(200, 2.5), base[:, 1] - base[:, 2]])
    keep = independent_columns(values)
    assert keep.sum() == 3 and not keep[4]
    assert np.linalg.matrix_rank(np.cov(values[:, keep], rowvar=False)) == 3


def test_the_prior_bounds_a_degenerate_direction_and_fixing_it_removes_it() -> None:
    """Two parameters the summary moves alike: alone their marginal errors have no bound; the
    uniform prior's precision 3 bounds them, and with the second known the
    first's error is its own 1/√F₀₀."""
    fisher = np.array([[100.0, 100.0 - 1e-9], [100.0 - 1e-9, 100.0]])
    assert marginal_sigma(fisher)[0] > 100
    # Along (1, −1)/√2 only the prior's variance 1/3 is left: half of it falls on θ₀.
    np.testing.assert_allclose(marginal_sigma(fisher, 3.0)[0], np.sqrt(1 / 6), rtol=0.01)
    np.testing.assert_allclose(conditional_sigma(fisher, [0]), [0.1])
