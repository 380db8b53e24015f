"""What the distributed Lions send, as pure arithmetic: the wire settings an optimizer config
runs with, the bucket size, and the two-level exchange's slices and intra-node bytes.

`LionCub`, `optim.hierarchy` and the performance model (`perfmodel.cost_model.step_model`) all
take these facts from here, so a prediction prices the exchange the optimizer runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from cosmocub.config import OptimizerConfig

FP32_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class WireSettings:
    """How one optimizer config exchanges its update over the data group."""

    quantizer: str
    bits: int
    collective: str
    allreduce_dtype: str
    bucket_mb: float


# distributed_lion (Liu et al. 2024): 1-bit signs gathered by every rank and voted locally,
# momenta never averaged; buckets of LionCub's default size.
DISTRIBUTED_LION = WireSettings(
    quantizer="sign", bits=1, collective="allgather", allreduce_dtype="int8", bucket_mb=4.0
)


def wire_settings(cfg: OptimizerConfig) -> WireSettings:
    """The settings `optimizer_factory` builds `distributed_lion` or `lion_cub` with."""
    if cfg.name == "distributed_lion":
        return DISTRIBUTED_LION
    if cfg.name != "lion_cub" or cfg.lion_cub is None:
        raise ValueError(f"optimizer {cfg.name!r} exchanges no compressed update")
    lc = cfg.lion_cub
    return WireSettings(
        quantizer=lc.quantizer,
        bits=lc.resolved_bits,
        collective=lc.collective,
        allreduce_dtype=lc.resolved_allreduce_dtype,
        bucket_mb=lc.bucket_mb,
    )


def bucket_elements(bucket_mb: float) -> int:
    """fp32 values one exchange bucket holds (`bucket_mb` MiB of them)."""
    return int(bucket_mb * 2**20 / FP32_BYTES)


def node_slice_elements(num_values: int, ranks_in_node: int) -> int:
    """Each local rank's slice of a bucket in the two-level exchange: the bucket padded to a
    multiple of 8·G (whole bytes of the 1-bit all-gather on every rank), split G ways."""
    g = ranks_in_node
    return (num_values + (-num_values % (8 * g))) // g


def node_exchange_bytes(
    slice_elements: int, ranks_in_node: int, *, bytes_per_value: int = FP32_BYTES
) -> dict[str, float]:
    """Bytes one rank sends inside its node per bucket of the two-level exchange: the
    reduce-scatter of c (fp32 parameters: 4 bytes a value), then the 1-bit all-gather of the
    voted slices."""
    others = ranks_in_node - 1
    return {
        "reducescatter": float(others * slice_elements * bytes_per_value),
        "allgather": others * slice_elements / 8.0,
    }


def node_sum_slice_elements(num_values: int, ranks_in_node: int) -> int:
    """The slice of a momentum sync by node (reduce-scatter, the rail's all-reduce,
    all-gather): the values padded to a multiple of G, split G ways."""
    g = ranks_in_node
    return (num_values + (-num_values % g)) // g


def node_sum_intra_bytes(slice_bytes: float, ranks_in_node: int) -> float:
    """Bytes one rank sends inside its node in a sum by node: reduce-scatter and all-gather."""
    return 2.0 * (ranks_in_node - 1) * slice_bytes
