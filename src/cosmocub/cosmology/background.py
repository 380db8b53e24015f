"""Flat ΛCDM background for the simulation: expansion rate, linear growth and the time-step factors.

Everything is in units of H0 = 1 with comoving lengths in any unit, so the PM equations need no
box size; growth is normalised to D(a=1) = 1, as the linear power spectrum is given at z = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import hyp2f1


@dataclass(frozen=True, kw_only=True)
class FlatLCDM:
    """Matter + Λ, no radiation (the PM dynamics have none, so the growth must not either)."""

    omega_m: float

    def __post_init__(self) -> None:
        if not 0.0 < self.omega_m <= 1.0:
            raise ValueError(f"FlatLCDM: omega_m {self.omega_m} outside (0, 1]")

    def efunc(self, a: np.ndarray | float) -> np.ndarray:
        """E(a) = H(a) / H0."""
        a = np.asarray(a, dtype=np.float64)
        return np.sqrt(self.omega_m / a**3 + (1.0 - self.omega_m))

    def _growth_unnormalised(self, a: np.ndarray) -> np.ndarray:
        # Closed form of the growing mode (5Ω_m/2)·E(a)·∫da/(aE)³ for flat ΛCDM; → a as a → 0.
        x = -(1.0 - self.omega_m) / self.omega_m * a**3
        return a * hyp2f1(1.0 / 3.0, 1.0, 11.0 / 6.0, x)

    def _growth_derivative_unnormalised(self, a: np.ndarray) -> np.ndarray:
        # Differentiating the integral form: D' = D·E'/E + (5Ω_m/2)/(a³E²), with E'/E from E².
        e2 = self.efunc(a) ** 2
        dlne_da = -1.5 * self.omega_m / (a**4 * e2)
        return self._growth_unnormalised(a) * dlne_da + 2.5 * self.omega_m / (a**3 * e2)

    def growth(self, a: np.ndarray | float) -> np.ndarray:
        """Linear growth D1(a), D1(1) = 1."""
        a = np.asarray(a, dtype=np.float64)
        return self._growth_unnormalised(a) / self._growth_unnormalised(np.float64(1.0))

    def growth_derivative(self, a: np.ndarray | float) -> np.ndarray:
        """dD1/da."""
        a = np.asarray(a, dtype=np.float64)
        return self._growth_derivative_unnormalised(a) / self._growth_unnormalised(np.float64(1.0))

    def growth_rate(self, a: np.ndarray | float) -> np.ndarray:
        """f = dlnD1/dlna (≈ Ω_m(a)^0.55)."""
        a = np.asarray(a, dtype=np.float64)
        return a * self.growth_derivative(a) / self.growth(a)

    def momentum_growth(self, a: np.ndarray | float) -> np.ndarray:
        """g_p(a) = a³E(a)·dD1/da: linear-theory momentum p = a³E·dx/da per unit displacement."""
        a = np.asarray(a, dtype=np.float64)
        return a**3 * self.efunc(a) * self.growth_derivative(a)

    # The two factors below make a kick-drift-kick step reproduce linear growth exactly however
    # large the step (the FastPM idea, Feng et al. 2016): instead of integrating 1/(a³E) and
    # 1/(a²E) with the momentum or force held fixed, they assume p and the force evolve as in
    # linear theory across the step. With ~10 steps from z ≈ 9 this keeps the large scales right.

    def drift_factor(self, a0: float, a1: float, a_mid: float) -> float:
        """x(a1) = x(a0) + p(a_mid)·drift_factor, for dx/da = p / (a³E)."""
        growth = self.growth(np.array([a0, a1]))
        return float((growth[1] - growth[0]) / self.momentum_growth(a_mid))

    def kick_factor(self, a0: float, a1: float, a_force: float) -> float:
        """p(a1) = p(a0) + F(a_force)·kick_factor, for dp/da = F / (a²E), ∇·F = -1.5·Ω_m·δ."""
        g_p = self.momentum_growth(np.array([a0, a1]))
        return float((g_p[1] - g_p[0]) / (1.5 * self.omega_m * self.growth(a_force)))
