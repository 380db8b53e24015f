"""Apply spatial parallelism to a plain model from outside: which block a rank owns, whether a
split fits the model, and `parallelize_cosmoflow` / `parallelize_unet`, which swap in the layers
of `layers.py`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch.distributed as dist
from torch import nn

from cosmocub.config import (
    SPATIAL_DIMS,
    ModelConfig,
    as_split,
    check_spatial_split,
    check_unet_split,
)
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.models.statistics_branch import PooledBranch
from cosmocub.models.unet import UNet3d
from cosmocub.parallel.halo import HaloPlan, spatial_coords
from cosmocub.parallel.layers import (
    GatherFlatten,
    SharedDropout,
    SpatialConv3d,
    SyncBatchNorm3d,
)
from cosmocub.parallel.parallel_dims import ParallelDims
from cosmocub.parallel.spatial_moments import SpatialGlobalMoments

Split = tuple[int, int, int]
# The split rules (check_spatial_split, check_unet_split) live with the config, which checks
# them at load; the layers below check again where they are built.


def _mesh_split(split: Sequence[int], dims: ParallelDims) -> Split:
    """`split` as a checked triple whose ranks are the mesh's spatial axis."""
    split = as_split(split)
    if math.prod(split) != dims.spatial:
        raise ValueError(
            f"split {list(split)} has {math.prod(split)} ranks, the mesh's spatial axis "
            f"{dims.spatial}"
        )
    return split


