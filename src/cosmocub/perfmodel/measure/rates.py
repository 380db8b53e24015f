"""A layer's time as work over rate × efficiency(size), fitted to timings: time = Σ work_term ×
seconds per unit of the term (a call's fixed cost, FLOPs at the peak rate, bytes at a stream
rate), the seconds per unit non-negative, fitted by least squares.

Written as Calculon does, a peak rate times a size-dependent efficiency: efficiency(size) =
(flops / peak) / time, which saturates towards 1 as the FLOPs outgrow the call's fixed cost and
the memory traffic. The fit weighs every timing by its own size (relative residuals), so a 2 ms
layer counts as much as a 200 ms one; non-negative least squares keeps every rate physical, and
a fit is well-posed when the grid varies the terms apart from one another.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

# A fit that misses the median timing by more than this does not describe the layer: refused.
# (The median, not the worst: on a shared machine a few timings catch another process.)
MAX_MEDIAN_REL_ERROR = 0.25
# Fewer timings than this many per term leave the fit to the noise.
SAMPLES_PER_TERM = 2


@dataclass(frozen=True, kw_only=True)
class RateFit:
    """Seconds per unit of each work term (call: per call, flops: per FLOP, *bytes: per byte),
    and how well they met the timings they were fitted to."""

    seconds_per_unit: Mapping[str, float]
    samples: int
    median_rel_error: float
    worst_rel_error: float

    def seconds(self, work: Mapping[str, float]) -> float:
        return sum(s * work[term] for term, s in self.seconds_per_unit.items())

    @property
    def peak_flops(self) -> float:
        """FLOP/s when the call's cost and the memory traffic are negligible."""
        per_flop = self.seconds_per_unit.get("flops", 0.0)
        return math.inf if per_flop == 0 else 1 / per_flop

    def efficiency(self, work: Mapping[str, float]) -> float:
        """Share of the peak rate that `work` runs at: (flops / peak) / time."""
        total = self.seconds(work)
        flops = self.seconds_per_unit.get("flops", 0.0) * work.get("flops", 0.0)
        return 0.0 if total == 0 else flops / total

    def as_dict(self) -> dict[str, object]:
        return {
            "seconds_per_unit": dict(self.seconds_per_unit),
            "samples": self.samples,
            "median_rel_error": self.median_rel_error,
            "worst_rel_error": self.worst_rel_error,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> RateFit:
        per_unit = d["seconds_per_unit"]
        assert isinstance(per_unit, Mapping)
        return cls(
            seconds_per_unit={t: float(v) for t, v in per_unit.items()},
            samples=int(d["samples"]),  # type: ignore[call-overload]
            median_rel_error=float(d["median_rel_error"]),  # type: ignore[arg-type]
            worst_rel_error=float(d["worst_rel_error"]),  # type: ignore[arg-type]
        )


def fit_rates(
    works: Sequence[Mapping[str, float]],
    seconds: Sequence[float],
    *,
    what: str,
    max_median_rel_error: float = MAX_MEDIAN_REL_ERROR,
) -> RateFit:
    """The non-negative seconds per unit of the works' terms (every work has the same keys) that
    best meet `seconds` in relative terms; a ValueError naming `what` when
    the timings cannot pin them down (too few, a term that does not vary apart from the others,
    a non-positive timing) or the form misses their median by more than
    `max_median_rel_error`."""
    t = np.asarray(seconds, dtype=float)
    terms = tuple(works[0]) if works else ()
    need = SAMPLES_PER_TERM * max(1, len(terms))
    if len(t) < need:
        raise ValueError(f"{what}: {len(t)} timings, a rate fit needs at least {need}")
    if not np.all(np.isfinite(t)) or t.min() <= 0:
        raise ValueError(f"{what}: timings must be > 0 s (smallest {t.min():.3g} s)")
    a = np.array([[float(w[term]) for term in terms] for w in works])
    # Relative residuals: each row divided by its timing; columns scaled to unit norm so that
    # the rank test and the solver see numbers of one size (FLOPs are 1e9 × a call).
    rows = a / t[:, None]
    norms = np.linalg.norm(rows, axis=0)
    if np.any(norms == 0):
        missing = [term for term, n in zip(terms, norms, strict=True) if n == 0]
        raise ValueError(f"{what}: no timing has any {', '.join(missing)}: the grid must vary it")
    scaled = rows / norms
    singular = np.linalg.svd(scaled, compute_uv=False)
    if singular[-1] < 1e-6 * singular[0]:
        raise ValueError(
            f"{what}: {', '.join(terms)} move together over the {len(t)} timings "
            f"(condition {singular[0] / max(singular[-1], 1e-300):.3g}): the grid must vary "
            "batch, size and channels apart"
        )
    solution, _ = nnls(scaled, np.ones(len(t)))
    per_unit = solution / norms
    predicted = a @ per_unit
    errors = np.abs(predicted - t) / t
    fit = RateFit(
        seconds_per_unit=dict(zip(terms, map(float, per_unit), strict=True)),
        samples=len(t),
        median_rel_error=float(np.median(errors)),
        worst_rel_error=float(errors.max()),
    )
    if fit.median_rel_error > max_median_rel_error:
        raise ValueError(
            f"{what}: time = {' + '.join(f'{x} x s/{x}' for x in terms)} misses the "
            f"{len(t)} timings by {100 * fit.median_rel_error:.0f} % median (worst "
            f"{100 * fit.worst_rel_error:.0f} %; at most {100 * max_median_rel_error:.0f} % "
            "median): the form does not describe them, or the machine was busy"
        )
    return fit
