"""α–β costs of the collectives a training step runs, and their least-squares fit.

t = α·rounds + β·bytes, per rank: a ring all-reduce of n bytes over P ranks takes 2(P−1) rounds
and sends 2(P−1)/P·n; a ring all-gather of the P ranks' n/P each, P−1 rounds and (P−1)/P·n; an
all-to-all of an n-byte buffer, P−1 rounds and (P−1)/P·n; a halo swap along one split dim, two
faces of n bytes (one to each neighbour, concurrently): 2 messages, 2n bytes. The byte terms are
the optimizer's own counting functions (cosmocub.optim.collectives).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from cosmocub.optim.collectives import allgather_bytes, alltoall_bytes, ring_allreduce_bytes

KINDS = ("allreduce", "allgather", "alltoall", "halo")


def rounds_and_bytes(kind: str, nbytes: float, group_size: int) -> tuple[float, float]:
    """(latency rounds, bytes one rank sends) of one collective; nbytes is the all-reduced
    buffer, the gathered total, the all-to-all buffer, or one halo face."""
    p = group_size
    if p == 1:
        return 0.0, 0.0
    if kind == "allreduce":
        return 2.0 * (p - 1), ring_allreduce_bytes(nbytes, p)
    if kind == "allgather":
        return float(p - 1), allgather_bytes(nbytes / p, p)
    if kind == "alltoall":
        return float(p - 1), alltoall_bytes(nbytes, p)
    if kind == "halo":
        return 2.0, 2.0 * nbytes
    raise ValueError(f"unknown collective {kind!r} ({', '.join(KINDS)})")


@dataclass(frozen=True, kw_only=True)
class AlphaBeta:
    """Seconds per message round (α) and per byte sent by one rank (β)."""

    alpha_s: float
    beta_s_per_byte: float

    def time(self, kind: str, nbytes: float, group_size: int) -> float:
        rounds, sent = rounds_and_bytes(kind, nbytes, group_size)
        return self.alpha_s * rounds + self.beta_s_per_byte * sent

    @property
    def bandwidth_gbit(self) -> float:
        return 8e-9 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else float("inf")


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
