"""The α–β fit: timed collectives (`Sample`) → least-squares α and β per collective kind
(cosmocub.perfmodel.alpha_beta holds the form itself)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from cosmocub.perfmodel.alpha_beta import AlphaBeta, rounds_and_bytes


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One timed collective: kind, buffer bytes (as rounds_and_bytes takes them), ranks, seconds."""

    kind: str
    nbytes: float
    group_size: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
class Fit:
    """α–β of one kind on one link, the fit's relative errors, and the measured time of the
    smallest message at the smallest group (gloo's per-call latency there)."""

    costs: AlphaBeta
    samples: int
    median_rel_error: float
    worst_rel_error: float
    call_latency_s: float


def fit_alpha_beta(samples: Iterable[Sample]) -> Fit:
    """Non-negative least squares of t = α·rounds + β·bytes, weighted by 1/t so that small and
    large messages count alike (relative error); raises ValueError with the numbers when the
    samples cannot determine both."""
    from scipy.optimize import nnls

    usable = [s for s in samples if s.group_size > 1]
    rows = [(*rounds_and_bytes(s.kind, s.nbytes, s.group_size), s.seconds) for s in usable]
    if len(rows) < 2:
        raise ValueError(f"alpha-beta fit: {len(rows)} usable samples, need at least 2")
    a = np.array([[r[0], r[1]] for r in rows])
    t = np.array([r[2] for r in rows])
    if np.linalg.matrix_rank(a) < 2:
        raise ValueError("alpha-beta fit: every sample has the same bytes per round; vary sizes")
    if (t <= 0).any():
        raise ValueError(f"alpha-beta fit: {int((t <= 0).sum())} samples with time <= 0")
    scale = a.max(axis=0)  # columns of O(1), for a well-conditioned solve
    (alpha, beta), _ = nnls((a / scale) / t[:, None], np.ones_like(t))
    alpha, beta = alpha / scale[0], beta / scale[1]
    rel = np.abs(a @ np.array([alpha, beta]) - t) / t
    return Fit(
        costs=AlphaBeta(alpha_s=float(alpha), beta_s_per_byte=float(beta)),
        samples=len(rows),
        median_rel_error=float(np.median(rel)),
        worst_rel_error=float(rel.max()),
        call_latency_s=min(usable, key=lambda s: (s.group_size, s.nbytes)).seconds,
    )


def fit_per_kind(samples: Iterable[Sample]) -> dict[str, Fit]:
    """One α–β per collective kind present (gloo runs each with its own algorithm)."""
    by_kind: dict[str, list[Sample]] = {}
    for s in samples:
        by_kind.setdefault(s.kind, []).append(s)
    return {kind: fit_alpha_beta(group) for kind, group in sorted(by_kind.items())}
