"""Fisher information of summary statistics, estimated from simulations: how tightly a summary
(P(k), the one-point PDF, the bispectrum, a network's outputs) can pin the parameters at a
fiducial point, so that summaries are compared by what they hold rather than by one regressor's
error.

F = (∂μ/∂θ)ᵀ C⁻¹ (∂μ/∂θ): the mean's derivatives from paired simulations at θ ± Δ with the same
seeds (their cosmic variance cancels in the difference), the covariance C from simulations at the
fiducial point, its inverse debiased by Hartlap et al. (2007, A&A 464, 399) (n − F − 2)/(n − 1).

Noisy derivatives bias that *standard* estimate high (noise adds spurious information). Coulton &
Wandelt (2023, "How to estimate Fisher information matrices from simulations", arXiv:2305.08994)
pair it with a *compressed* estimate, biased low: the summary is compressed to one number per
parameter with the derivatives of half the pairs, and the Fisher information of that compression
is measured with the other half. The truth lies between the two; where they agree, the
simulations suffice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg


@dataclass(frozen=True)
class FisherEstimate:
    """The standard (biased high) and compressed (biased low) Fisher matrices of one summary,
    (P, P) each, and the marginal 1σ errors √(F⁻¹)ᵢᵢ they give."""

    standard: np.ndarray
    compressed: np.ndarray

    @property
    def sigma_standard(self) -> np.ndarray:
        return marginal_sigma(self.standard)

    @property
    def sigma_compressed(self) -> np.ndarray:
        return marginal_sigma(self.compressed)


def hartlap_precision(fiducial: np.ndarray) -> np.ndarray:
    """C⁻¹ of the (n, F) fiducial summaries, × (n − F − 2)/(n − 1); needs n > F + 2."""
    n, features = fiducial.shape
    if n <= features + 2:
        raise ValueError(
            f"fisher: {n} fiducial simulations for {features} summary values; "
            f"the covariance needs more than {features + 2}"
        )
    covariance = np.atleast_2d(np.cov(fiducial, rowvar=False))
    return np.linalg.inv(covariance) * (n - features - 2) / (n - 1)


def mean_derivatives(plus: np.ndarray, minus: np.ndarray, step: np.ndarray) -> np.ndarray:
    """(P, F) ∂μ/∂θ from paired (P, n, F) summaries at θ + Δ and θ − Δ (Δ: (P,) steps)."""
    if plus.shape != minus.shape or plus.ndim != 3 or plus.shape[0] != len(step):
        raise ValueError(
            f"fisher: plus {plus.shape} and minus {minus.shape} must be (P, n, F) alike, "
            f"with P = {len(step)} steps"
        )
    return (plus - minus).mean(axis=1) / (2.0 * np.asarray(step, np.float64)[:, None])


def fisher_matrix(derivatives: np.ndarray, precision: np.ndarray) -> np.ndarray:
    """(P, P) Fisher matrix of a Gaussian summary: D C⁻¹ Dᵀ."""
    return derivatives @ precision @ derivatives.T


def marginal_sigma(fisher: np.ndarray, prior_precision: float = 0.0) -> np.ndarray:
    """(P,) marginal 1σ errors √((F + prior)⁻¹)ᵢᵢ, with `prior_precision` on every parameter's
    diagonal (a uniform prior on [-1, 1) has variance 1/3: precision 3); inf where singular."""
    try:
        inverse = np.linalg.inv(fisher + prior_precision * np.eye(len(fisher)))
    except np.linalg.LinAlgError:
        return np.full(len(fisher), np.inf)
    return np.sqrt(np.clip(np.diag(inverse), 0.0, np.inf))


def conditional_sigma(fisher: np.ndarray, free: list[int]) -> np.ndarray:
    """1σ errors of the `free` parameters with every other one known: the marginal errors of
    the Fisher matrix's free sub-block."""
    return marginal_sigma(fisher[np.ix_(free, free)])


def independent_columns(fiducial: np.ndarray, rtol: float = 1e-6) -> np.ndarray:
    """(F,) bool: a set of summary values whose fiducial covariance has full rank — constant
    and linearly dependent columns out (pivoted QR of the standardised values; e.g. a count
    field's quantiles, which take a few discrete values, can repeat one another exactly)."""
    values = np.asarray(fiducial, np.float64)
    finite = np.all(np.isfinite(values), axis=0)
    spread = np.std(np.where(finite, values, 0.0), axis=0)
    scale = np.abs(np.where(finite, values, 0.0)).max(axis=0, initial=0.0)
    # A constant column's std comes out as rounding noise, not 0: constant means below 1e-12.
    columns = np.flatnonzero(finite & (spread > 1e-12 * np.maximum(scale, 1e-300)))
    z = values[:, columns]
    z = (z - z.mean(axis=0)) / z.std(axis=0)
    _, r, pivots = scipy.linalg.qr(z, mode="economic", pivoting=True)
    diagonal = np.abs(np.diag(r))
    rank = int(np.sum(diagonal > rtol * diagonal[0])) if len(diagonal) else 0
    out = np.zeros(values.shape[1], bool)
    out[columns[pivots[:rank]]] = True
    return out


def estimate_fisher(
    fiducial: np.ndarray, plus: np.ndarray, minus: np.ndarray, step: np.ndarray
) -> FisherEstimate:
    """Standard and compressed Fisher estimates of one summary from (n, F) fiducial and paired
    (P, m, F) ±Δ simulations (m ≥ 2: the compressed estimate splits the pairs in halves)."""
    fiducial, plus, minus = (np.asarray(a, np.float64) for a in (fiducial, plus, minus))
    if fiducial.ndim == 1:
        fiducial = fiducial[:, None]
    pairs = plus.shape[1]
    if pairs < 2:
        raise ValueError(f"fisher: {pairs} derivative pairs; the compressed estimate needs ≥ 2")
    precision = hartlap_precision(fiducial)
    standard = fisher_matrix(mean_derivatives(plus, minus, step), precision)

    half = pairs // 2
    weights = mean_derivatives(plus[:, :half], minus[:, :half], step) @ precision  # (P, F)
    # One number per parameter: the score-like compression t = D_A C⁻¹ s, then its own Fisher
    # information from the other half's derivatives and the fiducials' scatter of t.
    t_fiducial = fiducial @ weights.T
    t_derivatives = mean_derivatives(plus[:, half:] @ weights.T, minus[:, half:] @ weights.T, step)
    compressed = fisher_matrix(t_derivatives, hartlap_precision(t_fiducial))
    return FisherEstimate(standard=standard, compressed=compressed)
