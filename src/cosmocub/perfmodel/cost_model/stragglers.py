"""The wait for the slowest rank: a synchronous step ends when its last rank arrives at the
collective, so N ranks whose step times scatter by σ about μ take E[max of N] = μ + σ·e_N a step,
e_N the expected maximum of N standard normal draws (0 for one rank, 2.07 for 32, 3.04 for 512).

σ = cv × the rank's own step (device and host). For GPU ranks cv is fitted on published pairs
of the same system and software at two scales (`fit_cv`), each pair's prediction from the
others' fit; the CPU path does not price the wait yet.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm


@functools.cache
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normal draws]: ∫ x · n φ(x) Φ(x)^(n−1) dx on a grid
    fine enough for four digits at any n up to 10⁶."""
    if n < 1:
        raise ValueError(f"expected maximum of {n} draws: need at least one")
    if n == 1:
        return 0.0
    x = np.linspace(-10.0, 10.0, 40_001)
    density = n * norm.pdf(x) * np.exp((n - 1) * norm.logcdf(x))
    return float(np.trapezoid(x * density, x))


@dataclass(frozen=True, kw_only=True)
class Stragglers:
    """cv: the spread of one rank's step time, as a fraction of it; source: where it comes from."""

    cv: float
    source: str

    def __post_init__(self) -> None:
        if not 0 <= self.cv < 1:
            raise ValueError(f"straggler cv {self.cv:g}: a fraction of the step in [0, 1)")

    def factor(self, ranks: int) -> float:
        """The synchronous step ÷ one rank's own: 1 + cv·e_N."""
        return 1.0 + self.cv * expected_max_normal(ranks)

    def wait_s(self, own_step_s: float, ranks: int) -> float:
        """Seconds a step waits, beyond its own, for the slowest of `ranks`."""
        return own_step_s * self.cv * expected_max_normal(ranks)


NO_STRAGGLERS = Stragglers(cv=0.0, source="none: every rank's step alike")


@dataclass(frozen=True, kw_only=True)
class ScalePair:
    """One system and software at two scales: the published step (seconds) at each, and what
    the model puts outside the ranks' own step at each (the exposed exchange)."""

    name: str
    ranks: tuple[int, int]
    step_s: tuple[float, float]
    outside_s: tuple[float, float] = (0.0, 0.0)
    runs: tuple[str, str] = ("", "")  # the two runs' names: pairs sharing one are not apart

    @property
    def growth(self) -> float:
        return self.step_s[1] / self.step_s[0] - 1.0

    def cv(self) -> float:
        """The cv this pair alone implies: (s − x) = own × (1 + cv·e_N) at both scales."""
        r = (self.step_s[1] - self.outside_s[1]) / (self.step_s[0] - self.outside_s[0])
        e1, e2 = (expected_max_normal(n) for n in self.ranks)
        return max(0.0, (r - 1.0) / (e2 - r * e1))

    def predicted_growth(self, stragglers: Stragglers) -> float:
        """The step's growth from the first scale to the second: the first scale's published
        step gives the ranks' own step, the second adds its exchange and wait."""
        own = (self.step_s[0] - self.outside_s[0]) / stragglers.factor(self.ranks[0])
        second = own * stragglers.factor(self.ranks[1]) + self.outside_s[1]
        return second / self.step_s[0] - 1.0


def fit_cv(pairs: Sequence[ScalePair]) -> float:
    """The cv that best predicts the pairs' growth (least squares over the pairs' growth, in
    points; a bounded scalar search: the growth is monotone in cv)."""
    from scipy.optimize import minimize_scalar

    if not pairs:
        raise ValueError("straggler fit: no scale pair to fit on")

    def loss(cv: float) -> float:
        s = Stragglers(cv=cv, source="fit")
        return sum((p.predicted_growth(s) - p.growth) ** 2 for p in pairs)

    return float(minimize_scalar(loss, bounds=(0.0, 0.95), method="bounded").x)


def leave_one_out(pairs: Sequence[ScalePair]) -> list[tuple[ScalePair, float | None, float | None]]:
    """(pair, cv fitted on the others, the growth it predicts for the pair), one per pair; the
    others leave out every pair that shares a run with it (a run in two pairs would carry the
    left-out pair's own step into the fit); None where no other pair is left."""
    out: list[tuple[ScalePair, float | None, float | None]] = []
    for pair in pairs:
        mine = {r for r in pair.runs if r}
        apart = [p for p in pairs if p is not pair and not mine & set(p.runs)]
        if not apart:
            out.append((pair, None, None))
            continue
        cv = fit_cv(apart)
        s = Stragglers(cv=cv, source=f"fitted on {', '.join(p.name for p in apart)}")
        out.append((pair, cv, pair.predicted_growth(s)))
    return out
