"""The α–β form of the collectives a training step runs: t = α·rounds + β·bytes, per rank.

A ring all-reduce of n bytes over P ranks takes 2(P−1) rounds and sends 2(P−1)/P·n; a ring
all-gather of the P ranks' n/P each, P−1 rounds and (P−1)/P·n; an all-to-all of an n-byte
buffer, P−1 rounds and (P−1)/P·n; a halo swap along one split dim, two faces of n bytes (one to
each neighbour, concurrently): 2 messages, 2n bytes. The byte terms are the optimizer's own
counting functions (cosmocub.optim.collectives). The lowest layer of the performance model:
measure fits it (measure.alpha_beta_fit), the cost model prices with it (cost_model.topology).
"""

from __future__ import annotations

from dataclasses import dataclass

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