def spatial_block(
    dims: ParallelDims, split: Sequence[int], global_shape_dhw: Sequence[int]
) -> tuple[slice, slice, slice]:
    """The part of the global (D, H, W) this rank owns; rank order in the spatial group is
    row-major over (sd, sh, sw)."""
    split = _mesh_split(split, dims)
    coords = spatial_coords(dims.axis_rank("spatial"), split)
    out = []
    for d, (n, s, c) in enumerate(zip(global_shape_dhw, split, coords, strict=True)):
        if n % s:
            raise ValueError(f"{SPATIAL_DIMS[d]} extent {n} does not divide into {s} blocks")
        out.append(slice(c * (n // s), (c + 1) * (n // s)))
    return out[0], out[1], out[2]


def _plan(
    cfg: ModelConfig, dims: ParallelDims, split: Split, *, periodic: bool
) -> tuple[HaloPlan, dist.ProcessGroup | None]:
    """The halo plan of this rank's block (halos of kernel // 2 along split or periodic dims) and
    the group batch norm's statistics span (the whole mesh; None without batch norm or alone)."""
    halo = cfg.kernel_size // 2
    plan = HaloPlan(
        group=dims.group("spatial"),
        split=split,
        coords=spatial_coords(dims.axis_rank("spatial"), split),
        widths=tuple(halo if (s > 1 or periodic) else 0 for s in split),  # type: ignore[arg-type]
        periodic=periodic,
    )
    stats_group = None
    if cfg.batch_norm and dims.world_size > 1:
        # A group of its own, so norm collectives issued during backward never interleave with
        # DDP's gradient all-reduce on the default group.
        stats_group = dims.new_group(list(range(dims.world_size)))
    return plan, stats_group


def parallelize_cosmoflow(
    model: CosmoFlow, dims: ParallelDims, *, split: Sequence[int], periodic: bool = False
) -> CosmoFlow:
    """Swap `model`'s layers in place for spatially parallel ones and return it.

    Parameters and buffers stay the same objects under the same state_dict keys, so checkpoints
    and saved models are the plain CosmoFlow. Afterwards forward takes this rank's block
    (B, C, D/sd, H/sh, W/sw), the one `spatial_block` names, and returns the (B, 4) prediction,
    identical on every rank of the spatial group. Batch norm statistics span the whole
    data × spatial mesh (also at split [1, 1, 1] when data > 1: a global-batch norm, so that a
    data × spatial run and a data-only run normalise over the same samples). `periodic` gives
    every conv periodic halos (whole periodic boxes) instead of zero padding. Dropout draws
    nn.Dropout's mask on spatial rank 0 (`SharedDropout`), the mask the unsplit run draws.
    The pooled branch's moments (model.pooled) become the whole sample's, merged over the spatial
    group (`SpatialGlobalMoments`); its norm's statistics span the mesh, each sample counted once.

    Gradients: see `layers.py` — average them over the spatial group (`build_gradient_sync`).
    """
    split = _mesh_split(split, dims)
    cfg = model.config
    check_spatial_split(cfg, cfg.input_size, split)
    if dims.world_size == 1 and not periodic:
        return model  # one rank, zero halos: the plain model is already exact
    group_rank = dims.axis_rank("spatial")
    plan, stats_group = _plan(cfg, dims, split, periodic=periodic)
    for block in model.conv_blocks.children():
        if not isinstance(block.conv, nn.Conv3d):
            raise ValueError("parallelize_cosmoflow: the model is already parallelized")
        if any(plan.widths):
            block.conv = SpatialConv3d(block.conv, plan)
        if stats_group is not None:
            block.norm = SyncBatchNorm3d(block.norm, stats_group)
    if dims.spatial > 1:
        model.flatten = GatherFlatten(plan, group_rank)
        for name, layer in model.head.named_children():
            if isinstance(layer, nn.Dropout):
                setattr(model.head, name, SharedDropout(layer.p, plan.group))
    if model.pooled is not None:
        _parallelize_pooled(model.pooled, dims, plan, stats_group)
    return model


def _parallelize_pooled(
    branch: PooledBranch,
    dims: ParallelDims,
    plan: HaloPlan,
    stats_group: dist.ProcessGroup | None,
) -> None:
    """Whole-sample moments from the blocks; after them the branch is replicated over the
    spatial group, so its norm, over the whole mesh, sees every sample `dims.spatial` times."""
    if dims.spatial > 1:
        for name, moments in list(branch.moments.items()):
            branch.moments[name] = SpatialGlobalMoments(
                order=moments.order, eps=moments.eps, plan=plan
            )
    if stats_group is not None and isinstance(branch.norm, nn.BatchNorm1d):
        branch.norm = SyncBatchNorm3d(branch.norm, stats_group, replicas=dims.spatial)


def replicated_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters every rank of the spatial group holds whole, with the same gradient: the
    dense head after a `GatherFlatten` and the pooled branch's norm (none in a model that is not
    spatially split)."""
    if not isinstance(getattr(model, "flatten", None), GatherFlatten):
        return []
    pooled = getattr(model, "pooled", None)
    return list(model.head.parameters()) + ([] if pooled is None else list(pooled.parameters()))


def parallelize_unet(
    model: UNet3d, dims: ParallelDims, *, split: Sequence[int], periodic: bool = False
) -> UNet3d:
    """Swap the U-Net's layers in place for spatially parallel ones and return it.

    Every k > 1 conv becomes a halo conv (`SpatialConv3d`); max-pooling and the kernel-2,
    stride-2 transposed convs need no halo (a window never straddles two blocks while local
    extents are even, which `check_unet_split` guarantees), the 1×1×1 output conv none either;
    skips are concatenated locally. Batch norm statistics span the whole data × spatial mesh.
    Afterwards forward takes this rank's block (B, C, D/sd, H/sh, W/sw) and returns the
    prediction for the same block: outputs stay split. A loss that is the mean over the block,
    with gradients averaged over the spatial group (`build_gradient_sync`), gives exactly the
    gradient of the mean over the whole sample. Parameters, buffers and state_dict keys stay the
    plain U-Net's.
    """
    split = _mesh_split(split, dims)
    cfg = model.config
    check_unet_split(cfg, cfg.input_size, split)
    if dims.world_size == 1 and not periodic:
        return model
    plan, stats_group = _plan(cfg, dims, split, periodic=periodic)
    swaps: list[tuple[nn.Module, str, nn.Module]] = []
    for parent in model.modules():
        for name, layer in parent.named_children():
            if isinstance(layer, nn.Conv3d) and max(layer.kernel_size) > 1 and any(plan.widths):
                swaps.append((parent, name, SpatialConv3d(layer, plan)))
            elif isinstance(layer, nn.BatchNorm3d) and stats_group is not None:
                swaps.append((parent, name, SyncBatchNorm3d(layer, stats_group)))
            elif isinstance(layer, SpatialConv3d | SyncBatchNorm3d):
                raise ValueError("parallelize_unet: the model is already parallelized")
    for parent, name, layer in swaps:
        setattr(parent, name, layer)
    return model
