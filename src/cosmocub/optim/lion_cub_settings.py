"""What a LionCub runs with, one frozen dataclass: Lion's hyperparameters, the wire (quantizer,
bits, collective, the all-reduce's dtype), the buckets, the hierarchy and the momentum syncs.

`LionCub(params, settings, group=...)` takes it; `from_config` reads it off a run's optimizer
config (distributed_lion's fixed settings included), which is how the optimizer factory and the
performance model see the same settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cosmocub.config import OptimizerConfig, wire_refusal
from cosmocub.optim.collectives import COLLECTIVES
from cosmocub.optim.momentum_sync import SCHEDULES
from cosmocub.optim.quantize import QUANTIZERS

HIERARCHIES = ("flat", "node")


@dataclass(frozen=True, kw_only=True)
class LionCubSettings:
    """Args:
    lr, betas, weight_decay: Lion's (a parameter group may set its own).
    quantizer: "sign" (1 bit) or "l1" / "linf" / "l0" with `bits` 2..8.
    bits: the scaled quantizers' bits (sign is always 1).
    collective: "alltoall" (default), "allgather" or "allreduce".
    allreduce_dtype: the allreduce collective's sum: "int8" (None; ⌊127/N⌋ levels, 1 byte a
        value) or "fp16" (⌊2048/N⌋, 2 bytes); alltoall and allgather sum on the rank and keep
        2^(bits−1) − 1 levels at any N (ValueError if given).
    momentum_sync: "never", "every" (sync_every steps) or "exponential" (sync_k), for the
        parameters whose names match sync_patterns (none given: all).
    overlap: start a bucket's exchange in backward, when its gradients are ready.
    bucket_mb: parameters per exchange bucket, in MiB of fp32.
    hierarchy: "flat" (one vote over the data group) or "node": c averaged in fp32 inside the
        node, the vote across nodes on 1/G of it over the rail, levels from the number of nodes
        (optim.hierarchy: a vote of nodes, not ranks); flat where G = 1 or one node holds all.
    """

    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.0
    quantizer: str = "sign"
    bits: int = 1
    collective: str = "alltoall"
    allreduce_dtype: str | None = None
    momentum_sync: str = "never"
    sync_every: int = 100
    sync_k: float = 1.0
    sync_patterns: Sequence[str] = ()
    overlap: bool = False
    bucket_mb: float = 4.0
    hierarchy: str = "flat"

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(self.betas))
        object.__setattr__(self, "sync_patterns", tuple(self.sync_patterns))
        for key, value, allowed in (
            ("quantizer", self.quantizer, QUANTIZERS),
            ("collective", self.collective, COLLECTIVES),
            ("momentum_sync", self.momentum_sync, SCHEDULES),
            ("hierarchy", self.hierarchy, HIERARCHIES),
        ):
            if value not in allowed:
                raise ValueError(f"LionCub: unknown {key} {value!r} ({', '.join(allowed)})")
        if (refusal := wire_refusal(self)) is not None:
            raise ValueError(f"LionCub: {refusal[1]}")
        if self.bucket_mb <= 0:
            raise ValueError(f"LionCub: bucket_mb must be > 0, got {self.bucket_mb}")

    @property
    def wire_dtype(self) -> str:
        """The allreduce collective's sum type (int8 unless fp16 is asked)."""
        return self.allreduce_dtype or "int8"

    @classmethod
    def from_config(cls, cfg: OptimizerConfig, *, lr: float) -> LionCubSettings:
        """The settings of `cfg` (distributed_lion or lion_cub) at learning rate `lr`."""
        common = {"lr": lr, "betas": cfg.resolved_betas, "weight_decay": cfg.weight_decay}
        if not cfg.name.votes_updates:
            raise ValueError(f"optimizer {cfg.name.value!r} exchanges no compressed update")
        if not cfg.name.takes_lion_cub_options:
            # distributed_lion (Liu et al. 2024): 1-bit signs gathered by every rank and voted
            # locally, momenta never averaged; buckets of LionCub's default size.
            return cls(quantizer="sign", bits=1, collective="allgather", **common)
        lc = cfg.lion_cub
        assert lc is not None, "config.from_values fills lion_cub's defaults"
        sync = lc.momentum_sync
        return cls(
            quantizer=lc.quantizer,
            bits=lc.resolved_bits,
            collective=lc.collective,
            allreduce_dtype=lc.allreduce_dtype,
            momentum_sync=sync.schedule,
            sync_every=sync.every_steps,
            sync_k=sync.k,
            sync_patterns=sync.patterns,
            overlap=lc.overlap,
            bucket_mb=lc.bucket_mb,
            hierarchy=lc.hierarchy,
            **common,
        )
