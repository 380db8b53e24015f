"""The collectives a spatially or data-parallel model makes inside its layers, apart from the
gradient exchange: the halo swaps and feature gather of a spatial split, and the synced batch
norm's statistics, which span the whole mesh whenever it has more than one rank
(models.parallelize: a global-batch norm). Each is priced by the network (topology.Links).
"""

from __future__ import annotations

import math

from cosmocub.config import ModelConfig
from cosmocub.perfmodel.alpha_beta import rounds_and_bytes
from cosmocub.perfmodel.cost_model.topology import Links, Mesh


def halo(
    model_cfg: ModelConfig,
    *,
    batch: int,
    mesh: Mesh,
    network: Links,
    bytes_per_value: int,
) -> tuple[float, float]:
    """(seconds, bytes sent) per step of the halo swaps (forward and backward) and the feature
    all-gather before the head (forward, and its gradient's reduction backward), all within the
    spatial group (across nodes where network.spans_nodes(spatial, 1))."""
    if mesh.spatial == 1:
        return 0.0, 0.0
    width = model_cfg.kernel_size // 2
    local = [model_cfg.input_size // s for s in mesh.split]
    channels = model_cfg.in_channels
    seconds = sent = 0.0
    for block in range(model_cfg.num_conv_blocks):
        for d, ranks in enumerate(mesh.split):
            if ranks == 1:
                continue
            face = batch * channels * width * math.prod(n for i, n in enumerate(local) if i != d)
            face_bytes = face * bytes_per_value
            # forward, and backward
            seconds += 2 * network.sent_s("halo", 2.0 * face_bytes, mesh.spatial)
            sent += 2 * rounds_and_bytes("halo", face_bytes, 2)[1]
        channels = model_cfg.base_filters * 2**block
        local = [n // 2 for n in local]
    features = batch * channels * math.prod(local) * mesh.spatial * bytes_per_value
    seconds += 2 * network.collective_s("allgather", features, mesh.spatial)
    sent += 2 * rounds_and_bytes("allgather", features, mesh.spatial)[1]
    return seconds, sent


def norm_sync(model_cfg: ModelConfig, *, mesh: Mesh, network: Links) -> tuple[float, float]:
    """(seconds, bytes sent) per step of the synced batch norms (parallel.layers._SyncBatchNorm):
    per conv block, forward an all-gather of (count, mean, M2) in float64, 8·(1 + 2C) bytes,
    backward an all-reduce of (Σdy, Σdy·x̂) in float32, 8·C bytes, over the mesh. Each blocks
    the step (its result is needed at once), so every one pays the link's α."""
    if mesh.world == 1 or not model_cfg.batch_norm:
        return 0.0, 0.0
    p = mesh.world
    seconds = sent = 0.0
    for block in range(model_cfg.num_conv_blocks):
        c = model_cfg.base_filters * 2**block
        for kind, nbytes in (
            ("allgather", p * 8.0 * (1 + 2 * c)),  # the gathered total
            ("allreduce", 8.0 * c),
        ):
            seconds += network.collective_s(kind, nbytes, p)
            sent += rounds_and_bytes(kind, nbytes, p)[1]
    return seconds, sent
